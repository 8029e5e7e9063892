"""A service's shell opens what its handlers need when the app starts and closes it after the app stops."""

from __future__ import annotations

import logging

import pytest
from faststream import TestApp
from faststream.kafka import TestKafkaBroker

from roundtrip._kernel.settings import Settings
from roundtrip._kernel.shell import Shell


async def test_what_the_shell_opens_is_there_from_the_start_and_closed_after_the_stop_in_reverse_order():
    shell = Shell("shelltest", Settings(_env_file=None), logging.getLogger("roundtrip.shelltest"))
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
