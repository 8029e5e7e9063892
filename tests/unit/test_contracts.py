"""The checked-in contract (contracts/) must be what the code generates: run `roundtrip contracts` after changing events or topics."""

from services.contracts import ROOT, rendered


def test_checked_in_contracts_match_the_code():
    stale = [rel for rel, text in rendered().items() if not (ROOT / rel).exists() or (ROOT / rel).read_text() != text]
    assert not stale, f"contracts/ drifted from the code ({', '.join(stale)}); run `roundtrip contracts` and commit"


def test_public_topics_are_documented_with_their_payloads():
    import json

    doc = json.loads((ROOT / "asyncapi.json").read_text())
    channels = " ".join(doc["channels"])
    assert "support.requests" in channels and "support.replies" in channels and "support.status" in channels
    schemas = json.dumps(doc["components"]["schemas"])
    assert "SupportRequest" in schemas and "SupportReply" in schemas and "SupportStatus" in schemas
