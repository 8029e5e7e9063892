"""`roundtrip versions drain` on a real (SQLite) ledger: it sends the version no new conversation, waits while a turn
of it runs, says its services may stop only once none does (and not before the guards have read the drain), and gives
up after --timeout with one line and exit 1 (docs/decisions/agent-versions.md, "Drain and retire")."""

from __future__ import annotations

import time

import pytest

from roundtrip._cli import versions as cli
from roundtrip._cli.common import console
from roundtrip._guard.ledger import Ledger
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.versions import Versions
from tests.databases import migrated


@pytest.fixture
async def url(tmp_path):
    return await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(cli, "DRAIN_POLL_S", 0.05)
    monkeypatch.setattr(cli, "DRAIN_SETTLE_S", 0.3)


async def running_turn_on(url: str, version: str) -> Ledger:
    ledger = await Ledger.open(url)
    await ledger.ramp(version, 10.0)
    turn = {"turn_id": "turn_1", "request_id": "req_1", "conversation_id": "conv_1", "customer_id": "cus_1001"}
    assert await ledger.start(turn, "pending", agent_version=version)
    return ledger


async def drained(url: str, version: str, wait: bool, timeout: float) -> tuple[int, str]:
    with console.capture() as said:
        code = await cli.drain_version(Settings(_env_file=None, ledger_database_url=url), version, wait, timeout)
    return code, " ".join(said.get().split())


async def test_a_drain_gives_up_after_its_timeout_while_a_turn_of_the_version_runs(url, quick):
    ledger = await running_turn_on(url, "v2")
    try:
        code, said = await drained(url, "v2", wait=True, timeout=0.2)
        assert code == 1, said
        assert "v2 drains: 1 of its turns still run after 0.2 s: its model, gate and executor must not stop yet" in said
        assert "may stop" not in said
        shares = await ledger.shares()
        assert shares.draining == {"v2"} and shares.shares["v2"] == 0.0  # no new conversation for it meanwhile

        code, said = await drained(url, "v2", wait=False, timeout=0)
        assert code == 0 and "v2 drains: 1 of its turns still run; its services may stop once none does" in said
    finally:
        await ledger.close()


async def test_a_drain_says_the_services_may_stop_once_no_turn_of_the_version_runs_and_the_guards_read_it(url, quick):
    store = await Versions.open(url)
    try:
        await store.ramp("v3", 10.0)
    finally:
        await store.close()
    began = time.monotonic()
    code, said = await drained(url, "v3", wait=True, timeout=0)
    assert code == 0 and "v3 runs no turn and gets none: its model, gate and executor may stop" in said, said
    assert time.monotonic() - began >= cli.DRAIN_SETTLE_S  # a turn a guard started before it read the drain counts
