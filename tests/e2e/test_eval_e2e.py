"""`roundtrip eval` through the whole fleet (issue 45): the demo shop's suite against the simulator, its JUnit XML
read back, and a conversation the fleet had recorded as a case that then passes.

The CLI runs as a process of its own against the session's fleet, as a user's CI would (tests/e2e/conftest.py).
The held-approval case needs the gate's approval threshold: the gate is restarted with one for that test.
A fleet of its own runs the shop's agent with its ownership rule removed (tests/unowned_shop.py): the suite then
fails exactly the cases that depend on the rule.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from xml.etree import ElementTree

import pytest

import roundtrip._shop.agent
from roundtrip._broker.embedded import free_port
from roundtrip._fleet.launcher import Fleet
from tests.agents import ShopFleetSettings
from tests.e2e.conftest import fleet_env
from tests.signing import key_settings

SUITE = Path(roundtrip._shop.agent.__file__).parent / "evals"
THRESHOLD = 10000  # cents: Bob's ord_9f3c4e21 (249.00 EUR) waits for a person


def roundtrip_eval(fleet_settings, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "eval", *args],
        env={**os.environ, **fleet_settings[1], **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


async def test_the_demo_shops_suite_passes_against_the_simulator_and_its_junit_says_so(fleet, fleet_settings, tmp_path):
    junit, baseline = tmp_path / "eval.xml", tmp_path / "baseline.json"
    async with fleet.reconfigured(("gate",), approval_cancel_above_cents=THRESHOLD):
        ran = await asyncio.to_thread(
            roundtrip_eval,
            fleet_settings,
            "run",
            str(SUITE),
            "--junit",
            str(junit),
            "--save-baseline",
            str(baseline),
            ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS=str(THRESHOLD),
        )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    cases = sorted(p.stem for p in SUITE.glob("*.json"))
    assert len(cases) >= 10
    suite = ElementTree.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("name") == "evals"
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (str(len(cases)), "0", "0")
    testcases = suite.findall("testcase")
    assert sorted(t.get("name") for t in testcases) == cases
    assert not [t.get("name") for t in testcases if t.find("failure") is not None or t.find("skipped") is not None]
    rates = {t.get("name"): t.find("properties/property[@name='pass_rate']").get("value") for t in testcases}
    assert set(rates.values()) == {"1.0"}
    saved = json.loads(baseline.read_text())["cases"]
    assert saved["runaway-repeated-call"]["outcome"] == "repeated_call"
    assert saved["held-cancel-denied"]["tools"] == ["cancel_order"]
    assert f"{len(cases)} passed, 0 failed, 0 skipped of {len(cases)} cases" in ran.stdout, ran.stdout


async def test_without_the_approval_threshold_the_held_case_is_skipped_and_says_why(fleet_settings, tmp_path):
    ran = await asyncio.to_thread(roundtrip_eval, fleet_settings, "run", str(SUITE / "held-cancel-denied.json"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "skip  held-cancel-denied (needs ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS)" in ran.stdout


async def test_a_recorded_conversation_becomes_a_case_that_passes(client, fleet_settings, tmp_path):
    conversation = f"conv_rec_{uuid.uuid4().hex[:8]}"
    for text in ("Show me my orders", "Where is my order?"):
        request_id = await client.ask(text, "cus_1001", persona="careful", conversation_id=conversation)
        assert (await client.reply(request_id, timeout=120)).outcome.value == "end_turn"
    case = tmp_path / "recorded.json"
    recorded = await asyncio.to_thread(roundtrip_eval, fleet_settings, "record", conversation, "--out", str(case))
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    written = json.loads(case.read_text())
    assert written["customer"] == "cus_1001" and len(written["turns"]) == 2
    first, second = written["turns"]
    assert first["message"] == "Show me my orders" and first["expect"]["tools_called"] == ["list_orders"]
    assert "get_shipping_status" in second["expect"]["tools_called"]
    assert first["script"][0][0]["type"] == "tool_use"  # the model's responses, played by the simulator
    ran = await asyncio.to_thread(roundtrip_eval, fleet_settings, "run", str(case))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed, 0 failed" in ran.stdout


async def test_a_case_that_breaks_its_expectation_fails_the_run_and_names_why(fleet_settings, tmp_path):
    case = tmp_path / "wrong.json"
    case.write_text(
        json.dumps(
            {
                "customer": "cus_1001",
                "message": "Show me my orders",
                "persona": "careful",
                "expect": {"tools_called": ["cancel_order"], "reply_contains": ["no such words here"]},
            }
        )
    )
    ran = await asyncio.to_thread(roundtrip_eval, fleet_settings, "run", str(case))
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "cancel_order not called (called: list_orders)" in ran.stdout
    assert "the reply does not say 'no such words here'" in ran.stdout


OWNERSHIP_CASES = {"foreign-order-cancel", "foreign-order-lookup"}  # the suite's cases the ownership rule decides


@pytest.fixture(scope="module")
def unowned_fleet(kafka_bootstrap, tmp_path_factory):
    state = tmp_path_factory.mktemp("unowned-fleet")
    values = dict(
        agent="tests.unowned_shop:AGENT",
        kafka_bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"uo{uuid.uuid4().hex[:6]}.",
        state_dir=state,
        simulator_port=free_port(),
        console_port=free_port(),
        shop_port=free_port(),
        partitions=2,
        max_steps=10,
        approval_cancel_above_cents=THRESHOLD,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        **key_settings("uo1"),  # fresh pairs, never the published development keys
    )
    env = fleet_env(**values)
    with Fleet(ShopFleetSettings(**values), env=env, executor_replicas=1):
        yield env


async def test_without_its_ownership_rule_the_agent_fails_exactly_the_cases_that_depend_on_it(unowned_fleet, tmp_path):
    junit = tmp_path / "eval.xml"
    ran = await asyncio.to_thread(roundtrip_eval, (None, unowned_fleet), "run", str(SUITE), "--junit", str(junit))
    assert ran.returncode == 1, ran.stdout + ran.stderr
    testcases = ElementTree.parse(junit).getroot().findall("testcase")
    failed = {t.get("name") for t in testcases if t.find("failure") is not None}
    assert failed == OWNERSHIP_CASES, ran.stdout
    assert not [t.get("name") for t in testcases if t.find("skipped") is not None]
