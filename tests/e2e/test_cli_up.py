"""The README's main job, as a user runs it: `roundtrip up`, then `roundtrip ask` in another terminal, then Ctrl-C."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from roundtrip._broker.embedded import port_is_free
from tests.e2e.up_process import roundtrip_up
from tests.unit.test_readme import ask_example, matches_example


@pytest.fixture
def up(tmp_path):
    with roundtrip_up(tmp_path) as running:
        yield running


def test_up_then_ask_cancels_the_customers_last_order_and_ctrl_c_stops_everything(up):
    process, env, log = up
    output = log.read_text()
    for name in ("kafka", "simulator", "shop", "gateway", "model", "guard", "gate", "executor"):
        assert f"  {name}" in output  # says where each listens
    # each wait that can take seconds is said before it starts
    assert output.index("  waiting for Kafka to serve on") < output.index("  kafka      ")
    assert output.index("  executor ") < output.index("  waiting for the services to say they are ready")
    pids = [int(pid) for pid in re.findall(r"\(pid (\d+),", output)]
    assert len(pids) == 8  # simulator, shop, the five services and the console (the broker's port: below)

    shop = f"http://127.0.0.1:{env['ROUNDTRIP_SHOP_PORT']}"
    before = {o["order_id"]: o["status"] for o in httpx.get(f"{shop}/admin/orders").json()["orders"]}
    ask = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "ask", "cancel my last order", "--customer", "cus_1001"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    after = {o["order_id"]: o["status"] for o in httpx.get(f"{shop}/admin/orders").json()["orders"]}

    assert ask.returncode == 0, ask.stdout + ask.stderr
    assert "step 1 model" in ask.stdout and "calls list_orders" in ask.stdout and "approved" in ask.stdout
    assert "end_turn" in ask.stdout and "I've cancelled order ord_a1000003" in ask.stdout
    assert {oid for oid in before if before[oid] != after[oid]} == {
        "ord_a1000003"
    }  # Alice's newest cancellable, nothing else
    assert after["ord_a1000003"] == "cancelled"
    # what the README shows for this first ask is what a real run prints: each line, the token figures too
    args, shown = ask_example()
    assert shlex.split(args) == ["cancel my last order", "--customer", "cus_1001"]
    real, expected = (
        [line for line in ask.stdout.splitlines() if line.strip()],
        [line for line in shown if line.strip()],
    )
    assert len(real) == len(expected) and all(map(matches_example, expected, real)), "\n".join(
        f"{'  ' if matches_example(e, r) else '≠ '}{e}\n  {r}"
        for e, r in zip(expected, real, strict=False)  # the lengths may differ: shown above
    )

    process.send_signal(signal.SIGINT)  # Ctrl-C
    assert process.wait(timeout=60) == 0
    assert "roundtrip: stopped" in log.read_text()
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    assert port_is_free(int(env["ROUNDTRIP_KAFKA_PORT"])) and port_is_free(int(env["ROUNDTRIP_SHOP_PORT"]))


def test_a_second_fleet_is_told_what_runs_there(up, tmp_path):
    process, env, output = up
    # the same state folder: which fleet runs there, not which port is taken
    second = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "up"], env=env, capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 1 and "starting the fleet" not in second.stdout
    assert f"a fleet is already running in {(tmp_path / 'state').resolve()} (pid {process.pid})" in second.stderr
    # another folder on the same ports: the ports, and the settings that move them
    elsewhere = {**env, "ROUNDTRIP_STATE_DIR": str(tmp_path / "elsewhere")}
    third = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "up"], env=elsewhere, capture_output=True, text=True, timeout=60
    )
    assert third.returncode == 1
    assert "is already in use" in third.stderr and "ROUNDTRIP_KAFKA_PORT" in third.stderr
    # the banner's command runs from the user's shell as printed (PATH has no .venv/bin here)
    command = re.search(r"^  (\S+) ask ", output.read_text(), re.M).group(1)
    assert command == "roundtrip" or Path(command).is_file(), command
