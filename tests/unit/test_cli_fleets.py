"""From an agent's folder the CLI finds the fleet `up` marked for it (services/_cli/fleets.py), says which fleet and
agent it reads, and `eval run` refuses a suite of another agent than the one that fleet runs."""

from __future__ import annotations

import os
from typing import Any

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

import roundtrip._cli.evals.runner as eval_runner
from roundtrip._cli import common, up
from roundtrip._cli.fleets import MARKER, agent_project, declared_agents, mark, marked
from roundtrip._cli.main import app
from roundtrip._fleet import state as fleet_state
from roundtrip._fleet.supervisor import claim_folder, release_folder
from roundtrip._kernel.settings import Settings, get_settings
from tests.skeletons import agent_files


@pytest.fixture(autouse=True)
def shell_kept():
    """A command adopts its fleet's settings into os.environ itself: the next test gets this shell back."""
    kept = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(kept)
    get_settings.cache_clear()


@pytest.fixture
def desk(tmp_path, monkeypatch):
    """A fresh `agent init` folder, importable as its editable install makes it."""
    folder = tmp_path / "desk"
    for relative, text in agent_files("desk").items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """A fleet running in its own state folder (this process holds it), with the agent `up` recorded."""
    state = tmp_path / "fleet-state"
    state.mkdir()
    claimed = claim_folder(state)

    def running(agent: str):
        fleet_state.record(state, {"ROUNDTRIP_AGENT": agent, "ROUNDTRIP_TOPIC_PREFIX": "marked."})
        return state

    monkeypatch.delenv("ROUNDTRIP_STATE_DIR", raising=False)
    yield running
    release_folder(claimed)
    fleet_state.forget(state)
    get_settings.cache_clear()


def test_up_marks_where_it_started_and_its_agents_project_and_a_command_below_finds_it(desk, tmp_path, monkeypatch):
    started = tmp_path / "checkout"
    started.mkdir()
    monkeypatch.chdir(started)
    assert agent_project("desk.agent:AGENT") == desk.resolve()
    up._mark_folders(Settings(state_dir=tmp_path / "fleet-state", agent="desk.agent:AGENT"))
    assert (started / MARKER).is_file() and (desk / MARKER).is_file()
    assert marked(desk / "evals") == (tmp_path / "fleet-state").resolve() == marked(started)
    assert marked(tmp_path) is None
    assert mark([tmp_path / "missing"], tmp_path) == []  # a folder that cannot take it is left alone


def test_a_command_in_the_agents_folder_reads_the_marked_fleet_and_says_which_and_its_agent(
    desk, fleet, monkeypatch, capsys
):
    state = fleet("desk")
    mark([desk], state)
    monkeypatch.chdir(desk / "evals")
    settings = common.fleet_settings(None)
    assert settings.state_dir == state.resolve() and settings.topic_prefix == "marked."
    said = capsys.readouterr().err
    assert f"the fleet running in {state.resolve()} (pid {os.getpid()}): agent desk, its settings" in said


def test_a_stopped_fleets_marker_is_not_followed(desk, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ROUNDTRIP_STATE_DIR", raising=False)
    mark([desk], tmp_path / "stopped")
    monkeypatch.chdir(desk)
    assert common.fleet_settings(None).state_dir != (tmp_path / "stopped").resolve()
    get_settings.cache_clear()


def test_eval_refuses_the_cases_of_another_agent_than_the_fleet_runs(desk, fleet, monkeypatch):
    assert declared_agents(desk / "evals") == (desk / "pyproject.toml", ["desk"])
    state = fleet("roundtrip._shop.agent:AGENT")  # the fleet runs the demo shop
    mark([desk], state)
    monkeypatch.chdir(desk)

    async def never(*args, **kwargs):
        raise AssertionError("the cases were run")

    monkeypatch.setattr(eval_runner, "run_suite", never)
    result = CliRunner().invoke(app, ["eval", "run", "evals"])
    assert result.exit_code == 2
    assert (
        f"error: the cases in evals are agent desk's ({desk / 'pyproject.toml'}), but the fleet of {state.resolve()} "
        "runs agent support-agent" in " ".join(result.output.split())
    )


def _suite(tmp_path):
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "hi.json").write_text('{"customer": "cus_1", "message": "hi", "script": ["Hello."]}')
    return str(tmp_path / "cases")


@pytest.mark.parametrize(
    ("reset", "said", "code"),
    [
        (None, "agent support-agent has no reset hook (Agent(reset=...)), so --fresh cannot", 2),
        ("raises", "agent support-agent's reset failed: RuntimeError: desk away", 2),
        ("async", "agent support-agent's backends reset (--fresh)", 0),
    ],
)
def test_eval_fresh_calls_the_agents_reset_before_any_case_or_refuses_in_one_line(
    monkeypatch, tmp_path, reset, said, code
):
    import dataclasses

    import roundtrip._cli.common as cli_common
    from roundtrip._shop.agent import AGENT

    calls: list[str] = []

    async def async_reset(fleet_settings, own):
        calls.append("reset")

    def raising(fleet_settings, own):
        raise RuntimeError("desk away")

    hook = {None: None, "raises": raising, "async": async_reset}[reset]
    monkeypatch.setattr(cli_common, "checked_agent", lambda settings: dataclasses.replace(AGENT, reset=hook))

    async def run_suite(*args, **kwargs):
        calls.append("cases")
        return []

    monkeypatch.setattr(eval_runner, "run_suite", run_suite)
    monkeypatch.setattr("roundtrip._cli.evals._report", lambda *args: None)
    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", str(tmp_path / "none"))
    result = CliRunner().invoke(app, ["eval", "run", "--fresh", _suite(tmp_path)])
    assert result.exit_code == code and said in " ".join(result.output.split()), result.output
    assert calls == (["reset", "cases"] if code == 0 else [])


