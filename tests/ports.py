"""Free ports on loopback for tests that start servers."""

from __future__ import annotations

import socket


def free_port_run(count: int) -> int:
    """A base port with `count` free ports from it (service i gets base + i, as `roundtrip up --health-port` does)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count < 65535 and all(port_is_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no run of free ports")


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
