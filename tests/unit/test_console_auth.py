"""The console's sign-in, roles and CSRF tokens (services/_console/auth.py), and what its desk refuses
(services/_console/decisions.py): offline, on real Starlette requests."""

from __future__ import annotations

import time

import pytest
from starlette.requests import Request

from roundtrip._console.auth import APPROVER, CSRF_LIFETIME_S, VIEWER, Gatekeeper, NotSignedIn
from roundtrip._console.decisions import cancel_refusal, refusal
from roundtrip._guard.ledger import ApprovalRow, TurnRow
from roundtrip._kernel.settings import ConfigurationError, InsecureConfiguration, Settings

PROXY = "10.1.2.3"
ALICE = {
    "x-forwarded-user": "alice",
    "x-forwarded-email": "alice@example.com",
    "x-forwarded-groups": "a, roundtrip-approvers",
}


def request(peer: str, headers: dict[str, str] | None = None, cookie: str | None = None) -> Request:
    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    if cookie:
        raw.append((b"cookie", f"roundtrip_csrf={cookie}".encode()))
    return Request({"type": "http", "method": "GET", "path": "/", "headers": raw, "client": (peer, 50000)})


def production(**values) -> Settings:
    return Settings(_env_file=None, env="production", **values)


def development(**values) -> Settings:
    return Settings(_env_file=None, env="development", **values)


async def test_development_proxy_headers_are_believed_only_from_the_configured_proxies():
    gate = Gatekeeper(development(console_trusted_proxies=f"{PROXY}, 192.168.0.0/16"))
    assert (await gate.identify(request(PROXY, ALICE))).name == "alice@example.com"
    assert (await gate.identify(request("192.168.7.7", ALICE))).role == APPROVER
    with pytest.raises(NotSignedIn, match="not signed in"):
        await gate.identify(request("10.9.9.9", ALICE))  # anyone can type the header: not from the proxy, not believed
    with pytest.raises(NotSignedIn, match="not signed in"):
        await gate.identify(request(PROXY))  # the proxy named nobody


async def test_without_a_configured_sign_in_nobody_is_signed_in_outside_development():
    gate = Gatekeeper(production())
    with pytest.raises(NotSignedIn, match="ROUNDTRIP_CONSOLE_OIDC_ISSUER"):
        await gate.identify(request("127.0.0.1", ALICE))


async def test_roles_come_from_the_groups():
    gate = Gatekeeper(development(console_trusted_proxies=PROXY, console_viewer_groups="support"))
    viewer = await gate.identify(request(PROXY, {**ALICE, "x-forwarded-groups": "support"}))
    assert viewer.role == VIEWER and not viewer.may_decide
    assert (await gate.identify(request(PROXY, {**ALICE, "x-forwarded-groups": "marketing"}))).role is None
    assert (await gate.identify(request(PROXY, {"x-forwarded-user": "bob"}))).name == "bob"  # no e-mail: the user


async def test_the_local_user_and_the_trusted_proxies_are_for_development_only():
    dev = development()
    assert (await Gatekeeper(dev).identify(request("127.0.0.1"))).via == "local"
    local = Gatekeeper(dev.model_copy(update={"console_local_user": "me@laptop"}))
    assert (await local.identify(request("1.2.3.4"))).name == "me@laptop"
    assert production(console_local_user="me@laptop").console_local_identity is None
    with pytest.raises(InsecureConfiguration, match="ROUNDTRIP_CONSOLE_LOCAL_USER") as refused:
        production(console_local_user="me@laptop").refuse_console_local_user("console")
    assert "\n" not in str(refused.value)
    with pytest.raises(InsecureConfiguration, match=r"ROUNDTRIP_CONSOLE_TRUSTED_PROXIES.*signed mode"):
        production(console_trusted_proxies=PROXY).refuse_console_local_user("console")
    development(console_trusted_proxies=PROXY).refuse_console_local_user("console")
    with pytest.raises(ConfigurationError, match="ROUNDTRIP_CONSOLE_OIDC_AUDIENCE"):
        production(console_oidc_issuer="https://sso.example").refuse_console_local_user("console")
    with pytest.raises(ValueError, match="ROUNDTRIP_CONSOLE_TRUSTED_PROXIES"):
        Gatekeeper(development(console_trusted_proxies="not-an-address"))


def test_the_shipped_sign_on_placeholders_stop_the_console_outside_development():
    shipped = {"console_oidc_issuer": "https://CHANGE-ME.example.com/realms/staff", "console_oidc_audience": "app"}
    with pytest.raises(ConfigurationError, match="ROUNDTRIP_CONSOLE_OIDC_ISSUER is the manifest's placeholder"):
        production(**shipped).refuse_console_local_user("console")
    production(console_oidc_issuer="https://sso.example.com", console_oidc_audience="app").refuse_console_local_user(
        "console"
    )


@pytest.mark.parametrize(
    "key,says", [("CHANGE-ME-to-64-random-hex-chars", "placeholder CHANGE-ME"), ("s3cr3t-but-short", "16 bytes")]
)
def test_a_placeholder_or_short_session_key_is_refused_outside_development_without_showing_it(key, says):
    with pytest.raises(ConfigurationError, match=says) as refused:
        production(console_session_key=key).refuse_weak_session_key("console")
    assert key not in str(refused.value) and "\n" not in str(refused.value)
    production(console_session_key="k" * 32).refuse_weak_session_key("console")
    production().refuse_weak_session_key("console")  # unset: a random key per process
    Settings(_env_file=None, env="development", console_session_key=key).refuse_weak_session_key("console")


