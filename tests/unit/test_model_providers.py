"""The model port (services/_model/providers.py): each platform's adapter builds the SDK's own client, which the model
service's client drives against the simulator in that platform's shape (services/_simulator/platforms.py) over real
HTTP, plain and streamed; each platform's throttle carries no rate-limit header; a configuration that could not call
the platform is refused in one line naming the setting."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from roundtrip._kernel.settings import ConfigurationError, Settings
from roundtrip._kernel.storage.prices import PriceTable, family
from roundtrip._kernel.wire.events import StreamedText, Turn
from roundtrip._model import providers
from roundtrip._model.client import ModelClient
from roundtrip._model.port import CallOptions
from roundtrip._model.streamed import Chunks
from roundtrip._simulator import running_simulator
from tests.unit.test_simulator import SYSTEM, TOOLS

BEDROCK_MODEL = "us.anthropic.claude-sonnet-4-6"
VERTEX_MODEL = "claude-sonnet-4-6"
FOUNDRY_MODEL = "claude-sonnet-4-6"
QUESTION = [{"role": "user", "content": "Where are my orders ord_1001 and ord_1002?"}]
TURN = Turn(turn_id="turn_p", request_id="req_p", conversation_id="conv_p", customer_id="cus_1001")


async def _nowhere(chunk: StreamedText, conversation_id: str) -> None:
    return None


@pytest.fixture(scope="module")
def base_url():
    with running_simulator() as url:
        yield url


@pytest.fixture(autouse=True)
def _platform_env(monkeypatch, tmp_path):
    """Fake AWS keys (botocore signs with them; the simulator checks a SigV4 header is there), nothing of a real
    account: no profile, no instance metadata, no Google or Foundry variables of this shell."""
    for name in ("AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_BEARER_TOKEN_BEDROCK", "CLOUD_ML_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name in ("ANTHROPIC_VERTEX_PROJECT_ID", "ANTHROPIC_FOUNDRY_API_KEY", "ANTHROPIC_FOUNDRY_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-key-file.json"))


def platform(name: str, base_url: str | None = None, **values) -> Settings:
    """Settings of the model service on `name`, reaching the simulator at `base_url` in that platform's shape."""
    values = {
        "bedrock": dict(model=BEDROCK_MODEL, model_region="us-east-1"),
        "vertex": dict(
            model=VERTEX_MODEL, model_region="us-east5", vertex_project_id="shop-prod", vertex_access_token="ya29.fake"
        ),
        "foundry": dict(model=FOUNDRY_MODEL, foundry_api_key="foundry-key"),
    }[name] | values
    suffix = {"bedrock": "", "vertex": "/v1", "foundry": "/anthropic"}[name]
    url = {"anthropic_base_url": f"{base_url}{suffix}"} if base_url else {}
    return Settings(_env_file=None, anthropic_api_key=None, model_provider=name, **url, **values)


@pytest.mark.parametrize("name", ["bedrock", "vertex", "foundry"])
async def test_the_model_client_calls_each_platform_with_its_sdk_client_plain_and_streamed(base_url, name):
    settings = platform(name, base_url)
    providers.refuse_unusable(settings, settings.model)  # a usable configuration is not refused
    client = ModelClient(settings, TOOLS, SYSTEM, settings.model, 0)
    try:
        sdk = {"bedrock": "AsyncAnthropicBedrock", "vertex": "AsyncAnthropicVertex", "foundry": "AsyncAnthropicFoundry"}
        assert isinstance(client._client, getattr(anthropic, sdk[name]))
        # the SDK's span of each call names the platform as the turn's span does
        assert client._client._gen_ai_provider_name == providers.of(settings).otel_name
        plain, headers = await client.answer(QUESTION, CallOptions("parallel", None, 0))
        streamed, _ = await client.stream_answer(
            QUESTION, CallOptions("parallel", None, 0), Chunks(TURN, 1, _nowhere, 0.0, 1)
        )
    finally:
        await client.aclose()
    assert plain.stop_reason == streamed.stop_reason == "tool_use"
    calls = [b for b in plain.content if b.type == "tool_use"]
    assert calls  # the persona's first step (its parallel calls: tests/e2e/test_model_providers_e2e.py)
    assert [(b.name, b.input) for b in calls] == [(b.name, b.input) for b in streamed.content if b.type == "tool_use"]
    assert plain.usage.input_tokens == streamed.usage.input_tokens > 0
    assert not [h for h in headers if h.lower().startswith("anthropic-ratelimit")]


async def test_the_simulator_refuses_a_bedrock_call_without_a_sigv4_signature(base_url):
    async with httpx.AsyncClient(base_url=base_url) as http:
        answer = await http.post(f"/model/{BEDROCK_MODEL}/invoke", json={"anthropic_version": "bedrock-2023-05-31"})
    assert answer.status_code == 403 and answer.headers["x-amzn-errortype"].startswith("AccessDeniedException")


@pytest.mark.parametrize(
    ("name", "words"),
    [("bedrock", "ThrottlingException"), ("vertex", "RESOURCE_EXHAUSTED"), ("foundry", "rate_limit_error")],
)
async def test_each_platform_throttles_in_its_own_words_without_rate_limit_headers(base_url, name, words):
    settings = platform(name, base_url)
    client = ModelClient(settings, TOOLS, SYSTEM, settings.model, 0)
    client._client = client._client.with_options(default_headers={"x-roundtrip-fault": "429"})
    try:
        with pytest.raises(anthropic.RateLimitError) as refused:
            await client.answer(QUESTION, CallOptions("careful", None, 0))
    finally:
        await client.aclose()
    response = refused.value.response
    assert words in response.headers.get("x-amzn-errortype", "") + response.text
    assert not [h for h in response.headers if h.lower().startswith("anthropic-ratelimit")]
    if name in ("bedrock", "vertex"):
        assert "retry-after" not in response.headers and "retry-after-ms" not in response.headers


