"""Supervising the fleet's child processes: their restart state and backoff, and `supervise`, the loop that
restarts a child that dies."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class RestartPolicy:
    """Exponential backoff of the restarts of one child: `initial_s`, doubling up to `max_s`;
    back to `initial_s` once the child had stayed up `reset_after_s` before it died."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    reset_after_s: float = 60.0

    def next_delay(self, previous: float | None, uptime: float) -> float:
        if previous is None or uptime >= self.reset_after_s:
            return self.initial_s
        return min(previous * self.factor, self.max_s)


def describe_exit(code: int | None) -> str:
    """`killed by SIGKILL`, `exit code 1`, `exit code 143 (SIGTERM)` (how a JVM reports a signal)."""
    if code is None:
        return "running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"exit code {code} ({signal.Signals(code - 128).name})"
    return f"exit code {code}"


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    where: str = ""
    started_at: float = field(default_factory=time.monotonic)
    delay: float | None = None
    restart_due: float | None = None
    restarts: int = 0
    ready_fd: int | None = None  # read end of the pipe this process says "ready" on (services only), until it has
    log_start: int = 0  # where this process's output begins in its log (each run appends): what its cause is read from
    env: dict[str, str] = field(default_factory=dict)  # its own settings over the fleet's (an agent version's)


def signal_wakeup() -> tuple[int | None, Callable[[], None]]:
    """A pipe that signals write a byte to (signal.set_wakeup_fd), so select() returns on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        return None, lambda: None
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w)

    def restore() -> None:
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)

    return r, restore


def supervise(
    supervised: Callable[[], list[Child]],
    restart: Callable[[Child], None],
    should_stop: Callable[[], bool],
    policy: RestartPolicy,
    say: Callable[[str], None],
) -> None:
    """Keep every child of `supervised()` running until `should_stop()`: a child that dies is reported and given a
    new process by `restart(child)` after its backoff delay. Blocks in select() on the children's pidfds and, in the
    main thread, on a signal wake-up fd, so a signal handler that makes `should_stop()` true ends the wait at once."""
    wake_r, restore = signal_wakeup()
    pidfds: dict[int, int] = {}
    try:
        while not should_stop():
            now = time.monotonic()
            for child in supervised():
                if child.restart_due is None and child.process.poll() is not None:
                    _schedule_restart(child, now, policy, say)
                elif child.restart_due is not None and child.restart_due <= now:
                    restart_now(child, now, restart, policy, say)
            timeout = 1.0
            for child in supervised():
                if child.restart_due is not None:
                    timeout = min(timeout, max(0.0, child.restart_due - time.monotonic()))
            live = {c.process.pid for c in supervised() if c.restart_due is None}
            for pid in set(pidfds) - live:
                os.close(pidfds.pop(pid))
            for pid in live - set(pidfds):
                with contextlib.suppress(AttributeError, OSError):  # no pidfd_open: the 1 s timeout does it
                    pidfds[pid] = os.pidfd_open(pid)
            readable, _, _ = select.select(
                [*pidfds.values(), *([wake_r] if wake_r is not None else [])], [], [], timeout
            )
            if wake_r is not None and wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
    finally:
        for fd in pidfds.values():
            os.close(fd)
        restore()


def _schedule_restart(child: Child, now: float, policy: RestartPolicy, say: Callable[[str], None]) -> None:
    uptime = now - child.started_at
    child.delay = policy.next_delay(child.delay, uptime)
    child.restart_due = now + child.delay
    say(
        f"roundtrip: {child.name} (pid {child.process.pid}) died: {describe_exit(child.process.returncode)} "
        f"after {uptime:.1f} s up; restarting in {child.delay:g} s (log {child.log_path})"
    )


def restart_now(
    child: Child, now: float, restart: Callable[[Child], None], policy: RestartPolicy, say: Callable[[str], None]
) -> None:
    try:
        restart(child)
    except Exception as exc:  # noqa: BLE001 - a failed start is one more death to back off from
        child.started_at = now
        child.delay = policy.next_delay(child.delay, 0.0)
        child.restart_due = now + child.delay
        say(f"roundtrip: {child.name} could not be restarted ({exc}); trying again in {child.delay:g} s")
        return
    child.started_at, child.restart_due = now, None
    child.restarts += 1
    say(f"roundtrip: {child.name} restarted (pid {child.process.pid}, restart {child.restarts})")


class FleetError(RuntimeError):
    """The fleet cannot start or keep running: one line for `roundtrip up` to print."""


RUNNING_FILE = "fleet.pid"


def claim_folder(state_dir: Path) -> Path:
    """One fleet per state folder: claim it for this process, or raise FleetError naming the process that has it
    (a second `up` there is told which fleet runs, not that a port is taken). A stale claim is taken over."""
    path = state_dir / RUNNING_FILE
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(path.read_text().split()[0])
        if pid != os.getpid() and alive(pid):
            raise FleetError(
                f"a fleet is already running in {state_dir.resolve()} (pid {pid}); stop it (Ctrl-C where it runs, "
                f"or kill {pid}), or give this one another folder with ROUNDTRIP_STATE_DIR"
            )
    path.write_text(f"{os.getpid()}\n")
    return path


def release_folder(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
