from roundtrip._kernel.wire.fingerprints import canonical_json, fingerprint


def test_key_order_and_number_spelling_do_not_change_the_fingerprint():
    assert fingerprint("lookup_order", {"order_id": "ord_1", "n": 1}) == fingerprint(
        "lookup_order", {"n": 1.0, "order_id": "ord_1"}
    )


def test_unicode_normalisation_forms_are_the_same_call():
    assert fingerprint("t", {"q": "caf\u00e9"}) == fingerprint("t", {"q": "cafe\u0301"})


def test_different_values_or_tools_differ():
    assert fingerprint("lookup_order", {"order_id": "ord_1"}) != fingerprint("lookup_order", {"order_id": "ord_2"})
    assert fingerprint("lookup_order", {"order_id": "ord_1"}) != fingerprint(
        "get_shipping_status", {"order_id": "ord_1"}
    )


def test_fingerprint_names_the_tool():
    assert fingerprint("cancel_order", {}).startswith("cancel_order:")


def test_canonical_json_is_compact_and_sorted():
    assert canonical_json({"b": 1, "a": [True, None]}) == b'{"a":[true,null],"b":1}'