async def test_a_csrf_token_is_bound_to_its_person_and_must_match_the_cookie():
    gate = Gatekeeper(development(console_trusted_proxies=PROXY, console_session_key="k" * 32))
    alice = await gate.identify(request(PROXY, ALICE))
    bob = await gate.identify(request(PROXY, {**ALICE, "x-forwarded-email": "bob@example.com"}))
    token = gate.token(alice, None)
    assert gate.token(alice, token) == token and gate.token(bob, token) != token
    assert gate.check_post(alice, request(PROXY, ALICE, cookie=token), token)
    assert not gate.check_post(alice, request(PROXY, ALICE), token)  # no cookie: a post from elsewhere
    tampered = token[:-1] + ("1" if token.endswith("0") else "0")
    assert not gate.check_post(alice, request(PROXY, ALICE, cookie=tampered), tampered)
    assert not gate.check_post(bob, request(PROXY, ALICE, cookie=token), token)  # someone else's token
    other = Gatekeeper(development(console_trusted_proxies=PROXY, console_session_key="x" * 32))
    assert not other.check_post(alice, request(PROXY, ALICE, cookie=token), token)  # signed with another key


async def test_a_csrf_token_expires_and_a_page_in_its_second_half_of_life_gets_a_new_one():
    gate = Gatekeeper(development(console_trusted_proxies=PROXY, console_session_key="k" * 32))
    alice = await gate.identify(request(PROXY, ALICE))
    made = time.time()
    gate.clock = lambda: made
    token = gate.token(alice, None)
    gate.clock = lambda: made + CSRF_LIFETIME_S * 0.4
    assert gate.token(alice, token) == token  # young: the page keeps it (other tabs' forms stay good)
    gate.clock = lambda: made + CSRF_LIFETIME_S * 0.6
    assert gate.check_post(alice, request(PROXY, ALICE, cookie=token), token)  # still good for a form posted now
    renewed = gate.token(alice, token)
    assert renewed != token and gate.check_post(alice, request(PROXY, ALICE, cookie=renewed), renewed)
    gate.clock = lambda: made + CSRF_LIFETIME_S + 1
    assert not gate.check_post(alice, request(PROXY, ALICE, cookie=token), token)  # expired: refused
    nonce, _, mac = token.split(".")
    younger = f"{nonce}.{int(made + CSRF_LIFETIME_S)}.{mac}"  # its time moved on: the signature no longer holds
    assert not gate.check_post(alice, request(PROXY, ALICE, cookie=younger), younger)
    old_form = f"{nonce}.{mac}"  # a token of the form before tokens expired: refused (reload the page)
    assert not gate.check_post(alice, request(PROXY, ALICE, cookie=old_form), old_form)


def test_cookies_without_secure_are_refused_outside_development_in_one_line():
    with pytest.raises(InsecureConfiguration, match="ROUNDTRIP_CONSOLE_SECURE_COOKIES is false") as refused:
        production(console_secure_cookies=False).refuse_console_local_user("console")
    assert "\n" not in str(refused.value) and str(refused.value).startswith("console refuses to start")
    development(console_secure_cookies=False).refuse_console_local_user("console")
    production().refuse_console_local_user("console")


def _approval(status: str = "pending", expires_in: float = 60, decided_by: str | None = None) -> ApprovalRow:
    now = time.time()
    return ApprovalRow(
        "appr_1", "turn_1", 1, "toolu_1", "cancel_order", "0" * 64, "cus_1", "conv_1", status, "why", now,
        now + expires_in, decided_by, None, None, None, "{}",
    )  # fmt: skip


def _turn(status: str, outcome: str | None = None) -> TurnRow:
    now = time.time()
    return TurnRow(
        "turn_1", "req_1", "conv_1", "cus_1", status, 1, now, now, None, None, outcome, 0, 0, 0, 0, 0.0, "t" * 32,
        None, "{}", None,
    )  # fmt: skip


def test_the_desk_refuses_an_approval_that_has_ended_or_passed_its_deadline():
    assert refusal("appr_1", _approval(), _turn("awaiting")) is None
    assert refusal("appr_x", None, None).status == 404
    decided = refusal("appr_1", _approval("approved", decided_by="bob"), _turn("running"))
    assert (
        decided.status == 409
        and decided.message == "approval appr_1 is approved by bob; its turn is running: nothing sent"
    )
    cancelled = refusal("appr_1", _approval(), _turn("ended", "cancelled"))
    assert "its turn is ended (cancelled)" in cancelled.message
    assert "passed its deadline" in refusal("appr_1", _approval(expires_in=-5), _turn("awaiting")).message
    assert (
        cancel_refusal("turn_1", _turn("ended", "end_turn")).message
        == "turn turn_1 already ended (end_turn): nothing sent"
    )
    assert cancel_refusal("turn_1", _turn("running")) is None and cancel_refusal("turn_x", None).status == 404
