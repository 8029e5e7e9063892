"""The console's signed sign-in (services/_console/auth.py) against a real OIDC issuer process (tests/oidc_issuer.py:
discovery document, JWKS, tokens signed with joserfc), its audit of refused sign-ins, its roles in the app, and the
page's Content-Security-Policy and its rendering of hostile text."""

from __future__ import annotations

import asyncio
import html.parser
import logging
import re
import time

import httpx
import jwt
import pytest
from starlette.requests import Request

from roundtrip._console import auth, pages, timeline
from roundtrip._console.auth import APPROVER, VIEWER, Gatekeeper, NotSignedIn, Refusals
from roundtrip._console.ledger_reader import Books
from roundtrip._console.web import Console, application
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire.events import ApprovalDecided, ApprovalRequested
from tests import oidc_issuer
from tests.clocks import showing
from tests.unit.test_approvals_flow import PEOPLE_KEYS, guard, waiting_turn  # noqa: F401 - a fixture

AUDIENCE = "roundtrip-console"
PEER = "10.20.30.40"


@pytest.fixture(scope="module")
def issuer():
    with oidc_issuer.running() as running:
        yield running


def settings_for(issuer, **values) -> Settings:
    return Settings(
        _env_file=None,
        env="production",
        console_oidc_issuer=issuer.url,
        console_oidc_audience=AUDIENCE,
        **values,
    )


def request(headers: dict[str, str] | None = None, peer: str = PEER) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": raw, "client": (peer, 50000)})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def person(issuer, name: str = "alice@example.com", groups=("roundtrip-approvers",), **claims) -> str:
    return issuer.mint(sub=name.split("@")[0], email=name, aud=AUDIENCE, groups=list(groups), **claims)


def refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "roundtrip.security"]


async def test_a_token_the_issuer_signed_signs_its_person_in_with_the_role_of_their_groups(issuer):
    gate = Gatekeeper(settings_for(issuer))
    alice = await gate.identify(request(bearer(person(issuer))))
    assert (alice.name, alice.role, alice.via) == ("alice@example.com", APPROVER, "token")
    vic = await gate.identify(
        request({"X-Forwarded-Access-Token": person(issuer, "vic@example.com", ["v", "roundtrip-viewers"])})
    )
    assert (vic.name, vic.role, vic.may_decide) == ("vic@example.com", VIEWER, False)
    assert (await gate.identify(request(bearer(person(issuer, groups=["marketing"]))))).role is None
    both = {**bearer(person(issuer)), "X-Forwarded-Access-Token": person(issuer, "vic@example.com")}
    assert (await gate.identify(request(both))).name == "alice@example.com"  # the first header of the setting wins
    iap = Gatekeeper(
        settings_for(issuer, console_oidc_token_headers="x-goog-iap-jwt-assertion", console_oidc_groups_claim="roles")
    )
    token = issuer.mint(sub="u1", email="ia@example.com", aud=AUDIENCE, roles="x, roundtrip-approvers")
    assert (await iap.identify(request({"x-goog-iap-jwt-assertion": token}))).role == APPROVER
    with pytest.raises(NotSignedIn):  # another header than the configured one: not read
        await iap.identify(request(bearer(token)))


def _forged(issuer, kid: str) -> str:
    now = int(time.time())
    claims = {"iss": issuer.url, "aud": AUDIENCE, "email": "mallory@example.com", "groups": ["roundtrip-approvers"]}
    return oidc_issuer.sign({**claims, "iat": now, "exp": now + 300}, oidc_issuer.another_key(kid))


@pytest.mark.parametrize(
    "case,reason",
    [
        ("no token", "no-token"),
        ("identity headers only", "no-token"),
        ("another key, the issuer's key id", "bad-signature"),
        ("another key, an unknown key id", "unknown-key"),
        ("expired", "expired"),
        ("another audience", "wrong-audience"),
        ("another issuer", "wrong-issuer"),
        ("not a token", "invalid-token"),
        ("basic credentials", "no-token"),
    ],
)
async def test_every_refused_sign_in_is_refused_and_audited_with_the_reason_address_and_claimed_identity(
    issuer, caplog, case, reason
):
    caplog.set_level(logging.INFO, logger="roundtrip.security")
    headers = {
        "no token": {},
        "identity headers only": {
            "X-Forwarded-Email": "mallory@example.com",
            "X-Forwarded-Groups": "roundtrip-approvers",
        },
        "another key, the issuer's key id": bearer(_forged(issuer, "k1")),
        "another key, an unknown key id": bearer(_forged(issuer, "mallory-key")),
        "expired": bearer(person(issuer, "mallory@example.com", exp=int(time.time()) - 600)),
        "another audience": bearer(issuer.mint(email="mallory@example.com", aud="another-app", groups=[])),
        "another issuer": bearer(person(issuer, "mallory@example.com", iss="https://evil.example")),
        "not a token": bearer("<script>alert(1)</script>"),
        "basic credentials": {"Authorization": "Basic YWxpY2U6c2VjcmV0"},
    }[case]
    gate = Gatekeeper(settings_for(issuer))
    with pytest.raises(NotSignedIn, match="not signed in") as refused:
        await gate.identify(request(headers))
    assert refused.value.status == 401
    (line,) = refusals(caplog)
    assert f"reason={reason} from='{PEER}'" in line
    claimed = "'mallory@example.com'" if "mallory" in str(headers.get("Authorization", "")) or reason in (
        "bad-signature", "unknown-key", "expired", "wrong-audience", "wrong-issuer"
    ) else "None"  # fmt: skip
    assert f"claimed={claimed}" in line and "Bearer" not in line and "eyJ" not in line  # never the token itself


