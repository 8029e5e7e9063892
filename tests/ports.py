"""Free ports on loopback for tests that start servers.

A run of ports a test hands to servers it starts later (`roundtrip up --health-port`, a broker's, a simulator's) is
picked below the range the OS hands out for ephemeral ports (/proc/sys/net/ipv4/ip_local_port_range): a port found
free there stays free until the server binds it, seconds later, since neither a `bind(("", 0))` of another test nor
an outgoing connection anywhere on the machine can take it meanwhile. Inside that range one can be taken: with the
two halves of the suite side by side many connections open every second, and Linux prefers even ports for
connect() and odd ones for bind(0), so in a run based on a port bind(0) found, the second port (`model` under
`up --health-port`) is among the likeliest to be a client's local port when its service binds it; the service then
takes the next port of its stride, and nothing answers on the one the test expects.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SPAN = 10_000  # how far below the ephemeral range the runs are picked: clear of well-known ports (8080, 9092, ...)
_handed_out: set[int] = set()  # by this process: a run not bound yet is free to the check, but promised


def ephemeral_range() -> tuple[int, int]:
    """The ports the OS picks from for bind(0) and outgoing connections (Linux's default where it cannot be read)."""
    try:
        low, high = (int(n) for n in LOCAL_PORT_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port_run(count: int) -> int:
    """A base port with `count` free ports from it (service i gets base + i, as `roundtrip up --health-port` does),
    below the ephemeral range, so that nothing else on the machine takes one before the test's servers bind them."""
    low, _ = ephemeral_range()
    first, last = max(1024, low - SPAN), low - count
    if last <= first:
        raise RuntimeError(f"no room below the ephemeral port range (from {low}) for {count} ports")
    for _ in range(100):
        base = random.randrange(first, last)
        run = set(range(base, base + count))
        if not run & _handed_out and all(port_is_free(port) for port in run):
            _handed_out.update(run)
            return base
    raise RuntimeError("no run of free ports")


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
