"""The dead letters' page (/dead-letters): its HTML and its two changes, re-drive and discard, with the console's
sign-in, CSRF check and audit; the once-only rule and the re-drive itself are in letters.py.

Everything a dead letter carries and a person's note is escaped into the HTML: a dead letter is whatever some
producer wrote.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from roundtrip._console import decisions, letters
from roundtrip._console.auth import CSRF_FIELD, Identity
from roundtrip._console.pages import esc, live, notice, when
from roundtrip._console.web import SECURITY_HEADERS, TOLD, Answer, Console, _q
from roundtrip._kernel.kafka.dead_letters import DISCARD, PAST, REDRIVE, Letter, LettersAway
from roundtrip._kernel.wire.letters import DeadLettered, DeadLetterHandled

log = logging.getLogger("roundtrip.console")
BACK = "/dead-letters"


def routes(console: Console, shelf: letters.Letters) -> list[Route]:
    """The page's routes, for `web.application(console, routes(console, shelf))`."""
    letters_desk = DeadLetterDesk(console, shelf)
    return [
        Route("/dead-letters", letters_desk.page),
        Route("/dead-letters/live", letters_desk.live),
        Route("/dead-letters/{letter_id}/redrive", letters_desk.redrive, methods=["POST"]),
        Route("/dead-letters/{letter_id}/discard", letters_desk.discard, methods=["POST"]),
    ]


@dataclass
class DeadLetterDesk:
    """The dead letters' page and its two changes, re-drive and discard."""

    console: Console
    shelf: letters.Letters
    told: dict[str, str] = field(default_factory=dict)

    async def _fragment(self, request: Request, identity: Identity) -> str:
        try:
            await self.shelf.refresh()
            trouble = None
        except LettersAway as exc:
            trouble = str(exc)
        listed = self.shelf.listed()
        csrf, now, prefix = self.console._csrf(request, identity), time.time(), self.shelf.prefix
        cards = []
        for item, handling in listed:
            refused = None if handling else letters.refusal(item.id, REDRIVE, item, None, prefix)
            cards.append(letter_card(item, handling, identity, csrf, now, refused.message if refused else None))
        version = hashlib.sha256(
            json.dumps([[i.id, h.claim if h else None] for i, h in listed] + [trouble]).encode()
        ).hexdigest()[:16]
        return dead_letters(cards, letters.counts(self.shelf.letters.values(), self.shelf.handled), version, trouble)

    async def page(self, request: Request) -> Response:
        identity = await self.console._identity(request)
        done = self.told.get(request.query_params.get("handled", ""))  # never text from the URL: a link could lie
        head = notice(done, "ok") if done else ""
        body = head + live("/dead-letters/live", await self._fragment(request, identity))
        return self.console._html(request, identity, "Dead letters", body)

    async def live(self, request: Request) -> Response:
        identity = await self.console._identity(request)
        return HTMLResponse(await self._fragment(request, identity), headers=SECURITY_HEADERS)

    async def redrive(self, request: Request) -> Response:
        return await self._act(request, REDRIVE)

    async def discard(self, request: Request) -> Response:
        return await self._act(request, DISCARD)

    async def _act(self, request: Request, action: str) -> Response:
        wanted, back = request.path_params["letter_id"], BACK
        identity, form = await self.console._change(request, back)
        note = str(form.get("reason", "")).strip()[:500]
        try:
            item, claim = await self.shelf.act(wanted, action, identity.name, note)
        except decisions.Refused as refused:
            self.console._audit(f"refused {action} dead letter", identity, request, letter=wanted, why=refused.message)
            raise Answer(refused.status, refused.message, identity, back) from None
        except LettersAway as exc:
            raise Answer(503, f"{exc}: nothing done", identity, back) from None
        except Exception as exc:  # noqa: BLE001 - Kafka did not take it: the letter was released, the page says so
            log.error("%s of dead letter %s not confirmed by Kafka: %s: %s", action, wanted, type(exc).__name__, exc)
            raise Answer(
                503,
                f"Kafka did not confirm the {action} of dead letter {wanted} within {letters.PUBLISH_TIMEOUT_S:.0f} s "
                f"({type(exc).__name__}): it waits again; look at the page before you repeat it",
                identity,
                back,
            ) from None
        letter = item.letter
        self.console._audit(
            f"{action} dead letter",
            identity,
            request,
            letter=wanted,
            topic=letter.topic if letter else "",
            key=(letter.key or "") if letter else "",
            reason=item.reason,
            note=note,
        )
        where = f" to {claim.topic}" if claim.topic else ""
        self.told[wanted] = f"dead letter {wanted} {PAST[action]}{where} by {identity.name}"
        while len(self.told) > TOLD:
            self.told.pop(next(iter(self.told)))
        return RedirectResponse(f"/dead-letters?handled={_q(wanted)}", status_code=303)


