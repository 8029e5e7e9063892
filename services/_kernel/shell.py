"""A service's shell: its wiring, its app, and what it opens at start and closes after stop (in reverse order).

A service's `build(settings, agent)` makes one, subscribes its core's handlers on it and returns `shell.app`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from faststream import FastStream
from faststream.kafka import KafkaBroker
from pydantic import BaseModel

from roundtrip._kernel.kafka.consumer import KeyOrderedConsumer
from roundtrip._kernel.kafka.messaging import Outlet, Wiring, service_app, subscribe, wiring
from roundtrip._kernel.observability import health
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.turnstore import Fence

T = TypeVar("T")


class Opened(Generic[T]):
    """What the shell opens when the service starts; calling it gives the open thing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.value: T | None = None

    def __call__(self) -> T:
        if self.value is None:
            raise RuntimeError(f"{self.name} is opened when the service starts")
        return self.value


class Shell:
    """One service's name, broker, topic prefix, consumers, health checks, app and lifecycle."""

    def __init__(
        self,
        service: str,
        settings: Settings,
        logger: logging.Logger,
        turn_roots: tuple[str, ...] = (),
        agent_digest: str = "",
    ) -> None:
        self.settings = settings
        self.wiring: Wiring = wiring(service, settings, turn_roots, agent_digest)
        self.health = health.Health()
        self.app: FastStream = service_app(self.wiring, logger, self.health)
        health.keep(self.app, self.health)
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
        self, name: str, open_: Callable[[], Awaitable[T | None]], close: Callable[[T], Awaitable[None]] | None = None
    ) -> Opened[T]:
        """Open with `open_()` when the app starts, then `close(it)` after it stops (not if it opened nothing)."""
        opened: Opened[T] = Opened(name)
        if close is not None:
            self.closes(lambda: close(opened.value) if opened.value is not None else _nothing())

        async def start() -> None:
            opened.value = await open_()

        self.app.on_startup(start)
        return opened

    def fence(self) -> Opened[Fence]:
        """The turn fence on the ledger, opened at start with the fleet's pool size, closed at stop."""
        settings = self.settings
        return self.opens(
            "the fence",
            lambda: Fence.open(settings.ledger_db_url, pool_size=settings.database_pool_size),
            Fence.close,
        )

    async def _close_all(self) -> None:
        while self._closers:
            await self._closers.pop()()


async def _nothing() -> None:
    return None
