"""The credentials of an MCP server (services/_sdk/mcp_auth.py) and what a mount does with them: where a secret is read
from, the problems of a declaration, the SDK's OAuth provider renewing early, refusals told apart from other failures
and logged once, the turn's traceparent in a call's `_meta`, and the secret never in a repr, a log or a check."""

from __future__ import annotations

import dataclasses
import logging
import time

import httpx2
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from roundtrip import BearerToken, ClientCredentials
from roundtrip._sdk.context import ToolError
from roundtrip._sdk.mcp import McpMount
from roundtrip._sdk.mcp_auth import RENEW_MARGIN_S, CredentialError
from tests.agents import SHOP
from tests.unit.test_mcp import SERVER, FakeMcp, ctx, fake_mount

SECRET = "s3cret-value-never-shown"
ISSUER = "https://auth.example.test"


def test_a_bearer_token_from_the_environment_or_a_mounted_file(monkeypatch, tmp_path):
    monkeypatch.setenv("GIFT_TOKEN", SECRET)
    assert BearerToken(env="GIFT_TOKEN").headers() == {"Authorization": f"Bearer {SECRET}"}
    (path := tmp_path / "token").write_text(SECRET + "\n")  # a mounted Secret's file ends with a newline
    token = BearerToken(file=path)
    assert token.headers() == {"Authorization": f"Bearer {SECRET}"}
    path.write_text("rotated")  # read at each connection: a rotated Secret is taken without a restart
    assert token.headers() == {"Authorization": "Bearer rotated"}
    assert BearerToken(env="GIFT_TOKEN", header="X-Api-Key").headers() == {"X-Api-Key": SECRET}
    assert BearerToken(env="GIFT_TOKEN", header="X-Api-Key").kind == "X-Api-Key header"


class OwnSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GIFTSHOP_")
    billing_token: SecretStr = SecretStr("")


async def test_a_secret_from_the_agents_own_settings(monkeypatch):
    monkeypatch.setenv("GIFTSHOP_BILLING_TOKEN", SECRET)
    token = BearerToken(setting="billing_token")
    assert token.headers(OwnSettings()) == {"Authorization": f"Bearer {SECRET}"}
    assert token.source == "setting billing_token"
    with pytest.raises(CredentialError, match=r"^the agent's setting billing_token is not set$"):
        token.headers(None)
    server = dataclasses.replace(SERVER, auth=token)
    fake = FakeMcp()
    mount = server.bind(OwnSettings())  # each process's mount reads it from the agent's own settings
    mount.connection = fake.connection
    assert mount._own_settings.billing_token.get_secret_value() == SECRET
    agent = dataclasses.replace(SHOP, settings=OwnSettings, mcp_servers=[server])
    assert agent.problems() == []
    wrong = dataclasses.replace(server, auth=BearerToken(setting="bililng_token"))
    assert any(
        "name the setting bililng_token, which the agent's own settings" in problem
        for problem in dataclasses.replace(agent, mcp_servers=[wrong]).problems()
    )


def test_a_secret_that_is_not_there_is_one_line_naming_where_it_should_be(monkeypatch, tmp_path):
    monkeypatch.delenv("GIFT_TOKEN", raising=False)
    with pytest.raises(CredentialError, match=r"^environment variable GIFT_TOKEN is not set$"):
        BearerToken(env="GIFT_TOKEN").headers()
    with pytest.raises(CredentialError, match=r"^secret file .*missing cannot be read \(No such file"):
        BearerToken(file=tmp_path / "missing").headers()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(CredentialError, match=r"is empty$"):
        BearerToken(file=tmp_path / "empty").headers()


@pytest.mark.parametrize(
    ("auth", "said"),
    [
        (BearerToken(), "exactly one of env="),
        (BearerToken(env="A", file="/b"), "exactly one of env="),
        (BearerToken(env="A", setting="b"), "exactly one of env="),
        (BearerToken(env="A", header="Bad Header:"), "header must be an HTTP header name"),
        (ClientCredentials(issuer="auth.example", client_id="c", client_secret_env="S"), "issuer must be"),
        (ClientCredentials(issuer=ISSUER, client_id="", client_secret_env="S"), "client_id is empty"),
        (ClientCredentials(issuer=ISSUER, client_id="c"), "secret: give exactly one"),
        (ClientCredentials(issuer=ISSUER, client_id="c", client_secret_env="S", scopes="a b"), "list of scopes"),
        ("Bearer abc", "auth must be a BearerToken or ClientCredentials, not str"),
    ],
)
def test_a_declaration_that_does_not_fit_is_a_problem_of_the_agent(auth, said):
    server = dataclasses.replace(SERVER, auth=auth)
    assert any(said in problem and problem.startswith("MCP server giftwrap") for problem in server.problems({"order"}))
    agent = dataclasses.replace(SHOP, mcp_servers=[server])
    assert any(said in problem for problem in agent.problems())


def test_a_good_declaration_has_no_problem_and_names_its_credentials_without_their_value(monkeypatch):
    monkeypatch.setenv("GIFT_TOKEN", SECRET)
    monkeypatch.setenv("CLIENT_SECRET", SECRET)
    bearer = dataclasses.replace(SERVER, auth=BearerToken(env="GIFT_TOKEN"))
    oauth = dataclasses.replace(
        SERVER,
        auth=ClientCredentials(issuer=ISSUER, client_id="roundtrip", client_secret_env="CLIENT_SECRET", scopes=["a"]),
    )
    assert bearer.problems({"order"}) == [] and oauth.problems({"order"}) == []
    assert bearer.credentials == "bearer token (env GIFT_TOKEN)"
    assert oauth.credentials == (
        f"OAuth client credentials (client roundtrip at {ISSUER}, secret from env CLIENT_SECRET)"
    )
    for shown in (repr(bearer), repr(oauth), str(bearer.auth), bearer.credentials, oauth.credentials):
        assert SECRET not in shown
    assert (
        dataclasses.replace(SHOP, mcp_servers=[bearer]).digest == dataclasses.replace(SHOP, mcp_servers=[SERVER]).digest
    )


