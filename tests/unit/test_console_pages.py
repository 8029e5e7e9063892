"""The console's app over a real ledger (SQLite, migrated) with a turn waiting for a person, the guard that keeps it,
and outlets that record what would go to Kafka: a decision is signed for exactly the held call by the signed-in
person, sent once, refused once it has been sent or applied; the ledger or Kafka away is said, nothing sent twice;
what people and models wrote is shown as text."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from roundtrip._console import pages, timeline
from roundtrip._console.auth import Identity
from roundtrip._console.ledger_reader import Books
from roundtrip._console.web import Console, application
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import ApprovalDecided, ApprovalRequested, CancelTurn, Decision
from tests.unit.test_approvals_flow import DECISIONS, PEOPLE_KEYS, guard, waiting_turn  # noqa: F401 - a fixture

ME = "tester@unit"


class Outlet:
    def __init__(self) -> None:
        self.sent: list[tuple[object, str]] = []
        self.away = False

    async def __call__(self, message, conversation_id: str) -> None:
        if self.away:
            raise ConnectionError("Kafka is away")
        self.sent.append((message, conversation_id))


def console_for(ledger_url: str) -> tuple[Console, Outlet, Outlet]:
    settings = Settings(
        _env_file=None,
        env="development",
        console_local_user=ME,
        console_secure_cookies=False,  # httpx keeps a Secure cookie for https only
        decision_signing_key=PEOPLE_KEYS.signing,  # the console holds the private key; the guard the public
        ledger_database_url=ledger_url,
    )
    decisions, cancels = Outlet(), Outlet()
    return Console(settings, Books(ledger_url, None), decisions, cancels), decisions, cancels


async def signed_in(console: Console) -> tuple[httpx.AsyncClient, str]:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=application(console, ())), base_url="http://testserver")
    page = await http.get("/approvals")
    assert page.status_code == 200
    token = http.cookies["roundtrip_csrf"]
    assert all(form == token for form in re.findall(r'name="csrf" value="([^"]+)"', page.text))  # one per request
    return http, token


async def test_a_decision_is_signed_for_the_held_call_by_the_person_sent_once_and_refused_after(guard, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="roundtrip.audit")
    event = await waiting_turn(guard)
    console, decisions, _ = console_for(str(guard.ledger.engine.url).replace("sqlite://", "sqlite+aiosqlite://"))
    http, token = await signed_in(console)
    inbox = (await http.get("/approvals/live")).text
    assert event.approval_id in inbox and "above 50.00 EUR" in inbox and "ord_a1000003" in inbox

    decide = f"/approvals/{event.approval_id}/decide"
    answer = await http.post(decide, data={"csrf": token, "decision": "approve", "reason": "ok", "decided_by": "x"})
    assert answer.status_code == 303
    assert "approved cancel_order for cus_1001" in (await http.get(answer.headers["location"])).text
    assert "you were logged out" not in (await http.get("/approvals?decided=you+were+logged+out")).text
    ((decision, conversation),) = decisions.sent
    DECISIONS.verify(decision)  # signed with the decision key, which no page ever showed
    assert isinstance(decision, ApprovalDecided) and conversation == "conv_1"
    assert (decision.decision, decision.decided_by, decision.reason) == (Decision.APPROVE, ME, "ok")  # not the form's
    assert (decision.tool_use_id, decision.input_sha256) == (event.call.id, event.input_sha256)
    assert "unit-decisions" not in inbox + (await http.get("/approvals")).text

    again = await http.post(decide, data={"csrf": token, "decision": "deny"})  # before the guard applied the first
    assert again.status_code == 409 and "waiting for the guard" in again.text and len(decisions.sent) == 1
    assert await guard.approvals.on_decision(decision) == "approved"
    console.sent.clear()  # another replica of the console knows only the ledger
    late = await http.post(decide, data={"csrf": token, "decision": "deny"})
    assert late.status_code == 409 and f"approval {event.approval_id} is approved by {ME}" in late.text
    assert len(decisions.sent) == 1
    audit = [r.getMessage() for r in caplog.records if r.name == "roundtrip.audit"]
    assert (
        audit[0].startswith(f'approve by="{ME}" role=approver via=local')
        and f'approval="{event.approval_id}"' in audit[0]
    )
    assert [a.split(" by=")[0] for a in audit] == ["approve", "refused deny", "refused deny"]


async def test_kafka_away_is_said_and_nothing_is_recorded_as_sent(guard):  # noqa: F811
    event = await waiting_turn(guard)
    console, decisions, cancels = console_for(str(guard.ledger.engine.url).replace("sqlite://", "sqlite+aiosqlite://"))
    http, token = await signed_in(console)
    decisions.away = cancels.away = True
    answer = await http.post(f"/approvals/{event.approval_id}/decide", data={"csrf": token, "decision": "deny"})
    assert answer.status_code == 503 and "Kafka did not confirm" in answer.text and not console.sent
    cancel = await http.post("/turns/turn_1/cancel", data={"csrf": token, "reason": "test"})
    assert cancel.status_code == 503
    decisions.away = cancels.away = False
    assert (await http.post("/turns/turn_1/cancel", data={"csrf": token, "reason": "test"})).status_code == 303
    ((command, _),) = cancels.sent
    assert isinstance(command, CancelTurn) and command.turn_id == "turn_1" and ME in command.reason


async def test_the_ledger_away_is_said_on_the_page_and_a_decision_is_refused(tmp_path):
    console, decisions, _ = console_for(f"sqlite+aiosqlite:///{tmp_path / 'nowhere' / 'ledger.db'}")
    http, token = await signed_in(console)
    assert "cannot be read" in (await http.get("/approvals/live")).text
    assert "cannot be read" in (await http.get("/turns")).text
    answer = await http.post("/approvals/appr_1/decide", data={"csrf": token, "decision": "approve"})
    assert answer.status_code == 503 and "nothing sent" in answer.text and not decisions.sent


def test_what_people_and_models_wrote_is_shown_as_text():
    request = ApprovalRequested.model_validate(
        {
            "approval_id": "appr_x",
            "turn": {
                "turn_id": "t",
                "request_id": "r",
                "conversation_id": "c",
                "customer_id": "<b>cus</b>",
                "trace_id": "x",
            },
            "step": 1,
            "call": {
                "id": "toolu_1",
                "name": "cancel_order",
                "input": {"note": "<script>alert(1)</script>"},
                "approved": True,
            },
            "reason": '"><img src=x onerror=alert(1)>',
            "input_sha256": "0" * 64,
            "requested_at": 1.0,
            "expires_at": 2.0,
            "messages": [],
        }
    )

    class Row:
        approval_id, turn_id, customer_id, reason = "appr_x", "t", "<b>cus</b>", request.reason
        requested_at, expires_at = 1.0, 2.0

    card = pages.approval_card(Row, request, Identity(ME, "approver", "local"), "tok", None, None)
    assert "<script>" not in card and "<img" not in card and "<b>cus" not in card
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in card and "&lt;b&gt;cus&lt;/b&gt;" in card
    steps = pages.timeline(timeline.build([{"role": "user", "content": "<i>hi</i>"}], 0, [], None), [], "v", None)
    assert steps.count("&lt;i&gt;") == 1 and "<i>" not in steps


@pytest.fixture(autouse=True)
def _no_env_file(monkeypatch):
    for name in ("ROUNDTRIP_ENV", "ROUNDTRIP_CONSOLE_TRUSTED_PROXIES", "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)
