"""Run the simulator: in the foreground (`python -m roundtrip._simulator`) or in a background thread on a free port
(`running_simulator()`), for a process that needs a model of its own for a while.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from .app import create_app


def serve(host: str = "127.0.0.1", port: int = 8801, log_level: str = "info", **app_options: Any) -> None:
    """Serve until interrupted. app_options go to create_app()."""
    uvicorn.run(create_app(**app_options), host=host, port=port, log_level=log_level.lower())


@contextmanager
def running_simulator(**app_options: Any) -> Iterator[str]:
    """Serve on a free port in a daemon thread; yield the base URL (http://127.0.0.1:41234) for AsyncAnthropic."""
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on such sockets (else each response
    # waits for the client's delayed ACK, about 40 ms)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(**app_options), log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="roundtrip-simulator", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the simulator did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()
