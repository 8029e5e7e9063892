"""Settings by concern (issue 18): every knob in one concern, `roundtrip config` grouped and without a secret, and
the topics a service uses named with the prefix of the settings it was built with, never a global's."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from roundtrip._cli.main import app
from roundtrip._kernel.settings import (
    CONCERNS,
    LoopRules,
    ModelSettings,
    Settings,
    describe_invalid,
    env_name,
    get_settings,
)
from roundtrip._kernel.settings.display import grouped, without_passwords
from roundtrip._kernel.wire import topics, topology
from roundtrip._sdk.agent import load_agent
from roundtrip._shop.agent.settings import ShopAgentSettings
from tests.syntax import parse

SERVICES = Path(__file__).resolve().parents[2] / "services"


@pytest.fixture
def clean_env(monkeypatch):
    """No ROUNDTRIP_* (or API key) from the shell; the CLI's cached settings read afresh before and after."""
    import os

    for name in list(os.environ):
        if name.startswith("ROUNDTRIP_") or name == "ANTHROPIC_API_KEY":
            monkeypatch.delenv(name)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_every_setting_is_declared_in_exactly_one_concern():
    owners: dict[str, list[str]] = {}
    for concern in CONCERNS:
        assert concern.heading and concern in Settings.__mro__
        for name in concern.model_fields:
            owners.setdefault(name, []).append(concern.__name__)
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}
    assert set(owners) == set(Settings.model_fields)


def test_a_concern_reads_its_own_variables_alone(clean_env):
    clean_env.setenv("ROUNDTRIP_MAX_STEPS", "3")
    clean_env.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert LoopRules().max_steps == 3 and Settings().max_steps == 3
    assert ModelSettings().anthropic_api_key.get_secret_value() == "sk-test" and not ModelSettings().use_simulator
    clean_env.delenv("ANTHROPIC_API_KEY")
    clean_env.setenv("ROUNDTRIP_ANTHROPIC_API_KEY", "sk-other")
    assert Settings().anthropic_api_key.get_secret_value() == "sk-other"
    assert not hasattr(LoopRules(), "anthropic_api_key")  # a part given the loop rules gets only those


SECRETS = {
    "ROUNDTRIP_BATCH_SIGNING_KEY": "k2:approvalsecret2",
    "ROUNDTRIP_DECISION_SIGNING_KEY": "ops9:decisionsecret9",
    "ANTHROPIC_API_KEY": "sk-ant-apikeysecret",
    "ROUNDTRIP_LEDGER_DATABASE_URL": "postgresql+asyncpg://roundtrip:ledgerpassword@db:5432/ledger",
    "ROUNDTRIP_CONVERSATIONS_DATABASE_URL": "postgresql+asyncpg://db:5432/conv?user=rt&password=querypassword",
    "ROUNDTRIP_SHOP_DATABASE_URL": "postgresql+asyncpg://shop:shoppassword@db/shop",
    "ROUNDTRIP_OTLP_ENDPOINT": "https://tracer:otlppassword@collector:4318",
    "ROUNDTRIP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "ROUNDTRIP_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "ROUNDTRIP_KAFKA_SASL_USERNAME": "roundtrip",
    "ROUNDTRIP_KAFKA_SASL_PASSWORD": "saslpassword",
    "ROUNDTRIP_CONSOLE_SESSION_KEY": "sessionkeysecret",
}
SHOWN_NEVER = (
    "approvalsecret",
    "decisionsecret",
    "apikeysecret",
    "ledgerpassword",
    "querypassword",
    "shoppassword",
    "otlppassword",
    "saslpassword",
    "sessionkeysecret",
)


def test_roundtrip_config_prints_every_setting_under_its_concern_and_no_secret(clean_env):
    for name, value in SECRETS.items():
        clean_env.setenv(name, value)
    done = CliRunner().invoke(app, ["config"])
    assert done.exit_code == 0, done.output
    for secret in SHOWN_NEVER:
        assert secret not in done.output  # stdout and stderr (which fleet it read)
    out = done.stdout
    assert "k2:***" in out and "ops9:***" in out  # which keys are configured shows, their secrets do not
    assert "postgresql+asyncpg://roundtrip:***@db:5432/ledger" in out and "password=***" in out
    headings = [line[2:] for line in out.splitlines() if line.startswith("# ")]
    assert headings == [
        *(concern.heading for concern in CONCERNS),
        "the model's platform in effect",  # services/_model/providers.py: in_effect
        "the agent's own settings (support-agent)",
    ]
    blocks = {block.splitlines()[0][2:]: block for block in out.strip().split("\n\n")}
    for concern in CONCERNS:
        for name in concern.model_fields:
            assert any(line.split()[0] == env_name(name) for line in blocks[concern.heading].splitlines()[1:]), name


def test_roundtrip_config_help_says_what_it_prints():
    done = CliRunner().invoke(app, ["config", "--help"])
    assert done.exit_code == 0 and "grouped by concern" in done.output and "secrets hidden" in done.output