async def test_refusals_are_rate_limited_per_address_and_reason_with_a_count(caplog):
    caplog.set_level(logging.INFO, logger="roundtrip.security")
    now = [0.0]
    log = Refusals(showing(now))
    for _ in range(5):
        log.refused("no-token", "1.1.1.1", None)
    log.refused("expired", "1.1.1.1", "a@x")
    log.refused("no-token", "2.2.2.2", None)
    assert len(refusals(caplog)) == 3
    now[0] += auth.REFUSAL_WINDOW_S  # past the log's window: the next refusal from that address is written again
    log.refused("no-token", "1.1.1.1", "mallory\nforged line")
    last = refusals(caplog)[-1]
    assert "and 4 more from this address" in last and "\n" not in last and "'mallory\\nforged line'" in last


async def test_a_key_the_issuer_rotated_in_is_fetched_again_for_its_unknown_key_id(issuer, monkeypatch):
    monkeypatch.setattr(auth, "JWKS_REFRESH_COOLDOWN_S", 4.0)  # longer than the issuer takes to make a key
    gate = Gatekeeper(settings_for(issuer))
    assert (await gate.identify(request(bearer(person(issuer))))).role == APPROVER
    before = issuer.jwks_fetches()
    kid = issuer.rotate()
    token = person(issuer)
    assert kid in str(httpx.get(f"{issuer.url}/jwks").json())
    with pytest.raises(NotSignedIn):  # within the cooldown after its last fetch: the keys it holds only
        await gate.identify(request(bearer(token)))
    time.sleep(4.1)  # past the 4 s cooldown between key-set fetches set above
    assert (await gate.identify(request(bearer(token)))).name == "alice@example.com"
    assert issuer.jwks_fetches() == before + 2  # the test's own look, and the console's one refresh


async def test_an_issuer_out_of_reach_is_a_503_not_a_refusal(caplog):
    gate = Gatekeeper(
        Settings(
            _env_file=None, env="production", console_oidc_issuer="http://127.0.0.1:9", console_oidc_audience=AUDIENCE
        )
    )
    with pytest.raises(NotSignedIn, match="cannot reach") as away:
        await gate.identify(request(bearer("a.b.c")))
    assert away.value.status == 503


async def test_a_token_without_a_key_id_is_believed_while_the_issuer_publishes_one_key_only(caplog):
    caplog.set_level(logging.INFO, logger="roundtrip.security")
    with oidc_issuer.running() as one_key:  # its own issuer: it rotates below
        token = one_key.mint_without_kid(
            sub="alice", email="alice@example.com", aud=AUDIENCE, groups=["roundtrip-approvers"]
        )
        assert "kid" not in jwt.get_unverified_header(token)
        alice = await Gatekeeper(settings_for(one_key)).identify(request(bearer(token)))
        assert (alice.name, alice.role) == ("alice@example.com", APPROVER)
        forged = oidc_issuer.sign(
            {"iss": one_key.url, "aud": AUDIENCE, "email": "mallory@example.com", "exp": int(time.time()) + 300},
            oidc_issuer.another_key(),
            kid=False,
        )
        with pytest.raises(NotSignedIn):  # the one key it publishes did not sign this one
            await Gatekeeper(settings_for(one_key)).identify(request(bearer(forged)))
        one_key.rotate()  # two keys published: which one a token without a key id means is unknowable
        token = one_key.mint_without_kid(sub="alice", email="alice@example.com", aud=AUDIENCE)
        with pytest.raises(NotSignedIn) as refused:
            await Gatekeeper(settings_for(one_key)).identify(request(bearer(token)))
    assert refused.value.status == 401
    assert "reason=unknown-key" in refusals(caplog)[-1] and "publishes 2 signing keys" in refusals(caplog)[-1]


