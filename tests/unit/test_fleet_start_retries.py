"""A part that exits before it is ready, while `Fleet.start` waits (services/_fleet/readiness.py `Retries`): it is
restarted with the supervisor's backoff while the others go on starting, a bounded number of times, then the wait
ends in one line naming the cause from its own log and the setting that changes it.

Real child processes (small Python programs that speak the ready pipe as a service does), no broker: `roundtrip up`
itself is covered end to end by tests/e2e/test_up_port_taken.py."""

from __future__ import annotations

import sys

import pytest

from roundtrip._fleet import launcher
from roundtrip._fleet.launcher import Fleet
from roundtrip._fleet.parts import port_settings
from roundtrip._fleet.readiness import Retries
from roundtrip._fleet.supervisor import FleetError, RestartPolicy
from roundtrip._kernel.settings import Settings

# Fails (as uvicorn does when its port is held) the first FAILS runs, counted in a file, then says "ready".
FLAKY = """
import os, pathlib, sys, time
count = pathlib.Path(sys.argv[1])
runs = int(count.read_text()) if count.exists() else 0
count.write_text(str(runs + 1))
if runs < int(sys.argv[2]):
    print("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 18003): "
          "address already in use", flush=True)
    raise SystemExit(3)
os.write(int(os.environ["ROUNDTRIP_READY_FD"]), b"ready\\n")
time.sleep(120)
"""
READY = [
    sys.executable,
    "-c",
    "import os, time; os.write(int(os.environ['ROUNDTRIP_READY_FD']), b'ready'); time.sleep(120)",
]


@pytest.fixture
def fleet(tmp_path):
    lines: list[str] = []
    fleet = Fleet(Settings(state_dir=tmp_path), say=lines.append, policy=RestartPolicy(initial_s=0.05, max_s=0.2))
    fleet.logs = tmp_path
    fleet.lines = lines  # type: ignore[attr-defined]
    fleet._retries = Retries(  # what start() sets up around its waits
        fleet.policy,
        lambda c: fleet._restart_child(c, ready_pipe=True),
        fleet.say,
        {18003: "ROUNDTRIP_CONSOLE_PORT"}.get,
    )
    yield fleet
    fleet.stop()


def flaky(tmp_path, fails: int) -> list[str]:
    return [sys.executable, "-c", FLAKY, str(tmp_path / "runs"), str(fails)]


def test_a_part_that_exits_before_it_is_ready_is_restarted_with_backoff_and_the_others_keep_starting(fleet, tmp_path):
    fleet._spawn("gateway", READY, "test")
    fleet._spawn("console", flaky(tmp_path, fails=2), "test")
    bystander = fleet.children[0].process.pid

    fleet._wait_services()

    console = fleet.children[1]
    assert console.restarts == 2 and console.process.poll() is None  # the third run said ready
    exits = [line for line in fleet.lines if "exited before it was ready" in line]
    assert len(exits) == 2
    assert "(exit code 3: port 18003 is taken); restarting in 0.05 s" in exits[0]
    assert "restarting in 0.1 s" in exits[1]  # the supervisor's backoff, doubling
    assert f"roundtrip: console restarted (pid {console.process.pid}, restart 2)" in fleet.lines
    assert fleet.children[0].process.pid == bystander and fleet.children[0].restarts == 0
    assert not any("Traceback" in line for line in fleet.lines)


def test_a_part_that_keeps_failing_stops_the_start_with_one_line_naming_the_port_and_its_setting(fleet, tmp_path):
    fleet._spawn("gateway", READY, "test")
    fleet._spawn("console", flaky(tmp_path, fails=99), "test")

    with pytest.raises(FleetError) as raised:
        fleet._wait_services()

    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        "console could not start: port 18003 is taken; stop what holds it or set ROUNDTRIP_CONSOLE_PORT (4 attempts; "
    )
    assert (tmp_path / "runs").read_text() == "4"  # the first run and three restarts
    assert len([line for line in fleet.lines if "exited before it was ready" in line]) == 3


def test_a_part_still_failing_when_the_time_is_up_is_named_rather_than_the_timeout(fleet, tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "START_TIMEOUT_S", 8.0)  # time for the first run to start and exit on a busy machine
    fleet.policy = RestartPolicy(initial_s=60)  # its restart is never due within the wait
    fleet._retries.policy = fleet.policy
    fleet._spawn("console", flaky(tmp_path, fails=99), "test")

    with pytest.raises(FleetError, match=r"^console could not start: port 18003 is taken; .* \(1 attempt; log "):
        fleet._wait_services()


def test_without_retries_an_exit_is_one_line_with_its_cause(fleet, tmp_path):
    fleet._retries = None  # a respawn (tests) or a wait after start: no second chance
    fleet._spawn("console", flaky(tmp_path, fails=99), "test")

    with pytest.raises(FleetError) as raised:
        fleet._wait_services()
    assert str(raised.value).startswith("console could not start: port 18003 is taken; stop what holds it (1 attempt")


def test_each_port_a_part_binds_is_named_by_its_setting(tmp_path):
    settings = Settings(state_dir=tmp_path, console_port=18003, health_port=9400, health_port_per_service=True)
    named = port_settings(settings, shop=None)
    assert named[18003] == "ROUNDTRIP_CONSOLE_PORT" and named[settings.simulator_port] == "ROUNDTRIP_SIMULATOR_PORT"
    assert named[9405] == named[9411] == "ROUNDTRIP_HEALTH_PORT (up --health-port)"  # the console's, a 2nd replica's


REFUSED = [
    sys.executable,
    "-c",
    "import sys; print('error: guard refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is PLAINTEXT', "
    "file=sys.stderr); raise SystemExit(1)",
]
CRASHED = [sys.executable, "-c", "raise RuntimeError('a bug')"]  # exit 1 too, but no refusal: worth a restart


def test_a_refused_configuration_stops_the_start_at_the_first_exit_while_a_crash_is_restarted(fleet, tmp_path):
    fleet._spawn("guard", REFUSED, "test")
    with pytest.raises(FleetError) as raised:
        fleet._wait_services()
    assert str(raised.value).startswith(
        "guard could not start: guard refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is PLAINTEXT (1 attempt; "
    )
    assert not [line for line in fleet.lines if "restarting" in line]
    fleet.stop()
    fleet._spawn("executor", CRASHED, "test")
    with pytest.raises(FleetError, match=r"^executor could not start: RuntimeError: a bug \(4 attempts; "):
        fleet._wait_services()
