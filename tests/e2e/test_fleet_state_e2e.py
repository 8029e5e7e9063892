"""Operator commands read the running fleet's state, not their shell's (issue 22): a fleet on PostgreSQL, another topic
prefix and a broker of its own, and a shell in its folder with no ROUNDTRIP_* setting at all. `roundtrip ask`, `turns`
and `config` there find the fleet, say which one they read, and name what the shell sets otherwise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.settings import Settings
from tests.signing import key_settings


@pytest.fixture
def fleet_on_postgres(kafka_bootstrap, postgres_database, tmp_path):
    values = dict(
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=f"fs{uuid.uuid4().hex[:6]}.",
        state_dir=tmp_path / ".roundtrip",
        simulator_port=free_port(),
        console_port=free_port(),
        shop_port=free_port(),
        partitions=2,
        log_level="INFO",
        ledger_database_url=postgres_database,
        conversations_database_url=postgres_database,
        database_allow_shared_login=True,  # one (superuser) login for the fleet on one machine, on purpose
        **key_settings("e2e1"),  # fresh pairs, never the published development keys
    )
    env = {f"ROUNDTRIP_{k.upper()}": str(v) for k, v in values.items()} | {
        "ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS": "5000"
    }
    fleet = Fleet(Settings(**values), env=env)
    fleet.start()
    try:
        yield fleet, postgres_database
    finally:
        fleet.stop()


def _bare_shell(tmp_path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    """`roundtrip ARGS` in the fleet's folder, from a shell with no ROUNDTRIP_* setting (but `extra`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | extra
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_shell_with_no_settings_finds_the_running_fleets_turns_on_postgresql(fleet_on_postgres, tmp_path):
    fleet, ledger = fleet_on_postgres
    state = (tmp_path / ".roundtrip").resolve()
    said = f"the fleet running in {state} (pid {os.getpid()})"

    asked = _bare_shell(tmp_path, "ask", "where is my order?", "--customer", "cus_1001")
    assert asked.returncode == 0, (
        asked.stdout + asked.stderr
    )  # the fleet's broker and topics, which the shell knows nothing of
    assert said in asked.stderr
    turn_id = re.search(r"turn (turn_\w+)", asked.stdout).group(1)

    turns = _bare_shell(tmp_path, "turns")
    assert turns.returncode == 0, turns.stdout + turns.stderr
    assert turn_id in turns.stdout and said in turns.stderr
    assert (
        "postgresql+asyncpg://" in turns.stderr and ledger.rsplit("/", 1)[1] in turns.stderr
    )  # says which ledger it read

    config = _bare_shell(tmp_path, "config")
    assert config.returncode == 0, config.stderr
    assert re.search(r"(?m)^ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS\s+5000$", config.stdout), config.stdout
    assert re.search(r"(?m)^ROUNDTRIP_LEDGER_DATABASE_URL\s+postgresql\+asyncpg://", config.stdout), config.stdout

    # a shell pointing elsewhere is told so, and still reads the fleet's turns
    elsewhere = _bare_shell(
        tmp_path, "turns", ROUNDTRIP_LEDGER_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    )
    assert elsewhere.returncode == 0 and turn_id in elsewhere.stdout, elsewhere.stdout + elsewhere.stderr
    assert (
        "warning: this shell's ROUNDTRIP_LEDGER_DATABASE_URL differs from the fleet's; the fleet's is used"
        in elsewhere.stderr
    )

    fleet.stop()  # no fleet there any more: the shell's own settings, and it says so
    gone = _bare_shell(tmp_path, "turns")
    assert f"no fleet runs in {state}" in gone.stderr and turn_id not in gone.stdout, gone.stdout + gone.stderr
