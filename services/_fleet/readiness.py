"""Waiting for the fleet's children: an HTTP part (simulator, shop) until its /health answers, a service until it
says "ready" on its pipe (whatever its log level, so an earlier run's log never counts).

A child that exits while the fleet waits is restarted by `Retries` after the supervisor's backoff, a bounded number of
times; then the wait ends in a one-line FleetError, the cause read from the child's own log."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from roundtrip._fleet import causes
from roundtrip._fleet.children import close_ready
from roundtrip._fleet.supervisor import Child, FleetError, RestartPolicy, describe_exit, restart_now


@dataclass
class Retries:
    """What the fleet does with a child that exits before it is ready: report it with its cause and restart it after
    `policy`'s backoff, at most `attempts` times (none for a refused configuration); `restart(child)` gives it a new
    process (and ready pipe); `setting(port)` names the setting of a port a child could not bind."""

    policy: RestartPolicy
    restart: Callable[[Child], None]
    say: Callable[[str], None]
    setting: Callable[[int], str | None] = lambda port: None
    attempts: int = 3
    last_causes: dict[str, causes.Cause] = field(default_factory=dict)

    def exited(self, child: Child, now: float) -> None:
        """`child` has exited: schedule its restart, or raise FleetError when it has had its attempts."""
        cause = self.last_causes[child.name] = causes.of_run(child.log_path, child.log_start)
        # exit 1 with `roundtrip run`'s refusal: the settings are wrong, a restart with the same ones cannot pass
        if child.restarts >= self.attempts or (cause.refused and child.process.returncode == 1):
            raise FleetError(failure(child, cause, self.setting))
        child.delay = self.policy.next_delay(child.delay, 0.0)  # a start that failed is a death without uptime
        child.restart_due = now + child.delay
        self.say(
            f"roundtrip: {child.name} (pid {child.process.pid}) exited before it was ready "
            f"({describe_exit(child.process.returncode)}: {cause.text}); restarting in {child.delay:g} s"
        )

    def due_in(self, children: list[Child], now: float) -> float:
        """Seconds until the next restart is due (1 when none is)."""
        return min([1.0, *(max(0.0, c.restart_due - now) for c in children if c.restart_due is not None)])


def failure(child: Child, cause: causes.Cause, setting: Callable[[int], str | None]) -> str:
    """The one line `roundtrip up` stops with: the part, the cause from its log, what changes it, where its log is."""
    tries = f"{child.restarts + 1} {'attempt' if child.restarts == 0 else 'attempts'}"
    if cause.port is not None:
        var = setting(cause.port)
        fix = f"; stop what holds it or set {var}" if var else "; stop what holds it"
        return f"{child.name} could not start: port {cause.port} is taken{fix} ({tries}; log {child.log_path})"
    return f"{child.name} could not start: {cause.text} ({tries}; log {child.log_path})"


def check_alive(children: list[Child], retries: Retries | None) -> list[Child]:
    """Every child is running, or is restarted through `retries` (those restarted now are returned)."""
    now, restarted = time.monotonic(), []
    for child in children:
        if child.restart_due is not None:
            if retries is not None and child.restart_due <= now:
                restart_now(child, now, retries.restart, retries.policy, retries.say)
                restarted.append(child)
        elif child.process.poll() is not None:
            if retries is None:
                raise FleetError(failure(child, causes.of_run(child.log_path, child.log_start), lambda port: None))
            retries.exited(child, now)
    return restarted


HTTP_READY_S = 30.0


def wait_http(url: str, name: str, children: list[Child], retries: Retries | None = None) -> None:
    """Until `url` answers 200, for HTTP_READY_S."""
    deadline = time.monotonic() + HTTP_READY_S
    while time.monotonic() < deadline:
        check_alive(children, retries)
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                if retries is not None:
                    retries.last_causes.pop(name, None)  # it serves: an earlier exit is no longer a reason
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    _still_failing([c for c in children if c.name == name], retries)
    raise FleetError(f"{name} did not answer {url} within {HTTP_READY_S:g} s")


def wait_services(children: list[Child], timeout: float, names: set[str] | None, retries: Retries | None) -> None:
    """Wait until every service (of `names`) has said "ready" on its pipe."""
    deadline = time.monotonic() + timeout
    waiting = [c for c in children if c.ready_fd is not None and (names is None or c.name in names)]
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            _still_failing(waiting, retries)
            raise FleetError(
                f"services did not start within {timeout:g} s: {', '.join(sorted(c.name for c in waiting))}"
            )
        fds = {c.ready_fd: c for c in waiting if c.ready_fd is not None}
        pause = min(left, retries.due_in(children, time.monotonic()) if retries else 1.0)
        readable, _, _ = select.select(list(fds), [], [], pause)
        for fd in readable:
            child, said = fds[fd], os.read(fd, 256)
            close_ready(child)
            if said.startswith(b"ready"):
                waiting.remove(child)
                if retries is not None:
                    retries.last_causes.pop(child.name, None)  # it started: an earlier exit is no longer a reason
                continue
            # the end of the pipe without a word: the child has exited (or is exiting)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=10)
            if child.process.poll() is None:
                raise FleetError(f"{child.name} closed its ready pipe without saying it started (log {child.log_path})")
        for child in check_alive(children, retries):
            if child.ready_fd is not None and child not in waiting:
                waiting.append(child)  # one that had said ready and died: waited for again


def _still_failing(children: list[Child], retries: Retries | None) -> None:
    """A child that failed and is not up yet is the reason a wait ended, rather than the timeout."""
    for child in children:
        if retries is not None and child.name in retries.last_causes:
            raise FleetError(failure(child, retries.last_causes[child.name], retries.setting))
