"""`roundtrip up` when a part loses its port after up's check of the ports: another process takes the console's port
at the moment up starts the console (after the check, before the console binds, as happened on a shared machine).
The console is restarted with the supervisor's backoff while the rest of the fleet goes on starting; when the port
stays taken, up stops with one line naming the port and its setting (no traceback) and a non-zero exit code; when
the port is freed between attempts, the fleet comes up."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from tests.e2e.up_process import up_started

SPAWNED = re.compile(r"(?m)^  console +http://\S+:(\d+)  \(pid (\d+),")


def wait_for(output: Path, pattern: str, process, timeout: float = 150) -> re.Match:
    deadline = time.monotonic() + timeout
    while not (match := re.search(pattern, output.read_text(), re.MULTILINE)):
        assert process.poll() is None, output.read_text()
        assert time.monotonic() < deadline, output.read_text()
        time.sleep(0.05)  # poll interval: `up` printing the part's start line
    return match


def hold(port: int) -> socket.socket:
    """Listen on `port` as another program would (no SO_REUSEADDR: nothing else can bind it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_port_taken_after_the_check_restarts_the_part_then_stops_up_with_one_line_naming_port_and_setting(tmp_path):
    with up_started(tmp_path) as (process, env, output):
        spawned = wait_for(output, SPAWNED.pattern, process)
        port = int(env["ROUNDTRIP_CONSOLE_PORT"])
        assert int(spawned.group(1)) == port
        held = hold(port)  # up has checked its ports and started the console, which is still importing
        try:
            code = process.wait(timeout=180)
        finally:
            held.close()
        text = output.read_text()

    assert code != 0, text
    assert re.search(
        rf"(?m)^roundtrip: console \(pid {spawned.group(2)}\) exited before it was ready "
        rf"\(exit code \d+: port {port} is taken\); restarting in 0.5 s$",
        text,
    ), text
    assert re.search(r"(?m)^roundtrip: console restarted \(pid \d+, restart 1\)$", text), text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    # four attempts (three restarts), fewer only when the start's time ran out first on a slow machine
    assert re.fullmatch(
        rf"error: console could not start: port {port} is taken; stop what holds it or set ROUNDTRIP_CONSOLE_PORT "
        rf"\([234] attempts; log {re.escape(str(tmp_path / 'state' / 'logs' / 'console.log'))}\)",
        errors[0],
    ), text
    assert text.rstrip().endswith(errors[0]) and "Traceback" not in text and "SystemExit" not in text
    assert "Ready." not in text


def test_a_port_freed_between_attempts_lets_the_fleet_come_up(tmp_path):
    with up_started(tmp_path) as (process, env, output):
        wait_for(output, SPAWNED.pattern, process)
        port = int(env["ROUNDTRIP_CONSOLE_PORT"])
        held = hold(port)
        try:
            wait_for(output, r"^roundtrip: console \(pid \d+\) exited before it was ready .*port \d+ is taken", process)
        finally:
            held.close()  # freed before the restart, due 0.5 s later
        wait_for(output, r"^Ready\.", process)
        text = output.read_text()
        assert re.search(r"(?m)^roundtrip: console restarted \(pid \d+, restart 1\)$", text), text
        assert "error:" not in text
