"""The fleet's child processes: each started with its log and, for a service, the pipe it says "ready" on; stopped
with SIGTERM, or killed. A child runs in a session of its own and dies with the thread that started it, so a killed
`roundtrip up` leaves no orphans behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from roundtrip._broker.embedded import die_with_parent_preexec
from roundtrip._fleet.supervisor import Child
from roundtrip._kernel.runtime import READY_FD_ENV

STOP_TIMEOUT_S = 15  # after SIGTERM, what every child gets together before it is killed


def run_argv(name: str) -> list[str]:
    """The command of one part of the fleet (a service, the simulator, the shop): `roundtrip run <name>`."""
    return [sys.executable, "-m", "roundtrip._cli.main", "run", name]


def popen(
    argv: list[str], log_path: Path, env: Mapping[str, str], ready_pipe: bool
) -> tuple[subprocess.Popen[bytes], int | None]:
    """Start one child with `env` (the whole environment); with `ready_pipe`, also the pipe it says "ready" on."""
    # a stable identity per replica (not the pid): a restarted gateway fences its predecessor's transaction at once
    identity = f"{socket.gethostname()}-{log_path.stem}"
    env = {**env, "PYTHONUNBUFFERED": "1", "ROUNDTRIP_INSTANCE_ID": identity}
    env.pop(READY_FD_ENV, None)
    read_fd = write_fd = None
    if ready_pipe:
        read_fd, write_fd = os.pipe()
        env[READY_FD_ENV] = str(write_fd)
    try:
        with open(log_path, "ab") as out:  # the child has its own copy of the fd
            process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=() if write_fd is None else (write_fd,),
                preexec_fn=die_with_parent_preexec(signal.SIGTERM),
            )
    except BaseException:
        for fd in (read_fd, write_fd):
            if fd is not None:
                os.close(fd)
        raise
    if write_fd is not None:
        os.close(write_fd)  # the child's copy is the only one: its exit ends the pipe
    return process, read_fd


def close_ready(child: Child) -> None:
    if child.ready_fd is not None:
        os.close(child.ready_fd)
        child.ready_fd = None


def of_service(children: list[Child], name: str) -> list[Child]:
    """Every process of one service: `executor` is executor, executor-2, ..."""
    return [c for c in children if c.name == name or c.name.startswith(f"{name}-")]


def kill(children: list[Child]) -> None:
    for child in children:
        child.process.kill()
        child.process.wait()


def stop(children: list[Child]) -> None:
    """SIGTERM to every child (the last started first), then wait for them all; one still running is killed."""
    for child in reversed(children):
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in reversed(children):
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
    for child in children:
        close_ready(child)
