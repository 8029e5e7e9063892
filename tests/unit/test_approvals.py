"""Ed25519 signatures: what the gate signs only its private key can sign; checking takes public keys only."""

import time

import pytest

from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topology
from roundtrip._kernel.wire.approvals import (
    ApprovalError,
    DecisionVerifier,
    KeyConfigError,
    Signer,
    Verifier,
    approval_id_for,
    input_digest,
    signing_key,
    verify_keys,
)
from roundtrip._kernel.wire.events import (
    ApprovalDecided,
    ApprovalRequested,
    CheckedCall,
    Decision,
    ExecuteToolBatch,
    Turn,
)
from tests.signing import key_settings, pair

TURN = Turn(turn_id="turn_1", request_id="r1", conversation_id="c1", customer_id="cus_1001")
CANCEL = {"order_id": "ord_a1000003", "reason": "other"}
GATE = pair("k1")


def batch(**changes) -> ExecuteToolBatch:
    base = ExecuteToolBatch(
        turn=TURN,
        step=1,
        messages=[{"role": "user", "content": "cancel"}],
        calls=[CheckedCall(id="toolu_1", name="cancel_order", input=CANCEL, approved=True)],
    )
    return base.model_copy(update=changes)


def decision(**changes) -> ApprovalDecided:
    base = ApprovalDecided(
        approval_id=approval_id_for("turn_1", 1, "toolu_1"),
        turn_id="turn_1",
        tool_use_id="toolu_1",
        input_sha256=input_digest("cancel_order", CANCEL),
        decision=Decision.APPROVE,
        decided_by="ops@example.com",
        decided_at=time.time(),
    )
    return base.model_copy(update=changes)


def test_signed_batch_verifies_with_the_public_key_only():
    GATE.verifier.verify(GATE.signer.sign(batch()))
    assert not hasattr(GATE.verifier, "sign")  # a verifier holds public keys: there is nothing to sign with


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
        lambda b: b.model_copy(update={"signature": "00" * 64}),
        lambda b: b.model_copy(update={"signature": "not hex"}),
    ],
    ids=["input", "other-turn", "other-customer", "tool-name", "step", "zero-signature", "garbage-signature"],
)
def test_tampered_batch_is_refused(tamper):
    with pytest.raises(ApprovalError, match="signature mismatch"):
        GATE.verifier.verify(tamper(GATE.signer.sign(batch())))


def test_unsigned_unknown_key_and_another_private_key_are_refused():
    with pytest.raises(ApprovalError, match="unsigned"):
        GATE.verifier.verify(batch())
    with pytest.raises(ApprovalError, match="unknown key"):
        GATE.verifier.verify(pair("k9").signer.sign(batch()))
    same_id = pair("k1")  # an attacker who knows the key id makes a key of their own
    with pytest.raises(ApprovalError, match="signature mismatch"):
        GATE.verifier.verify(same_id.signer.sign(batch()))


def test_keys_rotate_the_old_key_still_verifies_the_new_key_signs():
    new = pair("k2")
    both = Verifier.of(f"{new.verify},{GATE.verify}", "ROUNDTRIP_BATCH_VERIFY_KEYS")
    both.verify(GATE.signer.sign(batch()))
    signed = new.signer.sign(batch())
    both.verify(signed)
    assert signed.key_id == "k2"


def test_a_forged_or_edited_decision_is_refused():
    people = pair("ops1")
    people.decisions.verify(people.signer.sign(decision()))
    with pytest.raises(ApprovalError, match="signature mismatch"):
        people.decisions.verify(people.signer.sign(decision()).model_copy(update={"tool_use_id": "toolu_2"}))
    with pytest.raises(ApprovalError, match="signature mismatch"):
        people.decisions.verify(pair("ops1").signer.sign(decision()))
    with pytest.raises(ApprovalError, match="unsigned decision"):
        people.decisions.verify(decision())


def _signers_from(settings: Settings, names: tuple[str, ...]) -> list[Signer]:
    """Every signer a process could make of the key material it holds: each entry, private or public, as a key."""
    made = []
    for name in names:
        text = settings.key_text(name)
        for entry in text.split(","):
            key_id, _, encoded = entry.partition(":")
            for as_id in {key_id, "k1", "ops1"}:  # and under the other purpose's key id
                made.append(Signer.of(f"{as_id}:{encoded}", "TEST"))
    return made


