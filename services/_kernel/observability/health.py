"""Each service's /healthz, /readyz and /metrics on one port (ROUNDTRIP_HEALTH_PORT; 0 turns it off).

A service's checks are its shell's `Health`; `attach(app, service, settings, checks)` serves them from the app's
start to its end. The server is asyncio's own, which leaves the process's signal handling to FastStream
(docs/operating/index.md).
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from faststream import FastStream
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from roundtrip._kernel.settings import Settings, TelemetrySettings
from roundtrip._kernel.wire import topology

log = logging.getLogger("roundtrip.health")

Check = Callable[[], bool | Awaitable[bool]]
PORT_STRIDE = len(topology.SERVICES)
REPLICA_PORTS = 20
CHECK_TIMEOUT_S = 2.0
CONTEXT_KEY = "roundtrip_health"


class Health:
    """One service's liveness and readiness checks by name (the same name replaces); a check that is false, raises
    or takes longer than 2 s fails its probe (/healthz, /readyz)."""

    def __init__(self) -> None:
        self.liveness: dict[str, Check] = {}
        self.readiness: dict[str, Check] = {}

    def live(self, name: str, check: Check) -> None:
        self.liveness[name] = check

    def ready(self, name: str, check: Check) -> None:
        self.readiness[name] = check

    def unregister(self, name: str) -> None:
        self.liveness.pop(name, None)
        self.readiness.pop(name, None)

    def heartbeat(self, name: str, max_silence_s: float) -> Callable[[], None]:
        """A liveness check that fails when the returned `beat()` was not called for `max_silence_s`."""
        last = [time.monotonic()]

        def beat() -> None:
            last[0] = time.monotonic()

        self.live(name, lambda: time.monotonic() - last[0] <= max_silence_s)
        return beat


def keep(app: FastStream, checks: Health) -> None:
    """Keep a service's checks in its app's own context, where `of(app)` finds them."""
    app.context.set_global(CONTEXT_KEY, checks)


def of(app: FastStream) -> Health:
    """The checks kept in the app's context; none yet for an app built without a shell."""
    checks = app.context.get(CONTEXT_KEY)
    return checks if isinstance(checks, Health) else Health()


async def evaluate(checks: dict[str, Check]) -> tuple[bool, dict[str, Any]]:
    """Run every check (concurrently, each bounded); all must pass."""

    async def one(check: Check) -> Any:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, CHECK_TIMEOUT_S)
            return bool(result)
        except Exception as exc:  # noqa: BLE001 - a broken check is a failing check, not a broken endpoint
            return f"error: {type(exc).__name__}: {exc}"[:200]

    names = list(checks)
    results = dict(zip(names, await asyncio.gather(*(one(checks[n]) for n in names)), strict=True))
    return all(r is True for r in results.values()), results


def port_candidates(service: str, settings: TelemetrySettings) -> list[int]:
    """The ports this service may bind, in order ([] when the endpoint is off)."""
    if not settings.health_port:
        return []
    if not settings.health_port_per_service:
        return [settings.health_port]
    first = settings.health_port + (topology.index(service) if service in topology.names() else 0)
    return [p for p in range(first, first + PORT_STRIDE * REPLICA_PORTS, PORT_STRIDE) if p <= 65535]


class HealthServer:
    """/healthz, /readyz, /metrics of one process, served on the event loop."""

    def __init__(self, service: str, host: str, ports: list[int], checks: Health) -> None:
        self.service, self.host, self.ports, self.checks = service, host, ports, checks
        self.port: int | None = None
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        for port in self.ports:
            try:
                self._server = await asyncio.start_server(self._handle, self.host, port, reuse_address=True)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE and port != self.ports[-1]:
                    continue
                raise RuntimeError(
                    f"cannot serve /healthz, /readyz, /metrics on {self.host}:{port} ({exc.strerror}); "
                    "set ROUNDTRIP_HEALTH_PORT to a free port (0 turns the endpoint off)"
                ) from exc
            self.port = self._server.sockets[0].getsockname()[1]
            log.info("roundtrip %s: /healthz /readyz /metrics on http://%s:%d", self.service, self.host, self.port)
            return

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target = request_line.split(" ")[:2]
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if ":" in h)}
            status, content_type, body = await self._route(method, target.split("?", 1)[0], headers)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
                + (b"" if method == "HEAD" else body)
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError, ValueError):
            pass  # a client that went away or sent garbage gets nothing
        finally:
            writer.close()

    async def _route(self, method: str, path: str, headers: dict[str, str]) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if path == "/metrics":
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            return "200 OK", content_type, encoder(REGISTRY)
        if path in ("/healthz", "/readyz"):
            ok, results = await evaluate(self.checks.liveness if path == "/healthz" else self.checks.readiness)
            body = {"status": "ok" if ok else "failing", "service": self.service, "checks": results}
            return (
                ("200 OK" if ok else "503 Service Unavailable"),
                "application/json",
                json.dumps(body).encode() + b"\n",
            )
        return "404 Not Found", "text/plain", b"/healthz, /readyz or /metrics\n"


def subscribers_alive(app: FastStream, state: dict[str, bool], alive: Callable[[Any], bool]) -> Check:
    """Liveness: each subscriber `alive` (its consume task per consumer live, read by the kafka seam); true while
    the app starts or stops, so a probe never kills a draining service."""

    def check() -> bool:
        if not state["started"] or state["stopping"]:
            return True
        return app.broker is not None and all(alive(s) for s in app.broker.subscribers)

    return check


def attach(
    app: FastStream, service: str, settings: Settings, checks: Health, alive: Callable[[Any], bool]
) -> HealthServer | None:
    """Serve `checks` from the app's start to its end (None when ROUNDTRIP_HEALTH_PORT is 0); `alive`: whether one
    of its subscribers still consumes."""
    ports = port_candidates(service, settings)
    if not ports:
        return None
    server = HealthServer(service, settings.listen_host, ports, checks)
    state = {"started": False, "stopping": False}

    async def broker_answers() -> bool:
        return app.broker is not None and await app.broker.ping(timeout=CHECK_TIMEOUT_S / 2)

    checks.live("subscribers", subscribers_alive(app, state, alive))
    checks.ready("started", lambda: state["started"] and not state["stopping"])
    checks.ready("broker", broker_answers)

    async def started() -> None:
        state["started"] = True

    async def stopping() -> None:
        state["stopping"] = True

    app.on_startup(server.start)  # before the broker connects: /healthz answers a slow start, /readyz says not yet
    app.after_startup(started)
    app.on_shutdown(stopping)
    app.after_shutdown(server.stop)
    return server