def age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h" if seconds < 172_800 else f"{seconds / 86400:.0f} d"


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    if len({k for k, _ in pairs}) < len(pairs):
        raise ValueError("a key twice: indenting would show only its last value")
    return dict(pairs)


def record_text(text: str) -> str:
    """A dead-lettered record for people, escaped: indented when it is JSON (its keys in their order), else as it is."""
    try:
        return esc(json.dumps(json.loads(text, object_pairs_hook=_unique), indent=2, ensure_ascii=False))
    except (ValueError, RecursionError):
        return esc(text)


def as_published(letter: DeadLettered) -> tuple[str, str | None, str]:
    """The record's value (its first 100,000 bytes), key and headers as text, decoded from the bytes a re-drive
    publishes (only when Kafka still holds those very bytes at its place), not from the letter's readable copy."""
    try:
        copy = letters.original(letter) if letter.payload_base64 else None
    except ValueError:
        copy = None
    if copy is None:  # no lossless copy, so no re-drive: its readable copy, as the fleet wrote it
        return letter.payload, letter.key, ", ".join(h.get("key", "") for h in letter.headers)
    value, key, headers = copy
    shown = ", ".join(f"{name}: {raw[:200].decode('utf-8', 'replace')}" for name, raw in headers)
    text = key.decode("utf-8", "replace") if key is not None else None
    return value[:100_000].decode("utf-8", "replace"), text, shown


def _letter_form(letter_id: str, csrf: str, redrivable: bool) -> str:
    base = f"/dead-letters/{quote(letter_id, safe='')}"
    redrive = (
        f'<button class="approve redrive" formaction="{esc(base)}/redrive">Re-drive to its topic</button> '
        if redrivable
        else ""
    )
    return (
        f'<form method="post" action="{esc(base)}/discard" class="letter">'
        f'<input type="hidden" name="{CSRF_FIELD}" value="{esc(csrf)}">'
        '<input type="text" name="reason" maxlength="500" placeholder="reason (recorded with it)"> '
        f'{redrive}<button class="deny discard">Discard</button></form>'
    )


def letter_card(
    item: Letter,
    handling: DeadLetterHandled | None,
    identity: Identity,
    csrf: str,
    now: float,
    not_redrivable: str | None,
) -> str:
    """One dead letter: where it came from, its key, why, how old, the record a re-drive publishes as text, and what
    was done with it (or the forms)."""
    letter = item.letter
    if handling is not None:
        what = PAST.get(handling.action, handling.action)
        note = f": {esc(handling.note)}" if handling.note else ""
        action = f'<p class="notice ok">{esc(what)} by {esc(handling.by)} at {esc(when(handling.at))}{note}</p>'
    elif identity.may_decide:
        refused = f'<p class="muted">{esc(not_redrivable)}</p>' if not_redrivable else ""
        action = refused + _letter_form(item.id, csrf, not_redrivable is None)
    else:
        action = '<p class="muted">You may look, not re-drive or discard (viewer).</p>'
    if letter is not None:
        record, key, headers = as_published(letter)
        facts = [
            (
                "source topic",
                f"<code>{esc(letter.topic)}</code> (partition {esc(letter.partition)}, offset {esc(letter.offset)})",
            ),
            ("key", f"<code>{esc(key)}</code>"),
            ("refused by", esc(letter.service)),
            ("headers", esc(headers) or '<span class="muted">none</span>'),
        ]
    else:
        facts, record = [], item.raw
    facts = [("reason", f'<span class="error">{esc(item.reason)}</span>'), *facts]
    facts.append(("age", f"{esc(age(now - item.at))} (dead-lettered {esc(when(item.at))})"))
    rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    state = "waiting" if handling is None else handling.action
    return (
        f'<div class="card letter" data-letter="{esc(item.id)}" data-state="{esc(state)}">'
        f"<h3>dead letter {esc(item.id)}</h3><table>{rows}</table>"
        f'<details data-key="letter-{esc(item.id)}"{"" if handling else " open"}><summary>the original record</summary>'
        f'<pre class="record">{record_text(record)}</pre></details>{action}</div>'
    )


def dead_letters(cards: list[str], counted: list[tuple[str, int, int]], version: str, trouble: str | None) -> str:
    """The dead letters' fragment: counts per reason, then each letter (waiting ones first)."""
    rows = "".join(f"<tr><td>{esc(kind)}</td><td>{waiting}</td><td>{done}</td></tr>" for kind, waiting, done in counted)
    table = (
        f'<table class="reasons"><tr><th>reason</th><th>waiting</th><th>handled</th></tr>{rows}</table>' if rows else ""
    )
    body = "".join(cards) or '<p class="muted" id="empty">No dead letters.</p>'
    warning = notice(trouble, "bad") if trouble else ""
    waiting = sum(c[1] for c in counted)
    return f'<div data-version="{esc(version)}">{warning}<h2>Dead letters ({waiting} waiting)</h2>{table}{body}</div>'
