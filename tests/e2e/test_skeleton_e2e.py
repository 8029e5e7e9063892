"""The skeleton `roundtrip agent init` writes, run by the whole fleet (issue 29, item 2): its policy reads what its
handler changed earlier in the turn. In the fleet the gate (the policy) and the executor (the handler) are separate
processes, each with its own instance of the backend; the skeleton's backend is a SQLite file both open, so the
second close of the same ticket is refused there as it is in run_turn (tests/unit/test_harness.py shows the
in-memory backend letting it through in the harness, as it did in the fleet).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sqlite3
import subprocess
import sys
import uuid

import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from tests.e2e.conftest import FleetClient, fleet_env
from tests.signing import key_settings
from tests.skeletons import agent_files

CLOSE = {"type": "tool_use", "name": "close_ticket", "input": {"ticket_id": "T-1001", "note": "fixed"}}
SCRIPTS = {"twice": [[CLOSE], [CLOSE], [{"type": "text", "text": "T-1001 is closed."}]]}


@pytest.fixture(scope="module")
def skeleton_fleet(kafka_bootstrap, tmp_path_factory):
    source = tmp_path_factory.mktemp("desk")
    for relative, text in agent_files("desk-e2e").items():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_text(text)
    state = tmp_path_factory.mktemp("desk-fleet")
    (state / "scripts.json").write_text(json.dumps(SCRIPTS))
    values = dict(
        agent="desk_e2e.agent:AGENT",
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=f"sk{uuid.uuid4().hex[:6]}.",
        state_dir=state,
        simulator_port=free_port(),
        partitions=1,
        simulator_script=state / "scripts.json",
        **key_settings("sk1"),  # fresh pairs, never the published development keys
    )
    path = os.pathsep.join(p for p in (str(source), os.environ.get("PYTHONPATH", "")) if p)
    sys.path.insert(0, str(source))  # the launcher finds the agent too (the demo shop or not)
    try:
        with Fleet(Settings(**values), env={**fleet_env(**values), "PYTHONPATH": path}, executor_replicas=1) as fleet:
            yield fleet
    finally:
        sys.path.remove(str(source))


async def test_the_skeletons_policy_sees_what_its_handler_changed_across_the_fleets_processes(skeleton_fleet):
    client = FleetClient(skeleton_fleet.settings)
    await client.start()
    try:
        request_id = await client.ask("Close T-1001. And close T-1001.", "cus_1", persona="script:twice")
        reply = await client.reply(request_id, timeout=90)
    finally:
        await client.stop()
    assert reply.outcome == "end_turn" and reply.text == "T-1001 is closed."
    calls = [c for batch in client.of_turn(topics.TOOL_BATCHES, request_id) for c in batch["calls"]]
    assert [c["approved"] for c in calls] == [True, False], calls  # the gate's process saw the executor's close
    assert "already closed" in calls[1]["error"]
    with sqlite3.connect(skeleton_fleet.settings.state_dir / "desk_e2e.db") as db:
        assert db.execute("SELECT status, note FROM tickets WHERE ticket_id = 'T-1001'").fetchone() == (
            "closed",
            "fixed",
        )


def _cli(fleet, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", *args],
        env={**os.environ, **fleet.env},
        capture_output=True,
        text=True,
        timeout=300,
    )


async def test_with_no_key_the_banners_example_plays_the_agents_script_and_calls_its_tool(skeleton_fleet):
    from desk_e2e.agent import AGENT  # the fixture put the skeleton on the import path

    from roundtrip._cli.up import _ready

    line = next(line for line in _ready(AGENT, skeleton_fleet.settings).splitlines() if " ask " in line)
    words = shlex.split(line)
    assert words[words.index("--persona") + 1] == "script:example"
    asked = await asyncio.to_thread(_cli, skeleton_fleet, *words[words.index("ask") :])
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "calls get_ticket" in asked.stdout and "gate  get_ticket: approved" in asked.stdout, asked.stdout
    assert "Here is ticket T-1001 as the desk has it." in asked.stdout


async def test_the_skeletons_two_eval_cases_pass_through_the_fleet(skeleton_fleet, tmp_path):
    for relative, text in agent_files("desk-e2e").items():
        if relative.startswith("evals/"):
            (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / relative).write_text(text)
    ran = await asyncio.to_thread(_cli, skeleton_fleet, "eval", "run", str(tmp_path / "evals"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 passed, 0 failed, 0 skipped of 2 cases" in ran.stdout


CLOSE_OWN = {
    "description": "A customer closes their own open ticket: a case that changes the desk's data.",
    "customer": "cus_1",
    "message": "Please close T-1001, it is fixed.",
    "script": [[CLOSE], "T-1001 is closed."],
    "expect": {"outcome": "end_turn", "tools_called": ["close_ticket"], "refused": []},
}


async def test_an_eval_that_changes_data_passes_run_after_run_with_fresh_and_not_without(skeleton_fleet, tmp_path):
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "close-own.json").write_text(json.dumps(CLOSE_OWN))
    suite = str(tmp_path / "evals")
    for run in range(3):
        ran = await asyncio.to_thread(_cli, skeleton_fleet, "eval", "run", "--fresh", suite)
        assert ran.returncode == 0, f"run {run + 1}: {ran.stdout + ran.stderr}"
        assert "agent desk-e2e's backends reset (--fresh)" in ran.stdout
    # the reason it is needed: the ticket the last run closed is refused as already closed
    again = await asyncio.to_thread(_cli, skeleton_fleet, "eval", "run", suite)
    assert again.returncode == 1 and "already closed" in again.stdout, again.stdout + again.stderr