def test_no_service_can_sign_what_another_verifies_but_the_one_signer():
    """The executor's material (public keys) signs no batch it or the guard accepts; the gate's signs no decision the
    guard accepts; only the gate's private key signs batches and only the console's signs decisions."""
    settings = Settings(_env_file=None, **key_settings("k1", "ops1"))
    batches = Verifier.of(settings.batch_verify_keys, "ROUNDTRIP_BATCH_VERIFY_KEYS")
    decisions = DecisionVerifier.of(settings.decision_verify_keys, "ROUNDTRIP_DECISION_VERIFY_KEYS")
    checked = {"batch": 0, "decision": 0}
    for service in topology.SERVICES:
        for signer in _signers_from(settings, service.keys):
            for what, verifier, message, allowed in (
                ("batch", batches, batch(), service.signs_batches),
                ("decision", decisions, decision(), service.signs_decisions),
            ):
                signed = signer.sign(message)
                try:
                    verifier.verify(signed)
                    accepted = True
                except ApprovalError:
                    accepted = False
                checked[what] += 1
                if accepted:
                    assert allowed, f"{service.name} signed a {what} that verifies with {service.keys}"
    assert topology.service("executor").keys == ("batch_verify_keys",)  # public keys only where only checking
    assert set(topology.service("guard").keys) == {"batch_verify_keys", "decision_verify_keys"}
    assert set(topology.service("gate").keys) == {"batch_signing_key", "decision_verify_keys"}
    assert topology.service("console").keys == ("decision_signing_key",)
    assert checked["batch"] > 10 and checked["decision"] > 10


def held(**changes) -> ApprovalRequested:
    expires = round(time.time() + 900, 3)
    base = ApprovalRequested(
        approval_id=approval_id_for("turn_1", 1, "toolu_1"),
        turn=TURN.model_copy(update={"deadline_at": round(time.time() + 300, 3)}),
        step=1,
        call=CheckedCall(id="toolu_1", name="cancel_order", input=CANCEL, approved=True),
        reason="above 50.00 EUR",
        entities={"order_id": {"order_id": "ord_a1000003", "total_cents": 8700}},
        input_sha256=input_digest("cancel_order", CANCEL),
        requested_at=time.time(),
        expires_at=expires,
        messages=[{"role": "user", "content": "cancel my last order"}],
        results=[
            {"type": "tool_result", "tool_use_id": "toolu_0", "content": "an earlier step's approved call"},
            {"type": "tool_result", "tool_use_id": "toolu_l", "content": '{"orders": []}'},
        ],
        results_before=1,
    )
    return GATE.signer.sign_request(base).model_copy(update=changes)


def test_the_gates_signature_of_a_hold_covers_customer_conversation_step_call_and_deadline():
    GATE.verifier.verify_hold(held())
    other = CANCEL | {"order_id": "ord_b2000001"}
    for edited in (
        held(turn=TURN.model_copy(update={"customer_id": "cus_1002"})),
        held(turn=TURN.model_copy(update={"conversation_id": "c2"})),
        held(turn=TURN.model_copy(update={"turn_id": "turn_2"})),
        held(step=2),
        held(call=CheckedCall(id="toolu_2", name="cancel_order", input=CANCEL, approved=True)),
        held(expires_at=time.time() + 86400),
        held(input_sha256=input_digest("cancel_order", other), call=held().call.model_copy(update={"input": other})),
    ):
        with pytest.raises(ApprovalError, match="signature mismatch"):
            GATE.verifier.verify_hold(edited)
    with pytest.raises(ApprovalError, match="not the one its signed input digest names"):
        GATE.verifier.verify_hold(held(call=held().call.model_copy(update={"input": other})))
    with pytest.raises(ApprovalError, match="unsigned approval request"):
        GATE.verifier.verify_hold(held(hold_key_id="", hold_signature=""))
    with pytest.raises(ApprovalError, match="signature mismatch"):  # signed by another key under the gate's id
        forged = pair("k1").signer.sign_request(held())
        GATE.verifier.verify_hold(held(hold_signature=forged.hold_signature))


