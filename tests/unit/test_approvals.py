import pytest

from roundtrip._kernel.wire.approvals import ApprovalError, Signer, parse_keys
from roundtrip._kernel.wire.events import CheckedCall, ExecuteToolBatch, Turn

TURN = Turn(turn_id="turn_1", request_id="r1", conversation_id="c1", customer_id="cus_1001")


def batch(**changes) -> ExecuteToolBatch:
    base = ExecuteToolBatch(
        turn=TURN,
        step=1,
        messages=[{"role": "user", "content": "cancel"}],
        calls=[
            CheckedCall(
                id="toolu_1", name="cancel_order", input={"order_id": "ord_a1000003", "reason": "other"}, approved=True
            )
        ],
    )
    return base.model_copy(update=changes)


def test_signed_batch_verifies():
    signer = Signer(parse_keys("k1:secret"))
    signer.verify(signer.sign(batch()))


@pytest.mark.parametrize(
    "tamper",
    [
        lambda b: b.model_copy(
            update={"calls": [b.calls[0].model_copy(update={"input": {"order_id": "ord_9f3c4e21", "reason": "other"}})]}
        ),
        lambda b: b.model_copy(update={"turn": TURN.model_copy(update={"turn_id": "turn_2"})}),
        lambda b: b.model_copy(update={"turn": TURN.model_copy(update={"customer_id": "cus_1002"})}),
        lambda b: b.model_copy(
            update={"calls": [b.calls[0].model_copy(update={"approved": True, "name": "escalate_to_human"})]}
        ),
        lambda b: b.model_copy(update={"step": 2}),
    ],
    ids=["input", "other-turn", "other-customer", "tool-name", "step"],
)
def test_tampered_batch_is_refused(tamper):
    signer = Signer(parse_keys("k1:secret"))
    with pytest.raises(ApprovalError, match="signature mismatch"):
        signer.verify(tamper(signer.sign(batch())))


def test_unsigned_and_unknown_key_are_refused():
    signer = Signer(parse_keys("k1:secret"))
    with pytest.raises(ApprovalError, match="unsigned"):
        signer.verify(batch())
    other = Signer(parse_keys("k9:other"))
    with pytest.raises(ApprovalError, match="unknown key"):
        signer.verify(other.sign(batch()))


def test_keys_rotate_old_key_still_verifies_new_key_signs():
    old = Signer(parse_keys("k1:one"))
    rotated = Signer(parse_keys("k2:two,k1:one"))
    rotated.verify(old.sign(batch()))
    assert rotated.sign(batch()).key_id == "k2"


def test_bad_key_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="key_id:secret"):
        parse_keys("justasecret")