@pytest.mark.parametrize(
    ("name", "values", "named"),
    [
        ("bedrock", {"model": "claude-sonnet-4-6"}, "ROUNDTRIP_MODEL=claude-sonnet-4-6 is not a Bedrock model id"),
        ("bedrock", {"model_region": None}, "ROUNDTRIP_MODEL_REGION is not set"),
        ("bedrock", {"model_region": "mars-north-1"}, "ROUNDTRIP_MODEL_REGION=mars-north-1 is not an AWS region"),
        ("vertex", {"model": "claude-sonnet-4-5-20250929"}, "e.g. claude-sonnet-4-5@20250929"),
        ("vertex", {"model": BEDROCK_MODEL}, "is not a Vertex AI model id"),
        ("vertex", {"model_region": None}, "ROUNDTRIP_MODEL_REGION is not set"),
        ("vertex", {"model_region": "moon"}, "ROUNDTRIP_MODEL_REGION=moon is not a Vertex AI region"),
        ("vertex", {"vertex_project_id": None}, "ROUNDTRIP_VERTEX_PROJECT_ID is not set"),
        ("vertex", {"vertex_access_token": None}, "no Google credentials for Vertex AI"),
        ("foundry", {"model": "claude-haiku-4-5@20251001"}, "is not a Foundry model id"),
        ("foundry", {"model": BEDROCK_MODEL}, "is not a Foundry model id"),
        ("foundry", {"foundry_api_key": None}, "ROUNDTRIP_FOUNDRY_API_KEY is not set"),
    ],
)
def test_a_configuration_that_could_not_call_the_platform_is_refused_in_one_line_naming_the_setting(
    name, values, named
):
    settings = platform(name, **values)
    if name == "foundry":
        settings = settings.model_copy(update={"foundry_resource": "shop-ai"})
    with pytest.raises(ConfigurationError) as refused:
        providers.refuse_unusable(settings, settings.model)
    message = str(refused.value)
    assert named in message and "\n" not in message and message.startswith("model refuses to start: ")
    assert "ya29.fake" not in message and "foundry-key" not in message  # no secret in the line


def test_bedrock_without_any_aws_credentials_is_refused(monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigurationError, match="no AWS credentials for Bedrock"):
        providers.refuse_unusable(platform("bedrock"), BEDROCK_MODEL)


def test_foundry_needs_its_resource_unless_an_endpoint_is_given():
    with pytest.raises(ConfigurationError, match="ROUNDTRIP_FOUNDRY_RESOURCE is not set"):
        providers.refuse_unusable(platform("foundry"), FOUNDRY_MODEL)
    providers.refuse_unusable(platform("foundry", "http://127.0.0.1:9"), FOUNDRY_MODEL)


def test_the_anthropic_api_is_never_refused_and_keeps_the_simulator_without_a_key():
    settings = Settings(_env_file=None, anthropic_api_key=None, anthropic_base_url=None)
    assert settings.model_provider == "anthropic" and settings.use_simulator and settings.model_base_url
    providers.refuse_unusable(settings, "claude-sonnet-4-6")
    assert not platform("bedrock").use_simulator and platform("bedrock").model_base_url is None


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("us.anthropic.claude-opus-4-5-20251101-v1:0", "claude-opus-4-5-20251101"),
        ("anthropic.claude-haiku-4-5-20251001-v1:0", "claude-haiku-4-5-20251001"),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5-20250929"),
        ("claude-sonnet-4-6", "claude-sonnet-4-6"),
    ],
)
def test_a_platforms_model_id_is_priced_as_its_family(model, named):
    assert family(model) == named
    table = PriceTable.from_json('{"default": [3.0, 15.0, 3.75, 0.30]}', "bedrock")
    assert table.price(model) == table.price(named)
    overridden = PriceTable.from_json('{"default": [3, 15, 3.75, 0.3], "claude-opus-4-5": [1, 2, 3, 4]}', "bedrock")
    assert overridden.price("global.anthropic.claude-opus-4-5-20251101-v1:0").input == 1.0  # ROUNDTRIP_PRICES first


@pytest.mark.parametrize(
    ("env", "shown"),
    [
        ({"ROUNDTRIP_MODEL_PROVIDER": "bedrock", "AWS_REGION": "eu-central-1"}, ("bedrock", "eu-central-1")),
        (
            {
                "ROUNDTRIP_MODEL_PROVIDER": "vertex",
                "ROUNDTRIP_MODEL_REGION": "europe-west1",
                "ROUNDTRIP_VERTEX_ACCESS_TOKEN": "ya29.secret-token",
            },
            ("vertex", "europe-west1"),
        ),
        ({"ROUNDTRIP_MODEL_PROVIDER": "foundry", "ROUNDTRIP_FOUNDRY_API_KEY": "foundry-secret-key"}, ("foundry", "")),
    ],
)
def test_roundtrip_config_shows_the_platform_and_its_region_and_no_credential(monkeypatch, env, shown):
    from typer.testing import CliRunner

    from roundtrip._cli.main import app
    from roundtrip._kernel.settings import get_settings

    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", "/nonexistent/roundtrip-state")  # no fleet runs there: this shell's
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        out = CliRunner().invoke(app, ["config"])
    finally:
        get_settings.cache_clear()
    assert out.exit_code == 0, out.output
    rows = dict(
        line.split(None, 1) for line in out.stdout.split("# the model's platform in effect\n")[1].splitlines()[:3]
    )
    assert rows["provider"] == shown[0] and (not shown[1] or rows["region"] == shown[1])
    assert "secret-" not in out.output and "ya29" not in out.output
