"""`roundtrip up` supervises: an executor SIGKILLed while turns are in flight is reported and
restarted, the rest of the fleet keeps running, and every turn in flight still gets exactly one reply;
a SIGKILLed embedded broker comes back on its data and the fleet answers again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roundtrip._broker.embedded import probe_metadata
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from tests.e2e.conftest import FleetClient, conversations_covering
from tests.e2e.up_process import pids_of, roundtrip_up

PARTITIONS = 4  # of every topic, turn.tool_batches included: one turn per partition below
LATENCY_MS = 1500  # each model call takes this long, so the turns are in flight when the executor dies


@pytest.fixture
def up(tmp_path):
    env = {
        "ROUNDTRIP_PARTITIONS": str(PARTITIONS),
        "ROUNDTRIP_EXECUTOR_PARTITIONS": str(PARTITIONS),
        "ROUNDTRIP_SIMULATOR_LATENCY_MS": str(LATENCY_MS),
        "ROUNDTRIP_SIMULATOR_PERSONA": "careful",
    }
    with roundtrip_up(tmp_path, "--executors", "2", env=env) as running:
        yield running


async def test_a_killed_executor_is_restarted_and_the_turns_in_flight_each_get_one_reply(up):
    process, env, log = up
    before = pids_of(log.read_text())
    assert {"executor", "executor-2"} <= set(before)
    client = FleetClient(Settings(kafka_bootstrap_servers=f"127.0.0.1:{env['ROUNDTRIP_KAFKA_PORT']}", topic_prefix=""))
    await client.start()
    try:
        # Every partition of turn.tool_batches carries one turn, so whichever executor dies held some of them.
        requests = {}
        for conversation in conversations_covering(PARTITIONS, "conv_sup_"):
            request_id = f"req_{conversation}"
            body = (
                f'{{"request_id": "{request_id}", "conversation_id": "{conversation}", '
                '"customer_id": "cus_1001", "text": "where is my order?"}'
            )
            await client.publish_raw(body.encode(), key=conversation.encode())
            requests[request_id] = conversation

        # Each turn's first tool batch has run (the executor asked for model call 2), so model call 2 is in flight.
        def first_batches_done():
            return all(any(m["step"] == 1 for m in client.of_turn(topics.MODEL_CALLS, r)) for r in requests)

        await client.wait_for(first_batches_done, timeout=60)
        assert not any(client.replies.get(r) for r in requests), "the turns should still be in flight"
        victim = before["executor-2"]
        os.kill(victim, signal.SIGKILL)

        replies = {r: await client.reply(r, timeout=120) for r in requests}
        await client.settled()  # every record handled: a duplicate reply would be in `seen`
    finally:
        await client.stop()

    output = log.read_text()
    assert re.search(
        rf"(?m)^roundtrip: executor-2 \(pid {victim}\) died: killed by SIGKILL after [\d.]+ s up; restarting in 0.5 s",
        output,
    ), output
    restarted = pids_of(output)["executor-2"]
    assert restarted != victim and f"roundtrip: executor-2 restarted (pid {restarted}, restart 1)" in output
    assert (log.parent / "state" / "logs" / "executor-2.log").read_text().count(
        "roundtrip executor started"
    ) == 2  # it came back

    for request_id, reply in replies.items():
        assert len(client.replies[request_id]) == 1, f"{request_id}: {client.replies[request_id]}"
        assert reply.outcome == "end_turn" and reply.steps == 3, reply  # list_orders, get_shipping_status, answer
        assert reply.conversation_id == requests[request_id]

    # the fleet stayed up: `roundtrip up` and every other child still run, nothing else was restarted
    assert process.poll() is None
    assert output.count(" died: ") == 1
    for name, pid in before.items():
        if name != "executor-2":
            assert os.path.exists(f"/proc/{pid}"), f"{name} (pid {pid}) should still run"

    process.send_signal(signal.SIGINT)  # Ctrl-C stops everything, the restarted executor too
    assert process.wait(timeout=60) == 0
    assert "roundtrip: stopped" in log.read_text()
    assert not os.path.exists(f"/proc/{restarted}")


def broker_pid(state_dir) -> int:
    """The embedded broker's JVM: the java process started with this fleet's server.properties."""
    properties = str((state_dir / "kafka" / "server.properties").resolve())
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if properties.encode() in argv and any(a.endswith(b"java") for a in argv[:1]):
                return int(entry)
    raise AssertionError(f"no broker running with {properties}")


def test_a_killed_broker_is_restarted_on_its_data_and_the_fleet_answers_again(tmp_path):
    with roundtrip_up(tmp_path) as (process, env, log):
        victim = broker_pid(tmp_path / "state")
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while "roundtrip: kafka restarted" not in log.read_text():
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()
            time.sleep(0.2)  # poll interval: the supervisor's log
        output = log.read_text()
        assert re.search(
            rf"(?m)^roundtrip: kafka \(pid {victim}\) died: killed by SIGKILL after [\d.]+ s up; restarting in 0.5 s",
            output,
        )
        assert broker_pid(tmp_path / "state") != victim
        port = int(env["ROUNDTRIP_KAFKA_PORT"])
        while True:  # the JVM takes a few seconds to serve again
            try:
                if probe_metadata("127.0.0.1", port):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline + 60, "the restarted broker did not serve"
            time.sleep(0.5)  # poll interval: the restarted broker answering

        # same data dir: the topics are still there, and the services (or their restarts) serve again
        ask = subprocess.run(
            [sys.executable, "-m", "roundtrip._cli.main", "ask", "where is my order?", "--customer", "cus_1001"],
            env=env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert ask.returncode == 0, ask.stdout + ask.stderr + log.read_text()
        assert "end_turn" in ask.stdout
        assert process.poll() is None
