"""Waiting for the fleet's children: an HTTP part (simulator, shop) until its /health answers, a service until it
says "ready" on its pipe (services/_kernel/runtime.py; whatever its log level, so an earlier run's log never counts).
A child that exits while the fleet waits is an error naming the last lines of its log."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time

import httpx

from roundtrip._fleet.children import close_ready
from roundtrip._fleet.supervisor import Child, FleetError


def check_alive(children: list[Child]) -> None:
    for child in children:
        if child.process.poll() is not None:
            tail = child.log_path.read_text(errors="replace").splitlines()[-20:]
            raise FleetError(f"{child.name} exited with code {child.process.returncode}:\n" + "\n".join(tail))


def wait_http(url: str, name: str, children: list[Child], timeout: float = 30) -> None:
    """Until `url` answers 200; any of `children` that exits first is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_alive(children)
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise FleetError(f"{name} did not answer {url} within {timeout:g} s")


def wait_services(children: list[Child], timeout: float = 60, names: set[str] | None = None) -> None:
    """Wait until every service (of `names`) has said "ready" on its pipe; a child that exits first is an error."""
    deadline = time.monotonic() + timeout
    pending = {c.ready_fd: c for c in children if c.ready_fd is not None and (names is None or c.name in names)}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FleetError(
                f"services did not start within {timeout:g} s: {', '.join(sorted(c.name for c in pending.values()))}"
            )
        readable, _, _ = select.select(list(pending), [], [], min(left, 1.0))
        for fd in readable:
            child, said = pending.pop(fd), os.read(fd, 256)
            close_ready(child)
            # the end of the pipe without a word: the child has exited (or is exiting)
            if not said.startswith(b"ready"):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.process.wait(timeout=10)
                check_alive(children)
                raise FleetError(f"{child.name} closed its ready pipe without saying it started (log {child.log_path})")
        check_alive(children)
