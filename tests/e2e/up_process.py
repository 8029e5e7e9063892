"""`roundtrip up` run as a user runs it (a process of its own, on free ports, in a temporary folder)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.ports import free_port_run

UP = (sys.executable, "-m", "roundtrip._cli.main", "up")  # this checkout's roundtrip, in this venv


@contextmanager
def roundtrip_up(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    shell: Mapping[str, str] | None = None,
    command: Sequence[str] = UP,
) -> Iterator[tuple[subprocess.Popen, dict[str, str], Path]]:
    """Start `roundtrip up ARGS`, wait for "Ready.", yield (process, its environment, its output); Ctrl-C it then."""
    with up_started(tmp_path, *args, env=env, shell=shell, command=command) as (process, full_env, output):
        deadline = time.monotonic() + 120
        while "Ready." not in output.read_text():
            assert process.poll() is None, output.read_text()
            assert time.monotonic() < deadline, output.read_text()
            time.sleep(0.2)  # poll interval: `up` printing its banner
        yield process, full_env, output


@contextmanager
def up_started(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    shell: Mapping[str, str] | None = None,
    command: Sequence[str] = UP,
) -> Iterator[tuple[subprocess.Popen, dict[str, str], Path]]:
    """Start `roundtrip up ARGS` and yield (process, its environment, its output) at once; Ctrl-C it then. `shell`:
    the environment it starts from (default: this process's), `command`: the `roundtrip up` to run."""
    base = free_port_run(5)  # below the ephemeral range: still free when up's parts bind them (tests/ports.py)
    full_env = {
        **(os.environ if shell is None else shell),
        "ROUNDTRIP_STATE_DIR": str(tmp_path / "state"),
        "ROUNDTRIP_KAFKA_PORT": str(base),
        "ROUNDTRIP_KAFKA_CONTROLLER_PORT": str(base + 1),
        "ROUNDTRIP_SIMULATOR_PORT": str(base + 2),
        "ROUNDTRIP_CONSOLE_PORT": str(base + 3),
        "ROUNDTRIP_SHOP_PORT": str(base + 4),
        **(env or {}),
    }
    for var in (
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS",
        "ANTHROPIC_API_KEY",
        "ROUNDTRIP_ANTHROPIC_BASE_URL",
        "ROUNDTRIP_SHOP_URL",
    ):
        full_env.pop(var, None)
    output = tmp_path / "up.log"
    log = open(output, "w+")  # noqa: SIM115
    process = subprocess.Popen(
        [*command, *args],
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        yield process, full_env, output
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()


def pids_of(output: str) -> dict[str, int]:
    """name -> pid of every child `roundtrip up` announced (the last pid of a restarted one)."""
    pids = {name: int(pid) for name, pid in re.findall(r"(?m)^  (\S+) .*\(pid (\d+),", output)}
    pids |= {name: int(pid) for name, pid in re.findall(r"(?m)^roundtrip: (\S+) restarted \(pid (\d+),", output)}
    return pids
