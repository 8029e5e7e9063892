"""An agent is one object: found by ROUNDTRIP_AGENT, checked at start, the same in every service.

Also: the services name no shop (the grep rule), and approvals are configured whenever the agent has a rule that
can hold a call (the published decision key is then refused outside development).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import roundtrip._cli.agent  # noqa: F401 - adds the check of an example script (the SDK knows no simulator)
from roundtrip import AgentError, always, load_agent
from roundtrip._kernel.settings import DEV_DECISION_VERIFY_KEYS, ConfigurationError, InsecureConfiguration, Settings
from roundtrip._kernel.wire.events import Outcome
from roundtrip._sdk import agent as agents
from roundtrip._sdk.texts import GATE_MESSAGES
from tests.agents import SHOP
from tests.signing import key_environment, key_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A folder on sys.path to write an agent module into (as its own distribution would be)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


# -- finding it ---------------------------------------------------------------------------------------------


def test_unset_is_the_demo_shops_agent_with_its_own_schemas():
    agent = load_agent(None)
    assert agent is SHOP and agent.name == "support-agent"
    assert Path(agent.tools_dir) == ROOT / "schemas" / "tools"
    assert "cancel_order" in agent.registry and agent.system_prompt.startswith("You are the customer-support agent")


def test_an_import_string_names_an_object_or_a_zero_argument_factory(package):
    package(
        "acme_support",
        """
        import dataclasses
        from roundtrip._shop.agent import AGENT as SHOP

        AGENT = dataclasses.replace(SHOP, name="acme", system_prompt="You help Acme's customers.")

        def make():
            return dataclasses.replace(SHOP, name="acme-made")
    """,
    )
    assert load_agent("acme_support:AGENT").name == "acme"
    assert load_agent("acme_support:make").name == "acme-made"


def test_a_name_is_looked_up_in_the_entry_point_group(package, monkeypatch):
    package(
        "acme_entry",
        "import dataclasses\nfrom roundtrip._shop.agent import AGENT\nBANK = dataclasses.replace(AGENT, name='bank')\n",
    )
    found = [EntryPoint(name="bank", value="acme_entry:BANK", group=agents.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(agents, "entry_points", lambda group: found if group == agents.ENTRY_POINT_GROUP else [])
    assert load_agent("bank").name == "bank"
    with pytest.raises(AgentError, match=r"no entry point of that name in the group roundtrip.agents"):
        load_agent("telecom")


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("no_such_module_xyz:AGENT", "cannot import no_such_module_xyz"),
        ("roundtrip._shop.agent:NOPE", "has no attribute NOPE"),
        ("roundtrip._shop.agent:", "expected package.module:attribute"),
        ("roundtrip._shop.agent:SYSTEM_PROMPT", "is a str, not an Agent"),
    ],
)
def test_a_bad_string_says_what_is_wrong_in_one_line(spec, problem):
    with pytest.raises(AgentError, match=re.escape(problem)) as caught:
        load_agent(spec)
    assert "\n" not in str(caught.value) and isinstance(caught.value, ConfigurationError)


def test_a_failing_factory_is_one_line(package):
    package("acme_broken", "def make():\n    raise RuntimeError('no CRM url')\n")
    with pytest.raises(AgentError, match="the factory failed: RuntimeError: no CRM url"):
        load_agent("acme_broken:make")


# -- fitting together ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            {"handlers": {k: v for k, v in SHOP.handlers.items() if k != "lookup_order"}},
            "schemas without a handler: ['lookup_order']",
        ),
        ({"entities": {}}, "x-entity kinds without a resolver: ['order']"),
        ({"policies": {"refund": SHOP.policies["cancel_order"]}}, "policies for unknown tools: ['refund']"),
        ({"replies": {"nap_time": "zzz"}}, "replies for unknown outcomes ['nap_time']"),
        ({"messages": {"teapot": "I am one"}}, "messages for unknown keys ['teapot']"),
        ({"system_prompt": "  "}, "the system prompt is empty"),
        ({"name": "has spaces"}, "the name must match"),
        ({"tools_dir": "/nonexistent/tools"}, "is not a folder"),
        ({"dependencies": {"not an identifier": lambda fleet, own: None}}, "need an identifier as name"),
        ({"progress": {"refund": "Refunding you"}}, "progress words for unknown tools ['refund']"),
        ({"progress": {"lookup_order": 7}}, "progress words that are not text: ['lookup_order']"),
    ],
)
def test_an_agent_that_does_not_fit_together_is_refused_naming_the_problem(change, problem):
    with pytest.raises(AgentError, match=re.escape(problem)):
        dataclasses.replace(SHOP, **change).check()


def test_the_digest_changes_with_the_prompt_or_a_tool_and_only_then(tmp_path):
    same = dataclasses.replace(SHOP, replies={"refusal": "No."})
    assert same.digest == SHOP.digest and re.fullmatch(r"[0-9a-f]{16}", SHOP.digest)
    assert dataclasses.replace(SHOP, system_prompt="You sell bikes.").digest != SHOP.digest
    tools = tmp_path / "tools"
    tools.mkdir()
    for path in Path(SHOP.tools_dir).glob("*.json"):
        (tools / path.name).write_text(path.read_text().replace("Get the full details", "Show the full details"))
    assert dataclasses.replace(SHOP, tools_dir=tools).digest != SHOP.digest


async def test_dependencies_are_made_once_with_the_settings_and_closed_at_shutdown():
    closed = []

    class Crm:
        def __init__(self, url):
            self.url = url

        async def aclose(self):
            closed.append("crm")

    class Ledger:
        def close(self):
            closed.append("ledger")

    agent = dataclasses.replace(
        SHOP, dependencies={"crm": lambda fleet, own: Crm(fleet.listen_host), "books": lambda f, o: Ledger()}
    )
    deps = agent.open_dependencies(Settings(_env_file=None))
    assert deps.crm.url == "127.0.0.1" and deps["books"] is deps.books and sorted(deps) == ["books", "crm"]
    with pytest.raises(AttributeError, match="the agent declares no dependency 'billing'"):
        deps.billing  # noqa: B018
    await deps.aclose()
    assert closed == ["ledger", "crm"]  # in reverse order of opening


def test_a_dependency_that_cannot_be_made_stops_the_start_in_one_line():
    def broken(fleet, own):
        raise ValueError("CRM_URL is not set")

    with pytest.raises(AgentError, match="dependency 'crm' could not be made: ValueError: CRM_URL is not set"):
        dataclasses.replace(SHOP, dependencies={"crm": broken}).open_dependencies(Settings(_env_file=None))


def test_the_agents_reply_texts_replace_the_guards_defaults_and_only_those():
    from roundtrip._guard.replies import POLITE, Replies

    own = Replies.of({"refusal": "Acme cannot help with that."})
    assert own.polite(Outcome.REFUSAL) == "Acme cannot help with that."
    assert own.polite(Outcome.BUDGET) == POLITE[Outcome.BUDGET]
    assert Replies().polite(Outcome.REFUSAL) == POLITE[Outcome.REFUSAL]  # one agent's words are not another's


def test_the_gates_generic_errors_are_the_agents_words():
    assert SHOP.message("lookup_failed").startswith("The order system could not be reached")
    plain = dataclasses.replace(SHOP, messages={})
    assert plain.message("lookup_failed") == GATE_MESSAGES["lookup_failed"]


def test_the_model_default_gives_way_to_roundtrip_model():
    agent = dataclasses.replace(SHOP, model="claude-agent-default")
    assert agent.model_for(Settings(_env_file=None)) == "claude-agent-default"
    assert agent.model_for(Settings(_env_file=None, model="claude-operator")) == "claude-operator"
    assert SHOP.model_for(Settings(_env_file=None)) == Settings.model_fields["model"].default


# -- approvals: configured whenever a rule can hold a call ------------------------------------------------------


def test_approvals_are_configured_whenever_a_rule_of_the_agent_can_hold_a_call(monkeypatch):
    monkeypatch.delenv("ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS", raising=False)
    assert not dataclasses.replace(SHOP).holds_calls()  # the threshold unset: cancel_order never waits
    monkeypatch.setenv("ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS", "5000")
    assert dataclasses.replace(SHOP).holds_calls()
    monkeypatch.delenv("ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS")
    always_asks = dataclasses.replace(
        SHOP, approvals={"escalate_to_human": always("a person decides every escalation")}
    )
    assert always_asks.holds_calls()  # no threshold anywhere, and still a person decides: the defect of issue 19
    production = Settings(
        _env_file=None,
        kafka_bootstrap_servers="kafka:9092",
        **key_settings() | {"decision_verify_keys": DEV_DECISION_VERIFY_KEYS},
    )
    with pytest.raises(
        InsecureConfiguration, match="ROUNDTRIP_DECISION_VERIFY_KEYS holds the published development key"
    ):
        production.refuse_unfit_keys("guard", ("decision_verify_keys",), always_asks.holds_calls())


def test_the_guard_refuses_the_published_decision_key_for_an_agent_that_always_asks(tmp_path):
    (tmp_path / "acme_asks.py").write_text(
        textwrap.dedent("""
        import dataclasses
        from roundtrip import always
        from roundtrip._shop.agent import AGENT as SHOP

        AGENT = dataclasses.replace(SHOP, approvals={"escalate_to_human": always("a person decides every escalation")})
    """)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | {
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "ROUNDTRIP_AGENT": "acme_asks:AGENT",
        "ROUNDTRIP_ENV": "production",
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "ROUNDTRIP_STATE_DIR": str(tmp_path / "state"),
    }
    batch = {k: v for k, v in key_environment().items() if "BATCH" in k}  # its own batch pair, the published decisions
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "run", "guard"],
        capture_output=True,
        text=True,
        env=env | batch,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: guard refuses to start: ROUNDTRIP_DECISION_VERIFY_KEYS"), (
        done.stderr
    )
    assert "the agent has approval rules" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_bad_agent_string_stops_a_service_with_one_line_and_status_1(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | {
        "ROUNDTRIP_AGENT": "acme_missing_pkg:AGENT",
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "run", "gate"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: ROUNDTRIP_AGENT='acme_missing_pkg:AGENT': cannot import acme_missing_pkg: No module named "
        "'acme_missing_pkg'"
    ]


# -- the services name no shop ------------------------------------------------------------------------------------

FOLDERS = ("_kernel", "_gateway", "_model", "_guard", "_gate", "_executor")
# The shop's vocabulary. "order" alone stays: it is the kernel's word for sequence (key order, tool_use order);
# the "cancel" words that remain are the kernel's turn cancellation (CancelTurn, the outcome `cancelled`) and the
# batch lane's (a Message Batch cancelled once its turns ended: CALL_CANCELLED).
SHOP_WORDS = re.compile(
    r"shop|\borders\b|order[_ ]ids?\b|order system|order's|cancel_order|cancel_above|refund", re.IGNORECASE
)
CANCEL_WORDS = re.compile(r"\w*cancel\w*", re.IGNORECASE)
TURN_CANCELLATION = {
    "cancel",
    "cancels",
    "cancelled",
    "cancelling",
    "CANCELLED",
    "CancelTurn",
    "CancelledError",
    "cancel_on_revoke",
    "_cancel_on_revoke",
    "on_cancel",
    "on_cancel_turn",
    "CALL_CANCELLED",
}


def test_the_kernel_and_the_five_services_name_no_shop_order_or_cancellation_of_one():
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / "services" / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                words = SHOP_WORDS.findall(line)  # no exemption: the shop's settings are its agent's own
                words += [w for w in CANCEL_WORDS.findall(line) if w not in TURN_CANCELLATION]
                if words:
                    found.append(f"{relative}:{number}: {words}")
    assert found == []
    for folder in FOLDERS:  # nor does any import the demo shop
        for path in (ROOT / "services" / folder).rglob("*.py"):
            assert "roundtrip._shop" not in path.read_text(encoding="utf-8"), path


def test_roundtrip_config_shows_the_agents_own_settings_and_warns_once_its_rule_can_hold_a_call(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | {
        "ROUNDTRIP_STATE_DIR": str(tmp_path)
    }
    quiet = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "config"], capture_output=True, text=True, env=env, timeout=60
    )
    held = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env | {"ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS": "5000"},
    )
    assert quiet.returncode == held.returncode == 0
    assert "# the agent's own settings (support-agent)" in held.stdout
    assert re.search(r"(?m)^ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS +5000$", held.stdout)
    assert "ROUNDTRIP_DECISION_SIGNING_KEY" in held.stderr and "ROUNDTRIP_DECISION_SIGNING_KEY" not in quiet.stderr


def test_an_invalid_setting_of_the_agents_own_names_the_variable_as_its_user_spells_it():
    from pydantic import Field
    from pydantic_settings import BaseSettings, SettingsConfigDict

    class Nordlicht(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="ROUNDTRIP_NORDLICHT_", extra="ignore")
        backend_url: str
        region: str = Field("nord", validation_alias="NORDLICHT_REGION")
        retries: int = 3

    os.environ.pop("ROUNDTRIP_NORDLICHT_BACKEND_URL", None)
    problems = dataclasses.replace(SHOP, settings=Nordlicht).problems()
    assert problems == ["invalid settings: ROUNDTRIP_NORDLICHT_BACKEND_URL: Field required"]
    os.environ.update(ROUNDTRIP_NORDLICHT_BACKEND_URL="http://x", ROUNDTRIP_NORDLICHT_RETRIES="many")
    try:
        (said,) = dataclasses.replace(SHOP, settings=Nordlicht).problems()
    finally:
        for name in ("ROUNDTRIP_NORDLICHT_BACKEND_URL", "ROUNDTRIP_NORDLICHT_RETRIES"):
            os.environ.pop(name)
    assert said.startswith("invalid settings: ROUNDTRIP_NORDLICHT_RETRIES: ")
    from roundtrip._kernel.settings.checks import env_name_in

    assert env_name_in(Nordlicht)("region") == "NORDLICHT_REGION"


def test_up_refuses_a_bad_agent_setting_before_the_broker_starts(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | {
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS": "lots",
    }
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "up"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().startswith(
        "error: agent 'support-agent': invalid settings: ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS"
    )
    assert "starting the fleet" not in done.stdout and not (tmp_path / "logs").exists()  # nothing was started


def test_the_up_banners_example_is_the_agents_own():
    from roundtrip._cli.up import _ready
    from roundtrip._kernel.settings import Settings

    settings = Settings()
    assert 'ask "cancel my last order" --customer cus_1001\n' in _ready(SHOP, settings)
    own = dataclasses.replace(SHOP, example_ask="Welche Anschlüsse habe ich?", example_customer="cus_2001")
    assert 'ask "Welche Anschlüsse habe ich?" --customer cus_2001\n' in _ready(own, settings)
    assert "cancel" not in _ready(dataclasses.replace(SHOP, example_ask="", example_customer=""), settings)


def test_with_no_key_the_banner_asks_with_the_agents_example_script_and_with_a_key_without():
    from roundtrip._cli.up import _ready
    from roundtrip._kernel.settings import Settings

    script = [
        [{"type": "tool_use", "name": "lookup_order", "input": {"order_id": "ord_a1000001"}}],
        [{"type": "text", "text": "Found it."}],
    ]
    own = dataclasses.replace(SHOP, example_ask="where is ord_a1000001?", example_script=script)
    assert 'ask "where is ord_a1000001?" --customer cus_1001 --persona script:example\n' in _ready(own, Settings())
    keyed = Settings(anthropic_api_key="sk-ant-test")
    assert 'ask "where is ord_a1000001?" --customer cus_1001\n' in _ready(own, keyed)
    assert "--persona" not in _ready(SHOP, Settings())  # the simulator's personas play the demo shop


def test_an_example_script_that_cannot_play_or_calls_another_tool_is_a_problem_of_the_agent():
    good = [
        [{"type": "tool_use", "name": "lookup_order", "input": {"order_id": "ord_a1000001"}}],
        [{"type": "text", "text": "Found it."}],
    ]
    assert dataclasses.replace(SHOP, example_script=good).problems() == []
    unknown = [[{"type": "tool_use", "name": "renew_loan", "input": {}}]]
    assert dataclasses.replace(SHOP, example_script=unknown).problems() == [
        "example_script calls renew_loan, not a tool of this agent"
    ]
    (broken,) = dataclasses.replace(SHOP, example_script=[{"content": []}]).problems()
    assert broken.startswith("example_script response 1: expected a text, a list of content blocks")