async def test_the_sdk_provider_holds_the_token_in_memory_and_renews_it_before_it_expires(monkeypatch):
    monkeypatch.setenv("CLIENT_SECRET", SECRET)
    credentials = ClientCredentials(issuer=ISSUER, client_id="roundtrip", client_secret_env="CLIENT_SECRET")
    provider = credentials.provider("https://mcp.example.test/mcp", None)
    from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider

    assert isinstance(provider, ClientCredentialsOAuthProvider)
    assert provider.context.client_metadata.grant_types == ["client_credentials"]
    answer = httpx2.Response(200, json={"access_token": "at-1", "token_type": "Bearer", "expires_in": 3600})
    await provider._handle_token_response(answer)  # what the provider does with the token endpoint's answer
    assert provider.context.token_expiry_time == pytest.approx(time.time() + 3600 - RENEW_MARGIN_S, abs=5)
    assert await provider.context.storage.get_tokens() is provider.context.current_tokens  # this process only
    short = httpx2.Response(200, json={"access_token": "at-2", "token_type": "Bearer", "expires_in": 100})
    await provider._handle_token_response(short)
    assert provider.context.token_expiry_time == pytest.approx(time.time() + 90, abs=5)  # a tenth of a short life
    monkeypatch.delenv("CLIENT_SECRET")
    with pytest.raises(CredentialError, match="CLIENT_SECRET"):
        credentials.provider("https://mcp.example.test/mcp", None)


def test_a_refusal_is_told_apart_from_other_failures():
    mount = McpMount(SERVER, "https://mcp.example.test/mcp", None)
    wrapped = ExceptionGroup("unhandled errors in a TaskGroup", [RuntimeError("Server returned an error response")])
    assert mount.refusal(wrapped, [401]) == "HTTP 401"
    assert mount.refusal(wrapped, [200, 403]) == "HTTP 403"
    assert mount.refusal(wrapped, [401, 200]) is None  # the last answer counts: a 401 the OAuth provider resolved
    assert mount.refusal(wrapped, [500]) is None
    assert mount.refusal(ConnectionRefusedError(), []) is None
    assert mount.refusal(CredentialError("environment variable X is not set"), []) == (
        "its credentials cannot be read: environment variable X is not set"
    )
    from mcp.client.auth import OAuthTokenError

    assert "did not give a token" in (mount.refusal(OAuthTokenError("Token exchange failed (401)"), []) or "")


async def test_a_refused_call_is_an_error_result_and_one_log_line_naming_the_server_not_the_secret(monkeypatch, caplog):
    monkeypatch.setenv("GIFT_TOKEN", SECRET)
    server = dataclasses.replace(SERVER, auth=BearerToken(env="GIFT_TOKEN"))
    fake = FakeMcp()
    mount = fake_mount(fake, server)
    fake.answer = RuntimeError("Server returned an error response")
    monkeypatch.setattr(mount, "refusal", lambda exc, answers: "HTTP 401")  # what the server's 401 makes of it
    caplog.set_level(logging.INFO, logger="roundtrip.mcp")
    for _ in range(3):
        with pytest.raises(ToolError, match="did not accept the fleet's credentials"):
            await mount.call("gift_wrap_order", {"order_id": "ord_1", "message": "hi"}, ctx())
    lines = [r.getMessage() for r in caplog.records if "refused the credentials" in r.getMessage()]
    assert lines == [
        "MCP server giftwrap (http://mcp.test/mcp) refused the credentials bearer token (env GIFT_TOKEN): HTTP 401; "
        "its tools answer is_error until it accepts them"
    ]
    assert "does not accept the fleet's credentials" in (mount.unavailable("gift_wrap_order") or "")
    assert [problem async for problem in _checked(mount)] == [
        "MCP server giftwrap (http://mcp.test/mcp) refused the credentials bearer token (env GIFT_TOKEN): HTTP 401"
    ]
    mount.connection = fake.connection
    monkeypatch.setattr(mount, "refusal", lambda exc, answers: None)
    fake.answer = FakeMcp().answer
    await mount.call("gift_wrap_order", {"order_id": "ord_1", "message": "hi"}, ctx())
    assert mount.refusing is None and "accepts the credentials bearer token (env GIFT_TOKEN) again" in caplog.text
    assert SECRET not in caplog.text


async def _checked(mount: McpMount):
    mount.connection = FakeMcp(up=False).connection  # the listing fails as the call did
    for problem in await mount.check(lambda source: None):
        yield problem


async def test_a_call_carries_the_turns_traceparent_in_its_meta():
    fake = FakeMcp()
    mount = fake_mount(fake)
    turn = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    with trace.use_span(NonRecordingSpan(turn)):
        await mount.call("gift_wrap_order", {"order_id": "ord_1", "message": "hi"}, ctx())
    ((_, _, meta),) = fake.calls
    assert meta["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert meta["roundtrip/customer_id"] == "cus_1001"
