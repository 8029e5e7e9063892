"""A service's shell opens what its handlers need when the app starts and closes it after the app stops; it holds
the service's health checks."""

from __future__ import annotations

import logging

import pytest
from faststream import FastStream, TestApp
from faststream.kafka import KafkaBroker, TestKafkaBroker
from pydantic import BaseModel

from roundtrip._kernel.observability import health
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Shell


async def test_what_the_shell_opens_is_there_from_the_start_and_closed_after_the_stop_in_reverse_order():
    shell = Shell("shelltest", Settings(_env_file=None), logging.getLogger("roundtrip.shelltest"), "", False)
    said: list[str] = []

    def opener(name: str, value: str | None):
        async def open_() -> str | None:
            said.append(f"open {name}")
            return value

        return open_

    async def close(value: str) -> None:
        said.append(f"close {value}")

    async def close_deps() -> None:
        said.append("close deps")

    first = shell.opens("the first", opener("first", "1"), close)
    shell.closes(close_deps)
    second = shell.opens("the second", opener("second", "2"), close)
    shell.opens("nothing", opener("nothing", None), close)  # opened nothing: nothing to close
    with pytest.raises(RuntimeError, match="the first is opened when the service starts"):
        first()
    async with TestKafkaBroker(shell.broker), TestApp(shell.app):
        assert (first(), second()) == ("1", "2")
        assert said == ["open first", "open second", "open nothing"]
    assert said[3:] == ["close 2", "close deps", "close 1"]


class Ping(BaseModel):
    n: int = 0


async def test_each_shell_holds_its_own_health_checks_and_its_app_carries_them_to_roundtrip_run():
    first, second = (
        Shell(n, Settings(_env_file=None), logging.getLogger(f"roundtrip.{n}"), "", False) for n in ("sh1", "sh2")
    )
    for shell in (first, second):

        @shell.subscribe("pings")
        async def on_ping(ping: Ping) -> None:
            return None

    async with TestKafkaBroker(first.broker), TestApp(first.app):
        assert set(first.health.liveness) == {"consumer sh1"}
        assert set(first.health.readiness) == {"consumer sh1", "dependencies of sh1"}
        assert second.health.liveness == second.health.readiness == {}
    assert first.health.liveness == first.health.readiness == {}  # a stopped service answers for no consumer
    assert health.of(first.app) is first.health and health.of(second.app) is second.health
    assert health.of(FastStream(KafkaBroker())).readiness == {}  # an app built without a shell has none
