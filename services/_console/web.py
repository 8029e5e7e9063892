"""The console's pages and its two changes (a decision, a cancel), as a Starlette app.

Every change is written to the audit log (logger `roundtrip.audit`) and on a span in the turn's own trace. A decision
for an approval that has ended is refused with the reason and never sent; so is a second one sent from this console
before the guard applied the first.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from roundtrip._console import decisions, pages, timeline
from roundtrip._console.auth import CSRF_COOKIE, CSRF_FIELD, Gatekeeper, Identity, NotSignedIn
from roundtrip._console.ledger_reader import Books, LedgerAway
from roundtrip._kernel.observability import traces
from roundtrip._kernel.observability.telemetry import span_in_turn
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.ledger_reads import TurnRow
from roundtrip._kernel.storage.prices import PriceTable
from roundtrip._kernel.wire.events import ApprovalRequested, Turn

log = logging.getLogger("roundtrip.console")
audit = logging.getLogger("roundtrip.audit")
Send = Callable[[BaseModel, str], Awaitable[None]]
PUBLISH_TIMEOUT_S = 10.0
TOLD = 200  # the decisions whose line a redirect can still show
CANCEL_SENT = "cancel sent; the guard ends the turn with a polite reply"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class Answer(Exception):
    """Stop the request here with this page and status (401, 403, 404, 409, 503)."""

    def __init__(self, status: int, message: str, identity: Identity | None = None, back: str = "/approvals") -> None:
        super().__init__(message)
        self.status, self.message, self.identity, self.back = status, message, identity, back


@dataclass
class Console:
    settings: Settings
    books: Books
    send_decision: Send
    send_cancel: Send
    gate: Gatekeeper = field(init=False)
    sent: dict[str, str] = field(default_factory=dict)  # approval id -> what this console sent for it (not yet applied)
    told: dict[str, str] = field(default_factory=dict)  # approval id -> the line its decider is shown (the last TOLD)
    _deciding: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.gate = Gatekeeper(self.settings)
        self.trace_template = self.settings.trace_link_template()
        try:
            self.prices: PriceTable | None = PriceTable.from_json(self.settings.prices, self.settings.model_provider)
        except ValueError:  # the guard refuses such prices at its start; the page then shows no cost per step
            self.prices = None

    async def _identity(self, request: Request) -> Identity:
        try:
            identity = await self.gate.identify(request)
        except NotSignedIn as exc:
            raise Answer(exc.status, exc.message) from None
        if identity.role is None:
            raise Answer(403, f"{identity.name} is signed in but in no group of the console (viewer or approver)")
        return identity

    def _html(self, request: Request, identity: Identity | None, title: str, body: str, status: int = 200) -> Response:
        response = HTMLResponse(pages.page(title, body, identity), status_code=status, headers=SECURITY_HEADERS)
        if identity is not None:
            token = self._csrf(request, identity)
            response.set_cookie(
                CSRF_COOKIE,
                token,
                httponly=True,
                secure=self.settings.console_secure_cookies,
                samesite="strict",
                path="/",
            )
        return response

    def _csrf(self, request: Request, identity: Identity) -> str:
        """This request's CSRF token (the cookie's when it verifies, else a new one), for its forms and cookie."""
        if getattr(request.state, "csrf", None) is None:
            request.state.csrf = self.gate.token(identity, request.cookies.get(CSRF_COOKIE))
        return cast(str, request.state.csrf)

    def _where(self, request: Request) -> str:
        peer = request.client.host if request.client else "?"
        forwarded = request.headers.get("x-forwarded-for", "")
        return f"{peer} for {forwarded}" if forwarded and self.gate.from_proxy(request) else peer

    async def _change(self, request: Request, back: str) -> tuple[Identity, Any]:
        """The identity and form of a genuine change by an approver; Answer(403) otherwise (and said in the log)."""
        identity = await self._identity(request)
        form = await request.form()
        if not self.gate.check_post(identity, request, str(form.get(CSRF_FIELD, ""))):
            audit.warning(
                "refused post %s by %s from %s: CSRF token", request.url.path, identity.name, self._where(request)
            )
            raise Answer(
                403, "the form's CSRF token is missing or wrong: reload the page and try again", identity, back
            )
        if not identity.may_decide:
            audit.warning(
                "refused post %s by %s (viewer) from %s", request.url.path, identity.name, self._where(request)
            )
            raise Answer(403, f"{identity.name} is a viewer: only approvers may decide or cancel", identity, back)
        return identity, form

    async def _inbox(self, request: Request, identity: Identity) -> str:
        try:
            rows, trouble = await self.books.waiting(), None
        except LedgerAway as exc:
            rows, trouble = [], str(exc)
        csrf = self._csrf(request, identity)
        waiting = {r.approval_id for r in rows}
        for gone in [a for a in self.sent if a not in waiting]:  # applied (or ended): no longer this console's to hold
            self.sent.pop(gone)
        cards = [
            pages.approval_card(
                r,
                ApprovalRequested.model_validate_json(r.request_json),
                identity,
                csrf,
                self.trace_template,
                self.sent.get(r.approval_id),
            )
            for r in rows
        ]
        version = hashlib.sha256(
            json.dumps([[r.approval_id, self.sent.get(r.approval_id)] for r in rows] + [trouble]).encode()
        ).hexdigest()[:16]
        return pages.inbox(cards, version, trouble)

    async def approvals(self, request: Request) -> Response:
        identity = await self._identity(request)
        done = self.told.get(request.query_params.get("decided", ""))  # never text from the URL: a link could lie
        head = pages.notice(done, "ok") if done else ""
        body = head + pages.live("/approvals/live", await self._inbox(request, identity))
        return self._html(request, identity, "Approvals", body)

    async def approvals_live(self, request: Request) -> Response:
        identity = await self._identity(request)
        return HTMLResponse(await self._inbox(request, identity), headers=SECURITY_HEADERS)

    async def decide(self, request: Request) -> Response:
        approval_id = request.path_params["approval_id"]
        identity, form = await self._change(request, "/approvals")
        verdict = str(form.get("decision", ""))
        if verdict not in ("approve", "deny"):
            raise Answer(400, "the form names no decision (approve or deny)", identity)
        reason = str(form.get("reason", "")).strip()[:500]
        async with self._deciding:  # one decision at a time: a second one for the same approval sees the first
            row, turn = await self._read(self.books.approval(approval_id), identity)
            refused = decisions.refusal(approval_id, row, turn)
            if refused is None and approval_id in self.sent:
                refused = decisions.Refused(f"approval {approval_id}: {self.sent[approval_id]}: nothing sent")
            if refused is not None:
                if row is None or row.status != "pending":  # applied or ended: no longer this console's to hold
                    self.sent.pop(approval_id, None)
                self._audit(f"refused {verdict}", identity, request, approval=approval_id, why=refused.message)
                raise Answer(refused.status, refused.message, identity)
            decision = decisions.signed_decision(
                row, verdict == "approve", reason, identity.name, decisions.decision_signer(self.settings)
            )
            attributes = {
                "roundtrip.approval_id": approval_id,
                "roundtrip.decision": decision.decision.value,
                "roundtrip.decided_by": identity.name,
                "roundtrip.console.client": self._where(request),
            }
            past = "approved" if verdict == "approve" else "denied"
            await self._publish(turn, "console.decide", attributes, self.send_decision, decision, identity)
            self.sent[approval_id] = f"{past} by {identity.name} at {time.strftime('%H:%M:%S')}, waiting for the guard"
        self._audit(verdict, identity, request, approval=approval_id, turn=row.turn_id, tool=row.tool, reason=reason)
        message = f"{past} {row.tool} for {row.customer_id} (approval {approval_id}); the guard resumes the turn"
        self.told[approval_id] = message
        while len(self.told) > TOLD:
            self.told.pop(next(iter(self.told)))
        return RedirectResponse(f"/approvals?decided={_q(approval_id)}", status_code=303)

    async def _turns(self, request: Request) -> str:
        q = request.query_params
        try:
            age = float(q.get("max_age_min") or 0) * 60 or None
        except ValueError:
            return pages.notice("started within: a number of minutes, please", "bad")
        try:
            status, outcome, customer, conversation, lane, version, agent = (
                q.get(k) or None for k in ("status", "outcome", "customer", "conversation", "lane", "version", "agent")
            )
            rows = await self.books.turns(
                status, outcome, customer, age, agent, conversation=conversation, lane=lane, version=version
            )
            trouble = None
        except LedgerAway as exc:
            rows, trouble = [], str(exc)
        version = hashlib.sha256(
            json.dumps([[r.turn_id, r.shown_status, r.step] for r in rows] + [trouble]).encode()
        ).hexdigest()[:16]
        return pages.turns_table(rows, version, trouble, time.time())

    async def turns(self, request: Request) -> Response:
        identity = await self._identity(request)
        q = request.query_params
        filters = pages.turn_filters(q)
        src = "/turns/live" + (f"?{request.url.query}" if request.url.query else "")
        return self._html(request, identity, "Turns", filters + pages.live(src, await self._turns(request)))

    async def turns_live(self, request: Request) -> Response:
        await self._identity(request)
        return HTMLResponse(await self._turns(request), headers=SECURITY_HEADERS)

    async def _timeline(self, row: Any, approvals: list[Any]) -> str:
        """The turn's steps from its transcript (the conversation store's, else the held call's) joined with its
        trace's spans."""
        messages, history = [], 0
        if row.status == "ended":
            messages = await self.books.transcript(row.turn_id) or []
        if not messages and approvals:
            held = ApprovalRequested.model_validate_json(approvals[0].request_json)  # the newest: the most steps
            messages, history = held.messages, held.turn.history_messages
        spans: list[dict[str, Any]] = []
        trouble = None
        if row.trace_id:
            try:
                _, spans = await asyncio.to_thread(traces.read, self.settings, row.trace_id)
            except traces.TraceUnreadable as exc:
                trouble = f"the turn's trace cannot be read ({exc}): the steps lack their times and verdicts"
            except Exception as exc:  # noqa: BLE001 - a broken span file is the page's note, never its failure
                trouble = f"the turn's trace cannot be read: {type(exc).__name__}: {exc}"[:300]
        built = timeline.build(messages, history, spans, row.outcome if row.status == "ended" else None, self.prices)
        version = hashlib.sha256(
            json.dumps(
                [row.status, row.step, len(messages), len(spans), [a.status for a in approvals], trouble]
            ).encode()
        ).hexdigest()[:16]
        return pages.timeline(built, approvals, version, trouble)

    async def _known_turn(self, request: Request) -> tuple[Identity, str, Any, list[Any]]:
        """Who asks, the turn id of the path, its ledger row and approvals; Answer(404) for a turn the ledger lacks."""
        identity = await self._identity(request)
        turn_id = request.path_params["turn_id"]
        row, approvals = await self._read(self.books.turn(turn_id), identity, back="/turns")
        if row is None:
            raise Answer(404, f"no turn {turn_id}", identity, "/turns")
        return identity, turn_id, row, approvals

    async def turn(self, request: Request) -> Response:
        identity, turn_id, row, approvals = await self._known_turn(request)
        done = CANCEL_SENT if request.query_params.get("cancelled") else ""
        steps = await self._timeline(row, approvals)
        body = (
            (pages.notice(done, "ok") if done else "")
            + f"<h2>Turn {pages.esc(turn_id)}</h2>"
            + pages.turn_summary(row, self.trace_template, time.time())
            + (
                pages.cancel_form(turn_id, self._csrf(request, identity))
                if row.status != "ended" and identity.may_decide
                else ""
            )
            + "<h3>Approvals</h3>"
            + pages.approvals_history(approvals)
            + (steps if row.status == "ended" else pages.live(f"/turns/{_q(turn_id)}/live", steps))
        )
        return self._html(request, identity, f"Turn {turn_id}", body)

    async def turn_live(self, request: Request) -> Response:
        _, _, row, approvals = await self._known_turn(request)
        return HTMLResponse(await self._timeline(row, approvals), headers=SECURITY_HEADERS)

    async def cancel(self, request: Request) -> Response:
        turn_id = request.path_params["turn_id"]
        back = f"/turns/{_q(turn_id)}"
        identity, form = await self._change(request, back)
        reason = str(form.get("reason", "")).strip()[:500] or "cancelled in the console"
        row, _ = await self._read(self.books.turn(turn_id), identity, back)
        refused = decisions.cancel_refusal(turn_id, row)
        if refused is not None:
            self._audit("refused cancel", identity, request, turn=turn_id, why=refused.message)
            raise Answer(refused.status, refused.message, identity, back)
        command = decisions.cancel_command(row, f"{reason} ({identity.name})", identity.name)
        attributes = {"roundtrip.cancelled_by": identity.name, "roundtrip.console.client": self._where(request)}
        await self._publish(row, "console.cancel", attributes, self.send_cancel, command, identity, back)
        self._audit("cancel", identity, request, turn=turn_id, customer=row.customer_id, reason=reason)
        return RedirectResponse(f"{back}?cancelled=1", 303)

    async def _read(self, reading: Awaitable[Any], identity: Identity, back: str = "/approvals") -> Any:
        try:
            return await reading
        except LedgerAway as exc:
            raise Answer(503, f"{exc}: nothing sent", identity, back) from None

    async def _publish(
        self, turn: TurnRow, name: str, attributes: dict[str, Any], send: Send, message: BaseModel, identity: Identity,
        back: str = "/approvals",
    ) -> None:  # fmt: skip
        """Publish `message` in a span of the turn's trace; Answer(503) when Kafka did not take it in time."""
        with span_in_turn(name, Turn.model_validate(turn.turn), turn.traceparent, turn.step) as span:
            span.set_attributes({**attributes, "enduser.id": identity.name, "enduser.role": identity.role or ""})
            try:
                await asyncio.wait_for(send(message, turn.conversation_id), PUBLISH_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - Kafka away: the page says so
                span.set_attribute("roundtrip.error", f"{type(exc).__name__}: {exc}"[:200])
                log.error("%s for turn %s not confirmed by Kafka: %s: %s", name, turn.turn_id, type(exc).__name__, exc)
                raise Answer(
                    503,
                    f"Kafka did not confirm within {PUBLISH_TIMEOUT_S:.0f} s ({type(exc).__name__}). It may still "
                    "arrive: look at the page again before you repeat it (a repeat is recognised, never applied twice)",
                    identity,
                    back,
                ) from None

    def _audit(self, action: str, identity: Identity, request: Request, **what: str) -> None:
        details = " ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in what.items())
        audit.info(
            "%s by=%s role=%s via=%s from=%s at=%.3f %s",
            action,
            json.dumps(identity.name),
            identity.role,
            identity.via,
            json.dumps(self._where(request)),
            time.time(),
            details,
        )

    async def answer(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Answer)
        body = pages.refusal(exc.message, exc.back)
        return self._html(request, exc.identity, "Refused", body, exc.status)


def _q(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def _static(body: str, media_type: str) -> Callable[[Request], Awaitable[Response]]:
    async def serve(request: Request) -> Response:
        return Response(body, media_type=media_type, headers=SECURITY_HEADERS)

    return serve


def application(console: Console, more: Sequence[BaseRoute]) -> Starlette:
    """The console's routes, and `more` of its other pages."""
    routes = [
        Route("/static/console.css", _static(pages.STYLE, "text/css")),
        Route("/static/console.js", _static(pages.SCRIPT, "text/javascript")),
        Route("/", lambda request: RedirectResponse("/approvals", 303)),
        Route("/approvals", console.approvals),
        Route("/approvals/live", console.approvals_live),
        Route("/approvals/{approval_id}/decide", console.decide, methods=["POST"]),
        Route("/turns", console.turns),
        Route("/turns/live", console.turns_live),
        Route("/turns/{turn_id}", console.turn),
        Route("/turns/{turn_id}/live", console.turn_live),
        Route("/turns/{turn_id}/cancel", console.cancel, methods=["POST"]),
    ]
    return Starlette(routes=[*routes, *more], exception_handlers={Answer: console.answer})
