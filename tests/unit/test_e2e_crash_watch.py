"""The e2e tier's watch on its fleet (tests/e2e/crashes.py, the autouse fixture `_fleet_whole_after_each_test` of
tests/e2e/conftest.py), run as it is in a pytest session of its own: its `fleet` a real `Fleet` of one real process
(a sleeper, not a service, so nothing waits for a broker). A test that SIGKILLs it without saying so fails, naming
it and its last log lines; the next test finds the fleet whole; a declared kill and a restart fail nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from roundtrip._fleet.launcher import Fleet
from roundtrip._fleet.supervisor import Child
from roundtrip._kernel.settings import Settings
from tests.e2e import crashes

pytest_plugins = ("pytester",)

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
import sys

import pytest

from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.settings import Settings
from tests.e2e.conftest import AsyncFleet, _fleet_whole_after_each_test  # noqa: F401 - the fixture under test

SLEEPER = [sys.executable, "-c", "print('sleeper: up and about', flush=True); import time; time.sleep(600)"]


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    running = Fleet(Settings(state_dir=tmp_path_factory.mktemp("fleet")))
    running.logs.mkdir(parents=True)
    running._spawn("sleeper", SLEEPER, "")
    yield AsyncFleet(running)
    running.stop()
"""

TESTS = """
import asyncio
import os
import signal
import time

import pytest

PIDS = []
# One loop for the session, as the e2e tier has (loop scope "session"): a process is started from a thread of the
# loop's executor and gets SIGTERM when that thread ends (die_with_parent_preexec), which asyncio.run's shutdown of
# its executor would do to the sleeper a restart started, at some moment in a later test.
LOOP = asyncio.new_event_loop()


def _sigkill(fleet):
    (child,) = fleet.sync.children
    time.sleep(0.5)  # its first line in its log
    os.kill(child.process.pid, signal.SIGKILL)
    child.process.wait()


def test_a_sigkill_nobody_declared(fleet):
    PIDS.append(fleet.sync.children[0].process.pid)
    _sigkill(fleet)


def test_the_next_test_finds_the_fleet_whole(fleet):
    (child,) = fleet.sync.children
    assert child.process.poll() is None and child.process.pid not in PIDS


@pytest.mark.kills_services
def test_a_declared_sigkill(fleet):
    _sigkill(fleet)


def test_a_restart(fleet):
    LOOP.run_until_complete(fleet.restart("sleeper"))


def test_fleet_kill_undeclared(fleet):
    LOOP.run_until_complete(fleet.kill("sleeper"))


def test_a_test_without_the_fleet():
    pass
"""


def test_a_fleet_process_killed_by_a_test_that_does_not_declare_it_fails_that_test(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # `tests` importable from the session's folder
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fleet=TESTS)
    pytester.makeini("[pytest]\nmarkers =\n    kills_services: declared kills\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=6, errors=2)
    out = result.stdout.str()
    assert "ERROR at teardown of test_a_sigkill_nobody_declared" in out
    assert "ERROR at teardown of test_fleet_kill_undeclared" in out
    assert "sleeper (pid " in out and "exited during the test: killed by SIGKILL" in out
    assert "sleeper: up and about" in out  # its last log lines
    assert "@pytest.mark.kills_services" in out


def _child(tmp_path: Path, name: str) -> Child:
    log = tmp_path / f"{name}.log"
    log.write_text("".join(f"line {i}\n" for i in range(40)))
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    return Child(name, process, log)


def test_the_watch_names_each_exit_with_how_it_ended_and_the_end_of_its_log(tmp_path):
    gate, guard, model = (_child(tmp_path, n) for n in ("gate", "guard", "model"))
    fleet = Fleet(Settings(state_dir=tmp_path))
    fleet.children = [gate, guard, model]
    watch = crashes.Watch.of(fleet)
    try:
        gate.process.send_signal(signal.SIGKILL)
        guard.process.terminate()
        for c in (gate, guard):
            c.process.wait()
        (gate_exit,) = watch.exits(on_purpose={guard.process.pid})
        assert gate_exit.startswith(f"gate (pid {gate.process.pid}) exited during the test: killed by SIGKILL")
        assert "    line 39" in gate_exit and "    line 25" in gate_exit and "line 24\n" not in gate_exit
        assert len(watch.exits()) == 2
    finally:
        for c in (gate, guard, model):
            c.process.kill()
            c.process.wait()


def test_how_a_process_ended_reads_plainly():
    assert crashes.how_it_ended(-9) == "killed by SIGKILL"
    assert crashes.how_it_ended(1) == "exit code 1"
    assert crashes.how_it_ended(-200) == "killed by signal 200"
