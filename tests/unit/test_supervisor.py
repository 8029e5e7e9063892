"""`Fleet.supervise` (what `roundtrip up` runs): dead children come back with backoff, the rest keep running.

Real child processes (small Python programs), no broker: the fleet's own services are covered
end to end by tests/e2e/test_up_supervisor.py.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from roundtrip._fleet.launcher import Fleet
from roundtrip._fleet.supervisor import RestartPolicy, describe_exit
from roundtrip._kernel.settings import Settings

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
CRASHER = [sys.executable, "-c", "import sys; sys.exit(3)"]


def test_backoff_doubles_up_to_the_cap_and_resets_after_a_good_run():
    policy = RestartPolicy(initial_s=0.5, factor=2, max_s=30, reset_after_s=60)
    delays, previous = [], None
    for _ in range(9):
        previous = policy.next_delay(previous, uptime=1.0)
        delays.append(previous)
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert policy.next_delay(30, uptime=59.9) == 30
    assert policy.next_delay(30, uptime=60.0) == 0.5  # it had stayed up: start over


def test_exits_are_described_by_code_or_signal():
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(143) == "exit code 143 (SIGTERM)"


class Supervised:
    """A Fleet of arbitrary children, supervised in a thread, with every line it says recorded."""

    def __init__(self, tmp_path, policy: RestartPolicy) -> None:
        self.lines: list[str] = []
        self.fleet = Fleet(Settings(state_dir=tmp_path), say=self.lines.append, policy=policy)
        self.fleet.logs = tmp_path
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.fleet.supervise, args=(self.stop.is_set,), daemon=True)

    def spawn(self, name: str, argv: list[str]) -> None:
        self.fleet._spawn(name, argv, "test")

    def child(self, name: str):
        (child,) = [c for c in self.fleet.children if c.name == name]
        return child

    def wait_for(self, predicate, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while not (result := predicate()):
            assert time.monotonic() < deadline, "\n".join(self.lines)
            time.sleep(0.02)  # poll interval: the supervisor's log lines
        return result

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.fleet.stop()


@pytest.fixture
def supervised(tmp_path):
    s = Supervised(tmp_path, RestartPolicy(initial_s=0.05, factor=2, max_s=0.2, reset_after_s=60))
    yield s
    s.close()


def test_a_killed_child_is_reported_and_restarted_while_the_others_keep_running(supervised):
    supervised.spawn("executor", SLEEPER)
    supervised.spawn("executor-2", SLEEPER)
    supervised.thread.start()
    victim, bystander = supervised.child("executor-2"), supervised.child("executor")
    old_pid, bystander_pid = victim.process.pid, bystander.process.pid

    os.kill(old_pid, signal.SIGKILL)
    supervised.wait_for(lambda: victim.process.pid != old_pid and victim.process.poll() is None)

    died = [line for line in supervised.lines if "died" in line]
    assert died == [died[0]] and f"executor-2 (pid {old_pid}) died: killed by SIGKILL" in died[0]
    assert "restarting in 0.05 s" in died[0]
    assert f"roundtrip: executor-2 restarted (pid {victim.process.pid}, restart 1)" in supervised.lines
    assert bystander.process.pid == bystander_pid and bystander.process.poll() is None  # untouched
    assert victim.restarts == 1 and bystander.restarts == 0


def test_a_crash_loop_backs_off_exponentially_up_to_the_cap(supervised):
    supervised.spawn("shop", CRASHER)
    supervised.thread.start()
    supervised.wait_for(lambda: supervised.child("shop").restarts >= 4)
    delays = [line.split("restarting in ")[1].split(" s")[0] for line in supervised.lines if "died" in line]
    assert delays[:5] == ["0.05", "0.1", "0.2", "0.2", "0.2"][: len(delays[:5])]
    assert all("exit code 3" in line for line in supervised.lines if "died" in line)


def test_stop_ends_supervision_promptly_and_stop_kills_every_child(supervised):
    supervised.spawn("gateway", SLEEPER)
    supervised.thread.start()
    time.sleep(0.2)  # the supervise loop running (in its wait) when stop is set
    started = time.monotonic()
    supervised.stop.set()
    supervised.thread.join(5)
    assert not supervised.thread.is_alive() and time.monotonic() - started < 1.5  # at most one 1 s wait
    process = supervised.child("gateway").process
    supervised.fleet.stop()
    assert process.poll() is not None
