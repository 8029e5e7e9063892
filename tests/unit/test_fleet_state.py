"""Operator commands read the running fleet's settings, not their shell's (services/_fleet/state.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from roundtrip._fleet import state as fleet_state
from roundtrip._fleet.supervisor import claim_folder, release_folder

FLEET = {
    "ROUNDTRIP_LEDGER_DATABASE_URL": "postgresql+asyncpg://rt:pw@db/ledger",
    "ROUNDTRIP_TOPIC_PREFIX": "prod.",
    "ROUNDTRIP_INSTANCE_ID": "host-gateway",
    "PATH": "/usr/bin",
}


def test_up_records_its_services_settings_for_its_user_only_and_a_command_takes_them(tmp_path, monkeypatch):
    claimed = claim_folder(tmp_path)
    path = fleet_state.record(tmp_path, FLEET)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # database URLs and keys: its user's only
    shell = {
        "ROUNDTRIP_LEDGER_DATABASE_URL": "sqlite+aiosqlite:///old.db",
        "ROUNDTRIP_LOG_LEVEL": "DEBUG",
        "HOME": "/h",
    }
    monkeypatch.setattr(os, "environ", shell)  # the shell this command runs in
    reading = fleet_state.adopt(tmp_path)
    assert reading.pid == os.getpid()
    assert shell == {
        "HOME": "/h",
        "ROUNDTRIP_LEDGER_DATABASE_URL": "postgresql+asyncpg://rt:pw@db/ledger",
        "ROUNDTRIP_TOPIC_PREFIX": "prod.",
        "ROUNDTRIP_STATE_DIR": str(tmp_path.resolve()),
    }  # the fleet's, whole
    assert reading.differ == ["ROUNDTRIP_LEDGER_DATABASE_URL", "ROUNDTRIP_LOG_LEVEL"]
    lines = reading.lines("postgresql+asyncpg://rt:***@db/ledger")
    assert (
        f"the fleet running in {tmp_path.resolve()} (pid {os.getpid()})" in lines[0] and "rt:***@db/ledger" in lines[0]
    )
    assert lines[1].startswith(
        "warning: this shell's ROUNDTRIP_LEDGER_DATABASE_URL, ROUNDTRIP_LOG_LEVEL differ from the fleet's"
    )
    release_folder(claimed)
    fleet_state.forget(tmp_path)
    assert not path.exists()


def test_a_shell_that_agrees_with_the_fleet_is_told_nothing_differs(tmp_path, monkeypatch):
    claim_folder(tmp_path)
    fleet_state.record(tmp_path, FLEET)
    shell = {"ROUNDTRIP_TOPIC_PREFIX": "prod.", "ROUNDTRIP_STATE_DIR": str(tmp_path / ".")}
    monkeypatch.setattr(os, "environ", shell)  # the shell this command runs in
    reading = fleet_state.adopt(tmp_path)
    assert reading.differ == [] and len(reading.lines("x")) == 1


def test_without_a_running_fleet_the_shells_settings_are_read_and_the_command_says_so(tmp_path, monkeypatch):
    shell = {"ROUNDTRIP_TOPIC_PREFIX": "dev."}
    monkeypatch.setattr(os, "environ", shell)  # the shell this command runs in
    assert fleet_state.adopt(tmp_path).pid is None and shell == {"ROUNDTRIP_TOPIC_PREFIX": "dev."}
    (line,) = fleet_state.Reading(tmp_path).lines("sqlite+aiosqlite:///x/ledger.db")
    assert line.startswith(f"no fleet runs in {tmp_path.resolve()}") and "this shell's settings" in line


def test_the_record_of_a_fleet_that_is_gone_is_not_read(tmp_path, monkeypatch):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    (tmp_path / "fleet.pid").write_text(f"{gone}\n")
    (tmp_path / "fleet.json").write_text(f'{{"pid": {gone}, "env": {{"ROUNDTRIP_TOPIC_PREFIX": "old."}}}}')
    shell: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", shell)  # the shell this command runs in
    assert fleet_state.adopt(tmp_path).pid is None and shell == {}


def test_a_setting_only_the_commands_read_stays_the_shells(tmp_path, monkeypatch):
    claimed = claim_folder(tmp_path)
    fleet_state.record(tmp_path, {**FLEET, "ROUNDTRIP_JAEGER_QUERY_URL": "http://jaeger:16686"})
    shell = {"ROUNDTRIP_JAEGER_QUERY_URL": "http://127.0.0.1:16686"}  # where this operator reaches Jaeger
    monkeypatch.setattr(os, "environ", shell)  # the shell this command runs in
    reading = fleet_state.adopt(tmp_path)
    assert shell["ROUNDTRIP_JAEGER_QUERY_URL"] == "http://127.0.0.1:16686" and reading.differ == []
    assert shell["ROUNDTRIP_TOPIC_PREFIX"] == "prod."  # the fleet's settings otherwise
    release_folder(claimed)
