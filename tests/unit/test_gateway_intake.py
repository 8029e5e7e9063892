"""The gateway's door (services/_gateway/intake.py): unknown fields ignored once-logged, refusals with a reason."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from roundtrip._gateway import intake
from roundtrip._gateway.turns import reply_for, start_turn
from roundtrip._kernel.wire.events import Outcome, SupportRequest, TurnEnded, Usage


def _request(**fields) -> SupportRequest:
    return SupportRequest.model_validate(
        {"request_id": "req_1", "conversation_id": "conv_1", "customer_id": "cus_1001", "text": "hello", **fields}
    )


def _ignored() -> float:
    return REGISTRY.get_sample_value("roundtrip_ignored_fields_total", {"message": "SupportRequest"}) or 0.0


def test_unknown_fields_are_ignored_logged_once_per_name_and_counted(caplog):
    before = _ignored()
    unknown = intake.UnknownFields()
    with caplog.at_level(logging.WARNING, "roundtrip.gateway"):
        for _ in range(3):
            unknown.note(_request(locale_unit_test="de", channel_unit_test="web"))
        intake.UnknownFields().note(_request(locale_unit_test="de"))  # another gateway logs it once too
    logged = [r.getMessage() for r in caplog.records if "the fleet does not know" in r.getMessage()]
    assert len(logged) == 3 and sum("locale_unit_test" in m for m in logged) == 2
    assert _ignored() - before == 7


def test_metadata_travels_with_the_turn_to_the_reply():
    request = _request(metadata={"locale": "de", "tier": {"level": 2}})
    turn = start_turn(request, "ab" * 16).turn
    assert turn.metadata == {"locale": "de", "tier": {"level": 2}}
    reply = reply_for(TurnEnded(turn=turn, step=1, outcome=Outcome.END_TURN, text="Hi"))
    assert reply.metadata == request.metadata and reply.reason is None


@pytest.mark.parametrize(
    "metadata", [{str(i): i for i in range(33)}, {"": 1}, {"k" * 65: 1}, {"big": "x" * 5000}, ["not", "an object"]]
)
def test_metadata_out_of_bounds_is_a_schema_violation(metadata):
    with pytest.raises(ValidationError):
        _request(metadata=metadata)


def test_a_record_must_be_keyed_by_its_conversation_id():
    intake.check_key(_request(), b"conv_1")
    for key, shown in ((None, "no key"), (b"conv_2", "'conv_2'")):
        with pytest.raises(intake.InvalidRequest, match=shown) as refused:
            intake.check_key(_request(), key)
        assert refused.value.kind == "key"


def test_a_request_id_reused_with_other_content_is_refused_and_a_copy_is_a_duplicate():
    seen = intake.SeenRequests(memory_s=3600.0)
    assert seen.add("turn_1", _request(unknown_is_not_content=1)) is True
    assert seen.add("turn_1", _request()) is False  # a copy (unknown fields are not its content)
    for other in (_request(text="other"), _request(customer_id="cus_1002"), _request(metadata={"a": 1})):
        with pytest.raises(intake.InvalidRequest, match="used before") as refused:
            seen.add("turn_1", other)
        assert refused.value.kind == "reused"
    assert seen.add("turn_1", _request()) is False


@pytest.mark.parametrize(
    "value, ids",
    [
        (
            b'{"request_id": "r", "conversation_id": "c"}',
            {"request_id": "r", "conversation_id": "c", "customer_id": ""},
        ),
        (
            b'{"request_id": "r", "conversation_id": "c", "customer_id": "cus_1"}',
            {"request_id": "r", "conversation_id": "c", "customer_id": "cus_1"},
        ),
        (
            b'{"request_id": "r", "conversation_id": "c", "customer_id": 7}',
            {"request_id": "r", "conversation_id": "c", "customer_id": ""},
        ),
        (b'{"request_id": "r"}', None),
        (b'{"request_id": "", "conversation_id": "c"}', None),
        (b"[1]", None),
        (b"{not json", None),
        (b"", None),
        (b"[" * 10_000, None),
        (json.dumps({"request_id": "r" * 201, "conversation_id": "c"}).encode(), None),
    ],
)
def test_only_a_record_naming_its_request_and_conversation_is_answered(value, ids):
    assert intake.addressed(value) == ids


async def test_the_failure_hook_answers_schema_and_door_refusals_only():
    sent = []

    async def reply(message, conversation_id):
        sent.append((message, conversation_id))

    hook = intake.refuser(reply)
    record = SimpleNamespace(value=b'{"request_id": "r", "conversation_id": "c", "text": ""}')
    try:
        SupportRequest.model_validate_json(record.value)
    except ValidationError as exc:
        await hook(record, exc, "schema violation: customer_id: Field required")
    await hook(record, intake.InvalidRequest("key", "the record has no key"), "InvalidRequest: the record has no key")
    await hook(
        record, ConnectionError("broker away"), "ConnectionError: broker away"
    )  # the fleet's failure: no refusal
    assert [(m.outcome, m.reason, c) for m, c in sent] == [
        (Outcome.INVALID_REQUEST, "schema violation: customer_id: Field required", "c"),
        (Outcome.INVALID_REQUEST, "the record has no key", "c"),
    ]
    assert all(m.turn_id == "" and m.steps == 0 and m.usage == Usage() and m.text for m, _ in sent)


async def test_a_refusal_carries_the_requests_metadata_when_it_is_valid_and_none_otherwise():
    sent = []

    async def reply(message, conversation_id):
        sent.append(message)

    hook = intake.refuser(reply)
    for metadata in ({"locale": "de", "tier": {"level": 2}}, {"k" * 65: 1}):
        value = json.dumps({"request_id": "r", "conversation_id": "c", "customer_id": 7, "metadata": metadata})
        record = SimpleNamespace(value=value.encode())
        try:
            SupportRequest.model_validate_json(record.value)
        except ValidationError as exc:
            await hook(record, exc, "schema violation")
    valid, invalid = sent
    assert valid.outcome is Outcome.INVALID_REQUEST and valid.metadata == {"locale": "de", "tier": {"level": 2}}
    assert invalid.metadata is None  # metadata that breaks the contract is not echoed


@pytest.mark.parametrize(
    ("kind", "head"), [("key", "request not keyed by its conversation"), ("reused", "request id reused")]
)
def test_a_refused_requests_dead_letter_is_counted_by_what_was_wrong_not_by_the_exceptions_name(kind, head):
    from roundtrip._console.letters import kind_of
    from roundtrip._kernel.kafka.messaging import describe_error

    reason = describe_error(intake.InvalidRequest(kind, "the record has key 'x': a request must be keyed by ..."))
    assert reason.startswith(f"{head}: the record has key 'x'") and kind_of(reason) == head
    assert kind_of(describe_error(RuntimeError("boom"))) == "RuntimeError"  # any other: its exception's name