def test_a_secret_field_is_hidden_whatever_its_value():
    shown = dict(
        row
        for _, rows in grouped(Settings(_env_file=None, anthropic_api_key="nocolon", batch_signing_key="lonesecret"))
        for row in rows
    )
    assert shown["ANTHROPIC_API_KEY"] == "***" and "lonesecret" not in shown["ROUNDTRIP_BATCH_SIGNING_KEY"]
    assert (
        without_passwords("see postgresql+asyncpg://u:p4ss@h/db and http://x:tok@h?token=t0k")
        == "see postgresql+asyncpg://u:***@h/db and http://x:***@h?token=***"
    )


def test_the_contracts_are_generated_with_unprefixed_names_whatever_the_shell_says(clean_env):
    from roundtrip._cli.contracts import ROOT, asyncapi_document, rendered

    clean_env.setenv("ROUNDTRIP_TOPIC_PREFIX", "staging.")
    get_settings()  # a cached global with the prefix, which nothing may read
    channels = asyncapi_document()["channels"]
    assert channels and not any("staging." in name for name in channels)
    assert rendered()["contracts/asyncapi.json"] == (ROOT / "contracts" / "asyncapi.json").read_text()


def test_a_service_uses_the_prefix_it_was_built_with_not_the_environments(clean_env):
    clean_env.setenv("ROUNDTRIP_TOPIC_PREFIX", "from-env.")
    get_settings()
    for declared in topology.SERVICES:
        broker = (
            importlib.import_module(declared.app_module)
            .build(Settings(_env_file=None, topic_prefix="built."), load_agent())
            .broker
        )
        names = [getattr(t, "name", t) for s in broker.subscribers for t in s.topics] + [
            p.topic for p in broker.publishers
        ]
        assert names and all(name.startswith("built.") for name in names), (declared.name, names)
        assert {n.removeprefix("built.") for n in names} >= {i.topic for i in declared.inputs}
    assert topics.t(topics.SUPPORT_REQUESTS, "p.") == "p.support.requests"


def _calls_to_get_settings(path: Path) -> list[str]:
    """The functions of a module that call get_settings()."""
    tree = parse(path.read_text())
    found = []
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "get_settings"
                ):
                    found.append(function.name)
    module_level = [
        node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    found += [
        "<module>"
        for stmt in module_level
        for node in ast.walk(stmt)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "get_settings"
    ]
    return found


def test_only_entry_points_read_the_cached_settings():
    readers = {
        str(path.relative_to(SERVICES)): sorted(set(calls))
        for path in SERVICES.rglob("*.py")
        if path.parent.name != "settings" and (calls := _calls_to_get_settings(path))
    }
    library = {
        module: functions
        for module, functions in readers.items()
        if not module.startswith("_cli/") and functions != ["main"]
    }  # the CLI's command modules and `python -m ...`'s main() are entry points
    assert library == {}
    assert "_cli/main.py" in readers


def test_every_secret_setting_is_a_secret_str_and_its_value_is_read_where_used(clean_env):
    for name, value in SECRETS.items():
        clean_env.setenv(name, value)
    settings = Settings(_env_file=None)
    for field in (
        "anthropic_api_key",
        "ledger_database_url",
        "conversations_database_url",
        "kafka_sasl_password",
        "console_session_key",
    ):
        assert isinstance(getattr(settings, field), SecretStr), field
    dumped = repr(settings) + str(settings.model_dump())  # the approval and decision keys are not SecretStr yet, nor
    # is the OTLP endpoint (an address, whose password `roundtrip config` hides)
    assert not any(
        secret in dumped for secret in SHOWN_NEVER if secret not in ("approvalsecret", "decisionsecret", "otlppassword")
    )
    assert settings.ledger_db_url == SECRETS["ROUNDTRIP_LEDGER_DATABASE_URL"]  # what the engines open
    assert settings.conversations_db_url == SECRETS["ROUNDTRIP_CONVERSATIONS_DATABASE_URL"]
    assert not settings.use_simulator


@pytest.mark.parametrize(
    "broken, variable",
    [
        ({"ROUNDTRIP_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"}, None),  # the password set where SASL is not used
        ({"ROUNDTRIP_PARTITIONS": "six"}, "ROUNDTRIP_PARTITIONS"),
        (
            {"ROUNDTRIP_LEDGER_DATABASE_URL": "mysql://roundtrip:ledgerpassword@db/ledger"},
            "ROUNDTRIP_LEDGER_DATABASE_URL",
        ),
    ],
)
def test_a_settings_error_does_not_repeat_a_secret_of_the_environment(clean_env, broken, variable):
    for name, value in {**SECRETS, **broken}.items():
        clean_env.setenv(name, value)
    with pytest.raises(ValidationError) as refused:
        Settings(_env_file=None)
    said = str(refused.value) + repr(refused.value) + describe_invalid(refused.value)
    assert not any(secret in said for secret in SHOWN_NEVER), said
    assert variable is None or variable in describe_invalid(refused.value)
    done = CliRunner().invoke(app, ["config"])
    assert done.exit_code != 0 and not any(secret in done.output for secret in SHOWN_NEVER), done.output


def test_every_concern_hides_its_input_in_errors():
    assert all(concern.model_config.get("hide_input_in_errors") for concern in CONCERNS)
    assert ShopAgentSettings.model_config.get("hide_input_in_errors")
