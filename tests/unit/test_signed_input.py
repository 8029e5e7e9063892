"""What is signed is the input as it runs: RFC 8785 of the raw values, not a normalised copy (issue 42). Two inputs
that differ only in Unicode normalisation are two inputs to a tool (a backend may store or compare them as they
come), so their digests differ and a batch whose input was re-normalised after signing does not verify. The guard's
repeat detection still takes them for one call: that is a comparison, not a signature."""

from __future__ import annotations

import unicodedata

import pytest

from roundtrip._kernel.wire.approvals import ApprovalError, input_digest
from roundtrip._kernel.wire.events import CheckedCall, ExecuteToolBatch, Turn
from roundtrip._kernel.wire.fingerprints import canonical_json, fingerprint
from tests.signing import pair

COMPOSED, DECOMPOSED = "Caf\u00e9 Ren\u00e9", "Cafe\u0301 Rene\u0301"  # NFC and NFD of the same text


def test_the_two_spellings_are_the_same_text_in_two_normalisation_forms():
    assert COMPOSED != DECOMPOSED and unicodedata.normalize("NFC", DECOMPOSED) == COMPOSED


def test_inputs_differing_only_in_normalisation_get_different_digests_and_canonical_bytes():
    assert input_digest("escalate", {"note": COMPOSED}) != input_digest("escalate", {"note": DECOMPOSED})
    assert canonical_json({"note": DECOMPOSED}) == '{"note":"Cafe\u0301 Rene\u0301"}'.encode()


def test_the_guard_still_takes_them_for_the_same_call():
    assert fingerprint("escalate", {"note": COMPOSED}) == fingerprint("escalate", {"note": DECOMPOSED})


def test_canonical_json_keeps_what_rfc_8785_makes_equal_equal():
    assert canonical_json({"b": 1.0, "a": "x"}) == canonical_json({"a": "x", "b": 1}) == b'{"a":"x","b":1}'


def _batch(note: str) -> ExecuteToolBatch:
    return ExecuteToolBatch(
        turn=Turn(turn_id="turn_1", request_id="r1", conversation_id="c1", customer_id="cus_1001"),
        step=1,
        messages=[{"role": "user", "content": "write to support"}],
        calls=[CheckedCall(id="toolu_1", name="escalate", input={"note": note}, approved=True)],
    )


@pytest.mark.parametrize("signed_as, form", [(DECOMPOSED, "NFC"), (DECOMPOSED, "NFKC"), (COMPOSED, "NFD")])
def test_a_batch_whose_input_was_renormalised_after_signing_fails_verification(signed_as, form):
    gate = pair("k1")
    signed = gate.signer.sign(_batch(signed_as))
    gate.verifier.verify(signed)  # the input as it was signed, through the wire and back, verifies
    gate.verifier.verify(ExecuteToolBatch.model_validate_json(signed.model_dump_json()))
    call = signed.calls[0]
    renormalised = signed.model_copy(
        update={"calls": [call.model_copy(update={"input": {"note": unicodedata.normalize(form, signed_as)}})]}
    )
    with pytest.raises(ApprovalError, match="signature mismatch"):
        gate.verifier.verify(renormalised)
