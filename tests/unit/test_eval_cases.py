"""`roundtrip eval`'s parts that need no fleet: cases read and refused with one line, a turn's expectations checked
against what the topics told, the baseline's regressions and changes, the JUnit XML (issue 45). The runs through the
fleet: tests/e2e/test_eval_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

import roundtrip._shop.agent
from roundtrip._cli.evals.cases import CaseError, load_suite, parse_case
from roundtrip._cli.evals.record import turn_case
from roundtrip._cli.evals.report import changes, junit, summary
from roundtrip._cli.evals.runner import CaseResult, RunResult
from roundtrip._cli.evals.verdict import Observed, failures
from roundtrip._kernel.wire.events import Outcome, SupportReply, Usage
from tests.skeletons import agent_files

SHOP_SUITE = Path(roundtrip._shop.agent.__file__).parent / "evals"


def _reply(outcome: str = "end_turn", text: str = "Order ord_a1000003 is on its way.", steps: int = 2) -> SupportReply:
    return SupportReply(
        request_id="req_1",
        conversation_id="conv_1",
        customer_id="cus_1001",
        turn_id="turn_1",
        text=text,
        outcome=Outcome(outcome),
        steps=steps,
        usage=Usage(input_tokens=100, output_tokens=20),
        cost_usd=0.002,
        trace_id="ab" * 16,
    )


def _case(**raw):
    return parse_case(Path("case.json"), {"customer": "cus_1001", "message": "hi", **raw})


def test_the_demo_shops_suite_and_the_skeletons_cases_are_sound():
    cases = load_suite([SHOP_SUITE])
    assert len(cases) >= 10
    names = {c.name for c in cases}
    assert {"foreign-order-cancel", "invented-order-id", "runaway-repeated-call", "held-cancel-denied"} <= names
    own = [(Path(p), json.loads(text)) for p, text in agent_files("desk").items() if p.startswith("evals/")]
    assert len(own) == 2 and all(parse_case(path, raw).turns[0].script for path, raw in own)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"expect": {"outcomes": "end_turn"}}, "unknown expectation 'outcomes'"),
        ({"expect": {"outcome": "done"}}, "unknown outcome 'done'"),
        ({"expect": {"refused": [{"tool": "x", "why": "y"}]}}, 'expected {"tool": NAME, "because": WORDS}'),
        ({"script": [[{"type": "tool_use"}]]}, "response 1: a block is"),
        ({"decide": "maybe"}, "expected approve or deny"),
        ({"runs": 0}, "runs must be at least 1"),
        ({"persona": "careful", "script": ["hi"]}, "a script or a persona, not both"),
        ({"persona": "carefull"}, "persona: unknown persona 'carefull'; the simulator's personas are: careful, "),
        ({"turns": [{"message": "a"}]}, "either turns or message"),
    ],
)
def test_a_wrong_case_is_refused_with_one_line_naming_its_file(raw, said):
    with pytest.raises(CaseError) as refused:
        _case(**raw)
    assert said in str(refused.value) and str(refused.value).startswith("case.json")


def test_a_missing_suite_and_two_cases_of_one_name_are_refused(tmp_path):
    with pytest.raises(CaseError, match="no such file or folder"):
        load_suite([tmp_path / "nosuch"])
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"name": "same", "customer": "c", "message": "hi"}))
    with pytest.raises(CaseError, match="case 'same' is also"):
        load_suite([tmp_path])


def test_a_turn_keeping_its_expectations_has_no_failure_and_each_broken_one_is_said():
    seen = Observed("req_1", calls={"t1": "list_orders", "t2": "cancel_order"}, reply=_reply())
    seen.refused["t2"] = ("cancel_order", "Order ord_9f3c4e21 was not found among this customer's orders.")
    kept = _case(
        expect={
            "outcome": ["end_turn", "max_tokens"],
            "tools_called": "list_orders",
            "refused": [{"tool": "cancel_order", "because": "was NOT found"}],
            "held": [],
            "max_steps": 2,
            "reply_contains": ["ORD_A1000003"],
        }
    )
    assert failures(kept.turns[0].expect, seen) == []
    broken = _case(
        expect={
            "outcome": "repeated_call",
            "tools_not_called": ["cancel_order"],
            "refused": [],
            "held": [{"tool": "cancel_order"}],
            "max_steps": 1,
            "max_cost_usd": 0.001,
            "reply_not_contains": ["on its way"],
        }
    )
    said = failures(broken.turns[0].expect, seen)
    assert said == [
        "outcome end_turn, expected repeated_call",
        "cancel_order called",
        "no call refused expected, got cancel_order (Order ord_9f3c4e21 was not found among this customer's orders.)",
        "cancel_order held expected (calls held: none)",
        "2 steps, at most 1 expected",
        "cost $0.0020, at most $0.0010 expected",
        "the reply says 'on its way'",
    ]
    assert failures(kept.turns[0].expect, Observed("req_2")) == ["no reply"]


def _result(name: str, *passed: bool, tools=("list_orders",), cost=0.002) -> CaseResult:
    runs = [
        RunResult(
            failures=[] if ok else ["outcome x"],
            outcome="end_turn",
            steps=2,
            tools=list(tools),
            cost_usd=cost,
            seconds=1.5,
            conversation=f"conv_{i}",
        )
        for i, ok in enumerate(passed)
    ]
    return CaseResult(parse_case(Path(f"{name}.json"), {"customer": "c", "message": "hi"}), runs)


def test_against_a_baseline_a_drop_of_a_pass_rate_and_a_new_failing_case_are_regressions_the_rest_changes():
    baseline = {
        "steady": summary(_result("steady", True, True)),
        "dropped": summary(_result("dropped", True, True)),
        "dearer": summary(_result("dearer", True)),
        "gone": summary(_result("gone", True)),
    }
    now = [
        _result("steady", True, True),
        _result("dropped", True, False),
        _result("dearer", True, tools=("list_orders", "lookup_order"), cost=0.004),
        _result("new", False),
    ]
    said = [(c.case, c.regression, c.said) for c in changes(now, baseline)]
    assert said == [
        ("dropped", True, "pass rate 100% -> 50%"),
        ("dearer", False, "tools +lookup_order"),
        ("dearer", False, "cost $0.0020 -> $0.0040"),
        ("new", True, "new case, failing"),
        ("gone", False, "no longer in the suite"),
    ]


def test_the_junit_xml_has_a_testcase_per_case_with_its_failures_and_pass_rate():
    skipped = CaseResult(parse_case(Path("held.json"), {"customer": "c", "message": "hi"}), skipped="needs X")
    xml = junit([_result("good", True), _result("bad", True, False), skipped], "shop")
    suite = ElementTree.fromstring(xml.split("\n", 1)[1])
    assert (suite.get("name"), suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (
        "shop",
        "3",
        "1",
        "1",
    )
    good, bad, held = suite.findall("testcase")
    assert good.find("failure") is None and good.get("time") == "1.500"
    assert bad.find("failure").get("message") == "pass rate 50%, at least 100% expected"
    assert bad.find("failure").text == "run 2 (conv_1): outcome x"
    assert held.find("skipped").get("message") == "needs X"
    assert bad.find("properties/property[@name='pass_rate']").get("value") == "0.5"


def test_a_recorded_turn_is_its_customers_words_the_models_responses_and_what_it_did():
    exchange = [
        {"role": "user", "content": [{"type": "text", "text": "Show me my orders"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "list_orders", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "{}"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "You have 4 orders."}]},
    ]
    turn, note = turn_case(exchange, "end_turn", 2)
    assert note is None
    assert turn == {
        "message": "Show me my orders",
        "script": [
            [{"type": "tool_use", "name": "list_orders", "input": {}}],
            [{"type": "text", "text": "You have 4 orders."}],
        ],
        "expect": {"outcome": "end_turn", "tools_called": ["list_orders"], "max_steps": 2},
    }
    parse_case(Path("recorded.json"), {"customer": "cus_1001", "turns": [turn]})  # a case as it is written
    _, note = turn_case(exchange, "repeated_call", 3)
    assert note is not None and "repeated_call" in note