def test_eval_fleet_names_the_fleet_to_run_through_from_any_folder(desk, fleet, tmp_path, monkeypatch):
    state = fleet("desk.agent:AGENT")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no marker here or above

    async def run_suite(settings, *args, **kwargs):
        assert settings.state_dir == state.resolve() and settings.topic_prefix == "marked."
        return []

    monkeypatch.setattr(eval_runner, "run_suite", run_suite)
    monkeypatch.setattr("roundtrip._cli.evals._report", lambda *args: None)
    result = CliRunner().invoke(app, ["eval", "run", "--fleet", str(state), str(desk / "evals")])
    assert result.exit_code == 0, result.output
    assert f"the fleet running in {state.resolve()} (pid {os.getpid()}): agent desk.agent:AGENT" in result.output
    assert "cases against agent desk" in result.output


# every command that talks to a running fleet, with what it needs besides --fleet (SUITE: a folder of one case)
TALK_TO_A_FLEET = {
    ("ask",): ["hi", "--customer", "cus_1"],
    ("chat",): ["--customer", "cus_1"],
    ("turns",): [],
    ("turns", "cancel"): ["turn_1"],
    ("approvals",): [],
    ("approvals", "approve"): ["ap_1"],
    ("approvals", "deny"): ["ap_1", "--reason", "no"],
    ("conversations",): [],
    ("conversations", "forget"): ["conv_1"],
    ("trace",): ["turn_1"],
    ("dead-letters",): [],
    ("lag",): [],
    ("console",): [],
    ("config",): [],
    ("eval", "run"): ["SUITE"],
    ("eval", "record"): ["conv_1"],
    ("versions",): [],
    ("versions", "ramp"): ["v2", "10%"],
    ("versions", "drain"): ["v2"],
}
# what starts or sets up a fleet with this shell's settings, or needs none
NOT_A_RUNNING_FLEETS = {
    ("up",),
    ("run",),
    ("topics", "create"),
    ("topics", "wait"),
    ("broker", "fetch"),
    ("broker", "run"),
    ("db", "upgrade"),
    ("db", "current"),
    ("db", "roles"),
    ("agent", "check"),
    ("agent", "init"),
    ("keys",),
    ("contracts",),
    ("acls",),
}


def _commands(group: TyperGroup, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every command of the CLI by its words; a group that runs without a subcommand (`turns`) is one too."""
    found: dict[tuple[str, ...], Any] = {}
    for name, command in group.commands.items():
        if not isinstance(command, TyperGroup) or command.invoke_without_command:
            found[(*path, name)] = command
        if isinstance(command, TyperGroup):
            found |= _commands(command, (*path, name))
    return found


def test_every_command_that_talks_to_a_running_fleet_takes_fleet():
    commands = _commands(typer.main.get_command(app))
    assert set(commands) == set(TALK_TO_A_FLEET) | NOT_A_RUNNING_FLEETS, (
        "a command was added or removed: list it in TALK_TO_A_FLEET (with --fleet) or NOT_A_RUNNING_FLEETS"
    )
    options = {words: {o for p in command.params for o in p.opts} for words, command in commands.items()}
    assert [" ".join(w) for w in TALK_TO_A_FLEET if "--fleet" not in options[w]] == []


@pytest.fixture
def reached(monkeypatch):
    """The settings each command gets from common.fleet_settings (the real one); the command stops there, exit 0."""
    got = []
    real = common.fleet_settings

    def then_stop(fleet):
        got.append(real(fleet))
        raise typer.Exit(0)

    monkeypatch.setattr(common, "fleet_settings", then_stop)
    return got


@pytest.mark.parametrize("words", sorted(TALK_TO_A_FLEET), ids=" ".join)
def test_fleet_names_the_fleet_each_command_talks_to_from_any_folder_and_it_says_which_and_its_agent(
    words, fleet, reached, tmp_path, monkeypatch
):
    state = fleet("desk")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no marker here or above, no fleet in ./.roundtrip
    args = [_suite(tmp_path) if a == "SUITE" else a for a in TALK_TO_A_FLEET[words]]
    result = CliRunner().invoke(app, [*words, *args, "--fleet", str(state)])
    assert result.exit_code == 0, result.output
    assert [(s.state_dir, s.topic_prefix) for s in reached] == [(state.resolve(), "marked.")]
    assert f"the fleet running in {state.resolve()} (pid {os.getpid()}): agent desk, its settings" in result.output


@pytest.mark.parametrize("words", [("turns", "cancel", "turn_1"), ("approvals", "approve", "ap_1")], ids=" ".join)
def test_a_groups_fleet_counts_for_its_subcommand(words, fleet, reached, tmp_path, monkeypatch):
    state = fleet("desk")
    monkeypatch.chdir(tmp_path)
    group, *rest = words
    result = CliRunner().invoke(app, [group, "--fleet", str(state), *rest])
    assert result.exit_code == 0, result.output
    assert [s.state_dir for s in reached] == [state.resolve()]


def test_a_fleet_folder_that_does_not_exist_is_refused(reached, tmp_path):
    result = CliRunner().invoke(app, ["turns", "--fleet", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "does not exist" in " ".join(result.output.replace("│", " ").split())
    assert reached == []


def test_with_no_fleet_running_a_command_says_so_and_the_agent_of_this_shell(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("ROUNDTRIP_AGENT", "desk")
    get_settings.cache_clear()
    common.fleet_settings(None)
    said = capsys.readouterr().err
    assert f"no fleet runs in {tmp_path.resolve()} (roundtrip up records it there; --fleet STATE_DIR names" in said
    assert "reading this shell's settings: agent desk" in said
