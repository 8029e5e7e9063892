"""`roundtrip` tells the truth: unknown names are errors listing the known ones, `ask` fails unless the model answered,
and what it prints reads right (help without `<bool>` or cut paragraphs, "1 step", no empty `detail=`, whole ids in the
approvals table)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import roundtrip._cli as cli
from roundtrip._cli import approvals, common, following, observe
from roundtrip._cli.main import app
from roundtrip._kernel.settings import get_settings
from roundtrip._kernel.wire import topology
from roundtrip._kernel.wire.events import Outcome, SupportReply, Usage
from roundtrip._simulator import running_simulator
from roundtrip._simulator.personas import NAMES
from roundtrip._simulator.scripted import Scripts, parse_script


def _reply(outcome: Outcome, steps: int = 4, reason: str | None = None) -> SupportReply:
    return SupportReply(
        request_id="req_1",
        conversation_id="conv_1",
        customer_id="cus_1001",
        turn_id="turn_1",
        text="Sorry.",
        outcome=outcome,
        steps=steps,
        usage=Usage(input_tokens=10, output_tokens=2),
        cost_usd=0.001,
        trace_id="ab" * 16,
        reason=reason,
    )


@pytest.fixture
def never_asked(monkeypatch):
    """`ask` and `lag` must refuse before they talk to Kafka: reaching it fails the test."""

    async def reached(*args, **kwargs):
        raise AssertionError("the fleet was called")

    monkeypatch.setattr(following, "ask", reached)
    monkeypatch.setattr(following, "chat", reached)
    monkeypatch.setattr(observe, "show_lag", reached)


def test_an_unknown_group_is_an_error_listing_the_fleets_groups(never_asked):
    result = CliRunner().invoke(app, ["lag", "--group", "nosuch"])
    assert result.exit_code != 0
    assert "unknown consumer group 'nosuch'" in result.output
    squeezed = "".join(result.output.replace("│", "").split())  # the error panel wraps anywhere
    assert all(group in squeezed for group in topology.groups(""))


def test_a_known_group_with_or_without_the_prefix_is_taken(monkeypatch):
    asked = []

    async def show_lag(settings, group, as_json, watch):
        asked.append(group)
        return 0

    monkeypatch.setattr(observe, "show_lag", show_lag)
    for group in ("executor", "roundtrip-executor", "roundtrip-gateway-replies"):
        assert CliRunner().invoke(app, ["lag", "--group", group]).exit_code == 0
    assert asked == ["executor", "roundtrip-executor", "roundtrip-gateway-replies"]


def test_a_prefixed_fleets_groups_are_its_own(monkeypatch, never_asked):
    monkeypatch.setenv("ROUNDTRIP_TOPIC_PREFIX", "prod.")
    result = CliRunner().invoke(app, ["lag", "--group", "nosuch"])
    squeezed = "".join(result.output.replace("│", "").split())
    assert result.exit_code != 0 and all(group in squeezed for group in topology.groups("prod."))
    asked = []

    async def show_lag(settings, group, as_json, watch):
        asked.append((settings.topic_prefix, group))
        return 0

    monkeypatch.setattr(observe, "show_lag", show_lag)
    for group in ("executor", "roundtrip-executor", "prod.roundtrip-executor"):
        assert CliRunner().invoke(app, ["lag", "--group", group]).exit_code == 0
    assert asked == [("prod.", "executor"), ("prod.", "roundtrip-executor"), ("prod.", "prod.roundtrip-executor")]


@pytest.mark.parametrize("command", [["ask", "hello", "--customer", "cus_1001"], ["chat", "--customer", "cus_1001"]])
def test_an_unknown_persona_is_refused_before_any_model_call_with_the_personas(never_asked, command):
    result = CliRunner().invoke(app, [*command, "--persona", "nosuch"])
    assert result.exit_code != 0
    assert "unknown persona 'nosuch'" in result.output
    flat = " ".join(result.output.replace("│", " ").split())
    assert all(name in flat for name in NAMES)


def test_ask_exits_non_zero_with_a_clear_line_when_the_guard_stopped_the_turn(monkeypatch):
    async def ask(*args, **kwargs):
        return following.show_reply(_reply(Outcome.REPEATED_CALL))

    monkeypatch.setattr(following, "ask", ask)
    result = CliRunner().invoke(app, ["ask", "where is my order?", "--customer", "cus_1001", "--persona", "stubborn"])
    assert result.exit_code == 3
    assert "the turn did not end with the model's answer: repeated_call (exit code 3)" in result.output


def test_every_outcome_has_its_documented_exit_code():
    assert set(following.EXIT_CODES) == set(Outcome)
    assert following.EXIT_CODES[Outcome.END_TURN] == 0 and all(
        c > 2 for o, c in following.EXIT_CODES.items() if o is not Outcome.END_TURN
    )
    shown = " ".join(CliRunner().invoke(app, ["ask", "--help"]).output.replace("│", " ").split())
    for outcome in following.EXIT_CODES:
        assert outcome.value in shown, outcome
    assert "Exit codes: 0 the model answered (end_turn); 1 no reply within --timeout" in shown


def test_a_refused_request_shows_its_reason_and_one_step_is_one_step(capsys):
    assert following.show_reply(_reply(Outcome.INVALID_REQUEST, steps=0, reason="customer_id: Field required")) == 6
    assert following.show_reply(_reply(Outcome.END_TURN, steps=1)) == 0
    out = capsys.readouterr().out
    assert "refused: customer_id: Field required" in out
    assert "1 step," in out and "1 steps" not in out and "0 steps" in out


def test_flags_show_no_value_type_in_help():
    for command in (["--help"], ["lag", "--help"], ["approvals", "--help"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 0 and "<bool>" not in result.output
    assert "<float>" in CliRunner().invoke(app, ["lag", "--help"]).output  # options that take a value still say which


def test_help_paragraphs_wrap_only_at_the_terminals_width():
    result = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "300"}, terminal_width=300)
    assert result.exit_code == 0
    assert (
        "Supervises them: a process that dies (any service, a replica, the simulator, the shop or the embedded broker) "
        "is restarted with exponential backoff"
    ) in result.output


def test_the_trace_view_shows_no_empty_attribute(tmp_path, capsys):
    from roundtrip._kernel.settings import Settings

    path = tmp_path / "spans.jsonl"
    span = {
        "trace_id": "ab" * 16,
        "span_id": "1" * 16,
        "parent_id": None,
        "name": "guard.decide",
        "service": "roundtrip-guard",
        "kind": "INTERNAL",
        "start_ns": 0,
        "end_ns": 1_000_000,
        "status": "UNSET",
        "events": [],
        "attributes": {"roundtrip.turn_id": "turn_9", "roundtrip.outcome": "end_turn", "roundtrip.detail": ""},
    }
    path.write_text(json.dumps(span) + "\n")
    settings = Settings(_env_file=None, span_file=path, otlp_endpoint=None, jaeger_query_url=None)
    assert observe.show_trace(settings, "turn_9") == 0
    out = capsys.readouterr().out
    assert "outcome=end_turn" in out and "detail=" not in out


async def test_the_approvals_table_never_cuts_an_id(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from roundtrip._kernel.settings import Settings
    from roundtrip._kernel.wire.events import Turn
    from tests.approval_rows import list_these_approvals, pending_approval

    turn = Turn(
        turn_id="turn_" + "7" * 24,
        request_id="req_1",
        conversation_id="conv_1",
        customer_id="cus_1001",
        trace_id="cd" * 16,
    )
    request = pending_approval(turn, "cancel_order", {"order_id": "ord_a1000003"}, "a long reason " * 8)
    list_these_approvals(monkeypatch, [request])
    out = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=out, width=120, highlight=False))
    (tmp_path / "ledger.db").touch()
    settings = Settings(_env_file=None, state_dir=tmp_path)
    assert await approvals.list_approvals(settings, everything=False, limit=10) == 0
    shown = out.getvalue()
    assert request.approval_id in shown and turn.turn_id in shown and turn.trace_id in shown


def test_the_unrelated_roundtrip_distribution_beside_ours_is_refused_in_one_line(monkeypatch, capsys):
    """On PyPI `roundtrip` is another project with a top-level package of the same name: the CLI says so and stops."""
    from importlib import metadata

    class Unrelated:
        version = "0.1.1"

    def distribution(name):
        if name == "roundtrip":
            return Unrelated()
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "distribution", distribution)
    with pytest.raises(SystemExit) as stopped:
        cli.entry()
    assert stopped.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "unrelated distribution 'roundtrip' 0.1.1" in line and "pip uninstall roundtrip" in line
    assert cli.clash() is not None
    monkeypatch.undo()
    assert cli.clash() is None  # this venv has roundtrip-fleet only


def _user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("ROUNDTRIP_")}


def test_python_m_roundtrip_is_the_cli_and_beside_a_clone_named_roundtrip_says_the_cause_and_fix_in_one_line(tmp_path):
    """A clone of the project named roundtrip is, to a Python started in its parent folder, a folder named roundtrip
    without __init__.py: imported first, it hides the editable install, and `from roundtrip import Agent` would fail
    with `cannot import name 'Agent' from 'roundtrip' (unknown location)`."""
    clone = tmp_path / "roundtrip"
    (clone / "services").mkdir(parents=True)
    inside = subprocess.run(
        [sys.executable, "-m", "roundtrip", "--help"], cwd=clone, env=_user_env(), capture_output=True, text=True
    )
    assert inside.returncode == 0 and "python -m roundtrip" in inside.stdout, inside.stderr
    beside = subprocess.run(
        [sys.executable, "-m", "roundtrip", "ask", "hi"], cwd=tmp_path, env=_user_env(), capture_output=True, text=True
    )
    assert beside.returncode == 1
    assert beside.stderr.splitlines() == [cli.hidden_line(clone.resolve(), "this command")]
    assert f"run it from another folder, e.g. cd {clone.resolve()}" in beside.stderr


def test_up_beside_a_clone_named_roundtrip_refuses_in_one_line_before_it_starts_anything(tmp_path, monkeypatch):
    """The fleet's processes start as `python -m` in up's folder, so they would import the clone as `roundtrip`."""
    monkeypatch.chdir(tmp_path)
    assert cli.hiding(tmp_path) is None
    (tmp_path / "roundtrip").mkdir()
    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", str(tmp_path / "state"))
    get_settings.cache_clear()
    result = CliRunner().invoke(app, ["up"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [cli.hidden_line((tmp_path / "roundtrip").resolve(), "the fleet's processes")]
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("persona", ["script:renew", "script:example", "direct"])
def test_ask_takes_every_persona_the_simulator_plays_scripts_included(monkeypatch, tmp_path, persona):
    asked = []

    async def ask(settings, text, customer, persona, conversation, timeout, stream):
        asked.append(persona)
        return 0

    monkeypatch.setattr(following, "ask", ask)
    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", str(tmp_path))
    # script:example of the shop (it has none): nothing is put, the simulator has it loaded some other way
    scripts = Scripts({"renew": parse_script("renew", ["Renewed."]), "example": parse_script("example", ["Hi."])})
    with running_simulator(scripts=scripts) as url:
        monkeypatch.setenv("ROUNDTRIP_SIMULATOR_PORT", url.rsplit(":", 1)[1])
        result = CliRunner().invoke(app, ["ask", "renew my loan", "--customer", "cus_1", "--persona", persona])
    assert result.exit_code == 0, result.output
    assert asked == [persona]


@pytest.mark.parametrize("command", [["ask", "hello"], ["chat"]])
def test_a_script_the_simulator_has_not_loaded_is_refused_before_the_turn_naming_those_it_has(
    monkeypatch, tmp_path, never_asked, command
):
    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", str(tmp_path))
    with running_simulator(scripts=Scripts({"renew": parse_script("renew", ["Renewed."])})) as url:
        monkeypatch.setenv("ROUNDTRIP_SIMULATOR_PORT", url.rsplit(":", 1)[1])
        result = CliRunner().invoke(app, [*command, "--customer", "cus_1", "--persona", "script:renw"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "error: no simulator script 'renw' (loaded: renew)"


def test_an_eval_case_naming_a_script_the_simulator_has_not_loaded_is_refused_before_any_case_in_asks_words(
    monkeypatch, tmp_path
):
    import roundtrip._cli.evals.runner as eval_runner

    async def never(*args, **kwargs):
        raise AssertionError("a case was run")

    monkeypatch.setattr(eval_runner, "run_suite", never)
    (tmp_path / "cases").mkdir()
    case = {"customer": "cus_1", "message": "renew my loan", "persona": "script:renw"}
    (tmp_path / "cases" / "renew.json").write_text(json.dumps(case))
    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", str(tmp_path))
    with running_simulator(scripts=Scripts({"renew": parse_script("renew", ["Renewed."])})) as url:
        monkeypatch.setenv("ROUNDTRIP_SIMULATOR_PORT", url.rsplit(":", 1)[1])
        result = CliRunner().invoke(app, ["eval", "run", str(tmp_path / "cases")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "error: no simulator script 'renw' (loaded: renew)"


def test_a_script_persona_with_no_simulator_answering_is_refused_in_one_line(monkeypatch, tmp_path, never_asked):
    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("ROUNDTRIP_SIMULATOR_PORT", "9")
    result = CliRunner().invoke(app, ["ask", "hi", "--customer", "cus_1", "--persona", "script:renew"])
    assert result.exit_code == 2 and "does not list its scripts" in result.output.strip().splitlines()[-1]


def test_a_script_persona_without_a_name_is_refused(never_asked):
    result = CliRunner().invoke(app, ["ask", "hello", "--customer", "cus_1001", "--persona", "script:"])
    assert result.exit_code != 0 and "unknown persona 'script:'" in result.output


def test_a_second_up_in_a_folder_a_fleet_holds_refuses_before_it_says_it_starts(monkeypatch, tmp_path):
    from roundtrip._fleet.launcher import Fleet
    from roundtrip._fleet.supervisor import RUNNING_FILE

    def started(self):
        raise AssertionError("a second fleet was started")

    monkeypatch.setattr(Fleet, "start", started)
    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", str(tmp_path))
    get_settings.cache_clear()  # up reads the settings once; an earlier test's are cached
    with subprocess.Popen(["sleep", "60"]) as holder:  # the first fleet's process, alive
        try:
            (tmp_path / RUNNING_FILE).write_text(f"{holder.pid}\n")
            result = CliRunner().invoke(app, ["up"])
        finally:
            holder.kill()
    get_settings.cache_clear()
    assert result.exit_code == 1 and "starting the fleet" not in result.output
    assert f"a fleet is already running in {tmp_path.resolve()} (pid {holder.pid})" in result.output