async def test_an_email_the_issuer_did_not_verify_does_not_name_the_person(issuer):
    gate = Gatekeeper(settings_for(issuer))
    unverified = {"email": "ceo@example.com", "email_verified": False, "aud": AUDIENCE, "groups": ["roundtrip-viewers"]}
    assert (await gate.identify(request(bearer(issuer.mint(sub="u-42", **unverified))))).name == "u-42"
    named = issuer.mint(sub="u-42", preferred_username="mallory", **unverified)
    assert (await gate.identify(request(bearer(named)))).name == "mallory"  # the next claim of the setting
    absent = issuer.mint(sub="u-42", **unverified)  # the claim left out altogether: not verified either
    assert (await gate.identify(request(bearer(absent)))).name == "u-42"
    verified = issuer.mint(sub="u-42", email="ceo@example.com", email_verified=True, aud=AUDIENCE, groups=[])
    assert (await gate.identify(request(bearer(verified)))).name == "ceo@example.com"


@pytest.mark.parametrize("jwks_url", [False, True], ids=["discovery", "jwks"])
async def test_an_issuer_out_of_reach_is_asked_once_per_cooldown_and_said_once(caplog, monkeypatch, jwks_url):
    caplog.set_level(logging.INFO, logger="roundtrip.security")
    monkeypatch.setattr(auth, "JWKS_REFRESH_COOLDOWN_S", 3.0)  # longer than the requests below take
    with oidc_issuer.running() as away:
        token = person(away)
        away.outage(True)
        gate = Gatekeeper(settings_for(away, console_oidc_jwks_url=f"{away.url}/jwks" if jwks_url else None))
        before = away.fetches()
        answers = await asyncio.gather(
            *(gate.identify(request(bearer(token))) for _ in range(5)), return_exceptions=True
        )
        assert all(isinstance(a, NotSignedIn) and a.status == 503 and "try again in" in a.message for a in answers)
        asked = "jwks" if jwks_url else "discovery"
        assert away.fetches()[asked] == before[asked] + 1  # five sign-ins, one request to the issuer
        away.outage(False)
        with pytest.raises(NotSignedIn, match="cannot reach"):  # back, but the cooldown is not over: not asked
            await gate.identify(request(bearer(token)))
        assert away.fetches() == {**before, asked: before[asked] + 1}
        said = [line for line in refusals(caplog) if "cannot fetch the issuer's keys" in line]
        assert len(said) == 1 and "asks again in 3 s" in said[0]
        time.sleep(3.1)  # past the 3 s cooldown set above
        assert (await gate.identify(request(bearer(token)))).name == "alice@example.com"


class Outlet:
    def __init__(self) -> None:
        self.sent: list[object] = []

    async def __call__(self, message, conversation_id: str) -> None:
        self.sent.append(message)


async def test_in_the_app_a_viewer_cannot_decide_and_an_approver_can(issuer, guard, caplog):  # noqa: F811
    caplog.set_level(logging.INFO)
    event = await waiting_turn(guard)
    ledger = str(guard.ledger.engine.url).replace("sqlite://", "sqlite+aiosqlite://")
    settings = settings_for(
        issuer, console_secure_cookies=False, decision_signing_key=PEOPLE_KEYS.signing, ledger_database_url=ledger
    )
    decisions = Outlet()
    app = application(Console(settings, Books(ledger, None), decisions, Outlet()), ())

    async def client(token: str | None) -> tuple[httpx.AsyncClient, str]:
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver", headers=bearer(token) if token else {}
        )
        page = await http.get("/approvals")
        return http, page.text

    anonymous, text = await client(None)
    assert (await anonymous.get("/approvals")).status_code == 401 and event.approval_id not in text
    viewer, text = await client(person(issuer, "vic@example.com", ["roundtrip-viewers"]))
    assert event.approval_id in text and "You may look, not decide" in text
    decide = f"/approvals/{event.approval_id}/decide"
    refused = await viewer.post(decide, data={"csrf": viewer.cookies["roundtrip_csrf"], "decision": "approve"})
    assert refused.status_code == 403 and "viewer" in refused.text and not decisions.sent
    approver, text = await client(person(issuer))
    answer = await approver.post(decide, data={"csrf": approver.cookies["roundtrip_csrf"], "decision": "approve"})
    assert answer.status_code == 303
    ((decision,),) = [decisions.sent]
    assert isinstance(decision, ApprovalDecided) and decision.decided_by == "alice@example.com"
    audit = [r.getMessage() for r in caplog.records if r.name == "roundtrip.audit"]
    assert any(a.startswith('approve by="alice@example.com" role=approver via=token') for a in audit)