def test_the_hold_signature_covers_every_word_the_approver_is_shown_and_the_approval_id():
    """A writer of turn.approval_requests who copies a genuine hold cannot change what the person reads."""
    genuine = held()
    said = [{"role": "user", "content": "refund 3.00 EUR"}]
    ran = genuine.results[1]
    for field, value in (
        ("approval_id", "appr_00000000000000000000"),
        ("reason", "refund 3.00 EUR, a small goodwill gesture"),
        ("entities", {"order_id": {"order_id": "ord_a1000003", "total_cents": 300}}),
        ("messages", said),
        ("messages", genuine.messages + said),
        ("results", [{**genuine.results[0], "content": "refund 3.00 EUR"}, ran]),  # an earlier result, as shown
        ("results", genuine.results[:1]),  # the batch's other call's result dropped
        ("results", [*genuine.results, {**ran, "tool_use_id": "toolu_x"}]),  # one that never was a call of it
        ("results_before", 0),
        ("turn", genuine.turn.model_copy(update={"deadline_at": 4102444800.0})),  # 2100
        ("turn", genuine.turn.model_copy(update={"metadata": {"tier": "gold"}})),
    ):
        with pytest.raises(ApprovalError, match=r"signature mismatch"):
            GATE.verifier.verify_hold(genuine.model_copy(update={field: value}))
    with pytest.raises(ApprovalError, match="more earlier results"):
        GATE.verifier.verify_hold(genuine.model_copy(update={"results_before": 3}))
    # the batch's other calls' results are the executor's, as on any step: their ids are signed, not their words
    GATE.verifier.verify_hold(genuine.model_copy(update={"results": [genuine.results[0], {**ran, "content": "{}"}]}))
    # not the words: the time the executor says it asked, the guard measures the wait by its own clock
    GATE.verifier.verify_hold(genuine.model_copy(update={"requested_at": 0.0}))


SECRETISH = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"  # base64, 27 bytes: looks like a key, is none


@pytest.mark.parametrize(
    "value,expected",
    [
        ("k1:CHANGE-ME-run-roundtrip-keys", "placeholder CHANGE-ME"),
        (SECRETISH, "must look like key_id:base64-key"),
        (f"k1:{SECRETISH}", "is 27 bytes, an Ed25519 key is 32"),
        (f"k1:{SECRETISH}!!", "is not base64"),
        (f"k 1:{SECRETISH}", "must look like key_id:base64-key"),
        ("", "holds no key"),
    ],
)
def test_an_unusable_key_is_named_never_shown(value, expected):
    for parse in (signing_key, verify_keys):
        with pytest.raises(KeyConfigError, match=expected) as refused:
            parse(value, "ROUNDTRIP_BATCH_SIGNING_KEY")
        message = str(refused.value)
        assert SECRETISH[:6] not in message and "\n" not in message


def test_a_signing_key_is_one_key_and_a_verify_list_names_each_id_once():
    two = f"{GATE.signing},{pair('k2').signing}"
    with pytest.raises(KeyConfigError, match="holds 2 keys; it takes one"):
        signing_key(two, "ROUNDTRIP_BATCH_SIGNING_KEY")
    with pytest.raises(KeyConfigError, match="lists key id 'k1' twice"):
        verify_keys(f"{GATE.verify},{pair('k1').verify}", "ROUNDTRIP_BATCH_VERIFY_KEYS")


def test_a_key_setting_may_name_a_file(tmp_path):
    (tmp_path / "signing").write_text(GATE.signing + "\n")  # as a mounted Secret holds it
    (tmp_path / "verify").write_text(GATE.verify)
    signer = Signer.of(f"file:{tmp_path / 'signing'}", "ROUNDTRIP_BATCH_SIGNING_KEY")
    Verifier.of(f"file:{tmp_path / 'verify'}", "ROUNDTRIP_BATCH_VERIFY_KEYS").verify(signer.sign(batch()))
    with pytest.raises(KeyConfigError, match=r"names .*missing, which cannot be read"):
        Signer.of(f"file:{tmp_path / 'missing'}", "ROUNDTRIP_BATCH_SIGNING_KEY")
