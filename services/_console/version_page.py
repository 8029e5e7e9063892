"""The agent versions' page (/versions): the versions a fleet runs side by side, as `roundtrip versions` shows them
(the same read, storage/versions.py), each linking to its turns. It reads every ended turn the ledger keeps, so it is
read when the page loads and never refreshed as the lists are."""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from roundtrip._console.ledger_reader import LedgerAway
from roundtrip._console.pages import esc, notice
from roundtrip._console.web import Console
from roundtrip._kernel.storage.versions import COLUMNS, DEFAULT_WORD, VersionRow, shown

NOTE = (
    "Share: of new conversations. Per ended turn: the mean steps (model calls), cost and approvals asked; p50: the "
    "median ended turn's seconds from its start to its end. Read when the page loaded."
)


def routes(console: Console) -> list[Route]:
    """The page's route, for `web.application(console, [..., *routes(console)])`."""

    async def page(request: Request) -> Response:
        identity = await console._identity(request)
        try:
            rows, trouble = await console.books.versions(), None
        except LedgerAway as exc:
            rows, trouble = [], str(exc)
        return console._html(request, identity, "Agent versions", versions_table(rows, trouble))

    return [Route("/versions", page)]


def versions_table(rows: list[VersionRow], trouble: str | None) -> str:
    """One row a version: its name (a link to its turns, `(draining)` while it drains) and its figures."""
    cells = []
    for r in rows:
        name = f'<a href="/turns?version={quote(r.version or DEFAULT_WORD)}">{esc(shown(r.version))}</a>'
        draining = ' <span class="st-awaiting">(draining)</span>' if r.draining else ""
        figures = "".join(f"<td>{esc(cell)}</td>" for cell in r.cells())
        cells.append(f'<tr data-agent-version="{esc(r.version)}"><td>{name}{draining}</td>{figures}</tr>')
    head = "".join(f"<th>{esc(h)}</th>" for h in COLUMNS)
    warning = notice(trouble, "bad") if trouble else ""
    return (
        f"{warning}<h2>Agent versions</h2><table><tr>{head}</tr>{''.join(cells)}</table>"
        f'<p class="muted">{esc(NOTE)}</p>'
    )
