"""The checked-in contract (contracts/) is what the code generates: run `roundtrip contracts` after a change."""

from roundtrip._cli.contracts import ROOT, rendered


def test_checked_in_contracts_match_the_code():
    stale = [rel for rel, text in rendered().items() if not (ROOT / rel).exists() or (ROOT / rel).read_text() != text]
    assert not stale, (
        f"schemas/events/ or contracts/ drifted from the code ({', '.join(stale)}); run `roundtrip contracts` and "
        "commit"
    )


def test_public_topics_are_documented_with_their_payloads():
    import json

    doc = json.loads((ROOT / "contracts" / "asyncapi.json").read_text())
    channels = " ".join(doc["channels"])
    assert "support.requests" in channels and "support.replies" in channels and "support.status" in channels
    payloads = {m["payload"]["$ref"] for m in doc["components"]["messages"].values()}
    for event in ("SupportRequest", "SupportReply", "SupportStatus"):
        assert f"../schemas/events/{event}.json" in payloads
        assert json.loads((ROOT / "schemas" / "events" / f"{event}.json").read_text())["title"] == event


def test_every_schema_the_asyncapi_document_refers_to_is_a_checked_in_file():
    import json

    doc = json.loads((ROOT / "contracts" / "asyncapi.json").read_text())
    refs = {m["payload"]["$ref"] for m in doc["components"]["messages"].values()}
    missing = [ref for ref in refs if not ref.startswith("#") and not (ROOT / "contracts" / ref).resolve().is_file()]
    assert not missing, f"the AsyncAPI document refers to schema files that are not there: {missing}"
