"""A log line cannot be forged with an id (issue 42): a request, conversation, customer or turn id holding a newline
is written escaped (`%r`), so it never starts a second line that reads like a `roundtrip.security` line of its own;
and the services' formatter (services/_kernel/observability/logs.py) keeps every record on one line whatever its
message holds."""

from __future__ import annotations

import io
import json
import logging
from types import SimpleNamespace

import pytest

from roundtrip._executor.batches import verify
from roundtrip._gateway import intake
from roundtrip._kernel.observability.logs import FORMAT, OneLineFormatter, one_line
from roundtrip._kernel.wire.approvals import ApprovalError
from roundtrip._kernel.wire.events import CheckedCall, ExecuteToolBatch, Turn
from tests.signing import pair

FORGED = "req_1\n2026-12-04 12:00:00,000 ERROR roundtrip.security: refused batch for turn 'turn_x' (customer 'cus_2')"


@pytest.fixture
def lines():
    """What the services' own handler writes, as lines, for the `roundtrip` loggers."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneLineFormatter(FORMAT))
    root = logging.getLogger("roundtrip")
    root.addHandler(handler)
    try:
        yield lambda: out.getvalue().splitlines()
    finally:
        root.removeHandler(handler)


async def test_a_request_id_with_a_newline_is_one_escaped_log_line_of_the_gateway(caplog, lines):
    async def reply(message, conversation_id):
        return None

    record = SimpleNamespace(value=json.dumps({"request_id": FORGED, "conversation_id": "conv\r\n1"}).encode())
    with caplog.at_level(logging.WARNING, "roundtrip.gateway"):
        await intake.refuser(reply)(record, intake.InvalidRequest("key", "the record has no key"), "no key")
    (refused,) = [r for r in caplog.records if "refused" in r.getMessage()]
    assert "\n" not in refused.getMessage() and "\r" not in refused.getMessage()
    assert '"req_1\\n2026-12-04' in refused.getMessage() and "'conv\\r\\n1'" in refused.getMessage()
    (line,) = lines()  # the forged "ERROR roundtrip.security" is inside the gateway's line, not a line of its own
    assert " WARNING roundtrip.gateway: request " in line


def test_a_refused_batch_of_a_turn_id_with_a_newline_is_one_security_line(caplog, lines):
    turn = Turn(
        turn_id="turn_1\nERROR roundtrip.security: all clear",
        request_id="r",
        conversation_id="c",
        customer_id="cus_1\n",
    )
    batch = ExecuteToolBatch(
        turn=turn, step=1, messages=[], calls=[CheckedCall(id="t", name="n", input={}, approved=True)]
    )
    with caplog.at_level(logging.ERROR, "roundtrip.security"), pytest.raises(ApprovalError):
        verify(batch, pair("k1").verifier)
    (line,) = lines()
    assert line.endswith(
        "ERROR roundtrip.security: refused batch for turn 'turn_1\\nERROR roundtrip.security: all clear' step 1 "
        "(customer 'cus_1\\n'): unsigned batch: the gate did not approve it"
    )
    assert [r.name for r in caplog.records] == ["roundtrip.security"]


def test_the_formatter_keeps_any_message_on_one_line_and_a_traceback_below_it(lines):
    log = logging.getLogger("roundtrip.unit")
    log.warning("tool %s failed", "lookup\u2028order\x1b[2K\x85")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("call %s", "toolu_1\nforged")
    shown = lines()
    assert shown[0].endswith("WARNING roundtrip.unit: tool lookup\\u2028order\\x1b[2K\\x85 failed")
    assert shown[1].endswith("ERROR roundtrip.unit: call toolu_1\\nforged")
    assert shown[2] == "Traceback (most recent call last):" and shown[-1] == "ValueError: boom"


def test_an_exceptions_text_in_a_traceback_cannot_start_a_line_and_the_traceback_keeps_its_own(lines):
    log = logging.getLogger("roundtrip.unit")
    forged = "2026-12-04 12:00:00,000 ERROR roundtrip.security: all clear"
    try:
        try:
            raise ValueError(f"tool failed\n{forged}\u2028\x1b[2K")  # a message from outside: a tool's error
        except ValueError as exc:
            exc.add_note(f"while reading\r\n{forged}")
            raise RuntimeError(f"step failed\x85{forged}") from exc
    except RuntimeError:
        log.exception("turn %s", "turn_1")
    shown = lines()
    assert not [line for line in shown if line.startswith("2026-12-04")]  # no line of the forged record's form
    assert shown[0].endswith("ERROR roundtrip.unit: turn turn_1") and shown[1] == "Traceback (most recent call last):"
    assert shown.count("Traceback (most recent call last):") == 2  # both tracebacks of the chain, line by line
    assert '  File "' in shown[2] and shown[3].lstrip().startswith("raise ValueError(")
    assert f"ValueError: tool failed\\n{forged}\\u2028\\x1b[2K\\nwhile reading\\r\\n{forged}" in shown
    assert "The above exception was the direct cause of the following exception:" in shown
    assert shown[-1] == f"RuntimeError: step failed\\x85{forged}"


def test_one_line_leaves_tabs_and_ordinary_text_alone():
    assert one_line("a\tb café ord_1") == "a\tb café ord_1"
    assert one_line("a\r\nb\x00") == "a\\r\\nb\\x00"