async def test_the_content_security_policy_allows_no_inline_script_or_style_and_the_assets_are_served():
    settings = Settings(_env_file=None, env="development", console_local_user="me@laptop", console_secure_cookies=False)
    app = application(Console(settings, Books("sqlite+aiosqlite:///:memory:", None), Outlet(), Outlet()), ())
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")
    page = await http.get("/turns")
    policy = page.headers["content-security-policy"]
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "<script>" not in page.text and "<style" not in page.text and " style=" not in page.text
    assert not re.search(r"\son[a-z]+=", page.text)  # no inline event handler either
    script = await http.get("/static/console.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in script.text and "DOMParser" in script.text
    assert (await http.get("/static/console.css")).headers["content-type"].startswith("text/css")


HOSTILE = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(2)>',
    "'><svg onload=alert(3)>",
    "</pre><iframe src=//evil></iframe>",
    "<style>body{display:none}</style>",
    "javascript:alert(4)",
]


class Elements(html.parser.HTMLParser):
    """Every element and attribute of a page, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += attrs


def elements(text: str) -> Elements:
    parsed = Elements()
    parsed.feed(text)
    return parsed


def test_hostile_text_in_every_field_creates_no_element_or_script():
    calm = elements(_rendered("calm words"))
    for hostile in HOSTILE:
        parsed = elements(_rendered(hostile))
        assert parsed.tags == calm.tags, hostile  # the same elements as with calm words: nothing added
        assert not any(name.startswith("on") for name, _ in parsed.attributes)
        assert not any((value or "").startswith("javascript:") for name, value in parsed.attributes if name == "href")


def _rendered(text: str) -> str:
    """The inbox card, the turn's timeline (transcript and spans) and its approvals, the turns table and a refusal,
    with `text` in every field customers, models, tools, services and people write."""
    call = {"type": "tool_use", "id": "toolu_1", "name": text, "input": {"q": text}}
    messages = [
        {"role": "user", "content": text},  # an earlier turn of the conversation
        {"role": "assistant", "content": [{"type": "text", "text": text}]},
        {"role": "user", "content": text},
        {"role": "assistant", "content": [{"type": "text", "text": text}, call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": text}]},
    ]
    request = ApprovalRequested.model_validate(
        {
            "approval_id": "appr_x",
            "turn": {
                "turn_id": "t",
                "request_id": "r",
                "conversation_id": "c",
                "customer_id": text,
                "trace_id": "x",
                "history_messages": 2,
            },
            "step": 1,
            "call": {"id": "toolu_1", "name": "cancel_order", "input": {"note": text}, "approved": True},
            "reason": text,
            "input_sha256": "0" * 64,
            "requested_at": 1.0,
            "expires_at": 2.0,
            "messages": messages[:4],
            "entities": {"order": {"note": text}},
            "results": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": text}],
        }
    )

    class Row:
        approval_id, turn_id, customer_id, reason, tool, status = "appr_x", "t", text, text, text, "denied"
        requested_at, expires_at, decided_by, decided_at, decision_reason = 1.0, 2.0, text, 3.0, text
        tool_use_id, conversation_id = "toolu_1", text

    class TurnRow:
        turn_id, status, customer_id, step, outcome, cost_usd = "t", "ended", text, 1, text, 0.0
        input_tokens = output_tokens = cache_creation_input_tokens = cache_read_input_tokens = 0
        started_at, agent_digest, conversation_id, shown_status, shown_lane = 1.0, text, text, text, text
        shown_version = text

    def span(name: str, **attributes) -> dict:
        return {
            "name": name,
            "service": "roundtrip-model" if name == "chat" else "roundtrip-x",
            "start_ns": 0,
            "end_ns": 1_000_000,
            "status_message": f"rejected: {text}",
            "attributes": {"roundtrip.step": 1, **attributes},
        }

    spans = [
        span("chat", **{"gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": [text]}),
        span("gate.check_call", **{"roundtrip.tool_use_id": "toolu_1", "roundtrip.approved": False}),
        span(f"execute_tool {text}", **{"gen_ai.tool.call.id": "toolu_1", "gen_ai.tool.name": text}),
        span("guard.decide", **{"roundtrip.decision": text, "roundtrip.outcome": text, "roundtrip.detail": text}),
    ]
    steps = timeline.build(messages, 2, spans, text)
    card = pages.approval_card(Row, request, pages.Identity(text, "approver", "token"), "tok", None, None)
    return pages.page(
        text,
        pages.inbox([card], "v", text)
        + pages.turns_table([TurnRow], "v", text, 5.0)
        + pages.timeline(steps, [Row], "v", text)
        + pages.approvals_history([Row])
        + pages.refusal(text, "/turns")
        + pages.notice(text, "ok"),
        pages.Identity(text, "viewer", "token"),
    )


@pytest.fixture(autouse=True)
def _no_env_file(monkeypatch):
    for name in ("ROUNDTRIP_ENV", "ROUNDTRIP_CONSOLE_TRUSTED_PROXIES", "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)
