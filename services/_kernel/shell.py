"""A service's shell: its wiring, its app, and what it opens at start and closes after stop (in reverse order).

A service's `build(settings, agent)` makes one, declares what it opens, builds its core (core.py) with those as ports,
subscribes the core's handlers and returns `shell.app`. The shell refuses, at start and before the broker is contacted,
what the topology refuses for every service: a plaintext Kafka (messaging.Wiring) and the keys it holds unfit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from faststream import FastStream
from faststream.kafka import KafkaBroker
from pydantic import BaseModel

from roundtrip._kernel.kafka.consumer import KeyOrderedConsumer
from roundtrip._kernel.kafka.messaging import Outlet, Wiring, service_app, subscribe, wiring
from roundtrip._kernel.observability import health
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.turnstore import Fence, Principal
from roundtrip._kernel.wire import topology

T = TypeVar("T")


class Server(Protocol):
    """What a shell serves beside its consumers (the console's web pages): `serve` returns once it serves."""

    async def serve(self) -> None: ...

    async def stop(self) -> None: ...


class Opened(Generic[T]):
    """What the shell opens when the service starts; calling it gives the open thing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.value: T | None = None

    def __call__(self) -> T:
        if self.value is None:
            raise RuntimeError(f"{self.name} is opened when the service starts")
        return self.value


class OpenedFence:
    """The fence a core is built with before the shell opens it at start: each claim goes to the open one."""

    def __init__(self, opened: Opened[Fence]) -> None:
        self.opened = opened

    async def claim_model_call(self, turn: Principal, step: int, now: float) -> bool:
        return await self.opened().claim_model_call(turn, step, now)

    async def wait_for_capacity(self, turn: Principal, step: int, now: float) -> bool:
        return await self.opened().wait_for_capacity(turn, step, now)

    async def claim_batch(self, turn: Principal, step: int, lease_s: float, now: float) -> bool:
        return await self.opened().claim_batch(turn, step, lease_s, now)

    async def record_acted(self, turn_id: str, step: int, lines: str) -> None:
        await self.opened().record_acted(turn_id, step, lines)


class Shell:
    """One service's name, broker, topic prefix, consumers, health checks, app and lifecycle."""

    def __init__(
        self,
        service: str,
        settings: Settings,
        logger: logging.Logger,
        agent_digest: str,
        holds_calls: bool,
        turn_roots: tuple[str, ...] = (),
    ) -> None:
        """`holds_calls`: the agent has approval rules (a published decision key is then refused outside development);
        `turn_roots`: the topics whose messages start turns (the gateway's)."""
        self.settings = settings
        self.wiring: Wiring = wiring(service, settings, turn_roots, agent_digest)
        self.health = health.Health()
        self.app: FastStream = service_app(self.wiring, logger, self.health)
        health.keep(self.app, self.health)
        keys = topology.service(service).keys if service in topology.names() else ()  # as the wiring's inputs
        self.app.on_startup(lambda: settings.refuse_unfit_keys(service, keys, holds_calls))
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._close_hooked = False

    @property
    def broker(self) -> KafkaBroker:
        return self.wiring.broker

    @property
    def consumers(self) -> list[KeyOrderedConsumer]:
        return self.wiring.consumers

    def topic(self, name: str) -> str:
        return self.wiring.topic(name)

    def subscribe(self, topic: str, **options: Any) -> Callable[[Callable[[Any], Awaitable[Any]]], Any]:
        return subscribe(self.wiring, topic, self.settings, **options)

    def outlet(self, topic: str, schema: type[BaseModel], description: str = "") -> Outlet:
        return Outlet(self.wiring, topic, schema, description)

    def closes(self, close: Callable[[], Awaitable[None]]) -> None:
        """Close `close` after the app stops (what is registered last closes first)."""
        if not self._close_hooked:
            self._close_hooked = True
            self.app.after_shutdown(self._close_all)
        self._closers.append(close)

    def opens(
        self, name: str, open_: Callable[[], Awaitable[T | None]], close: Callable[[T], Awaitable[None]]
    ) -> Opened[T]:
        """Open with `open_()` when the app starts, then `close(it)` after it stops (not if it opened nothing)."""
        opened: Opened[T] = Opened(name)
        self.closes(lambda: close(opened.value) if opened.value is not None else _nothing())

        async def start() -> None:
            opened.value = await open_()

        self.app.on_startup(start)
        return opened

    def fence(self) -> OpenedFence:
        """The turn fence on the ledger, opened at start with the fleet's pool size, closed at stop."""
        settings = self.settings
        return OpenedFence(
            self.opens(
                "the fence",
                lambda: Fence.open(settings.ledger_db_url, pool_size=settings.database_pool_size),
                Fence.close,
            )
        )

    def runs(self, task: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `task()` once the app has started (its consumers too), cancelled when the app stops."""
        running: list[asyncio.Task[None]] = []

        async def start() -> None:
            running.append(asyncio.create_task(task(), name=getattr(task, "__name__", "task")))

        async def stop() -> None:
            for each in running:
                each.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await each
            running.clear()

        self.app.after_startup(start)
        self.app.on_shutdown(stop)

    def serves(self, server: Server) -> None:
        """Serve `server` once the app has started; stop it first when the app stops (before what it reads closes)."""
        self.app.after_startup(server.serve)
        self.app.on_shutdown(server.stop)

    async def _close_all(self) -> None:
        while self._closers:
            await self._closers.pop()()


async def _nothing() -> None:
    return None
