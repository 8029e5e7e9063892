"""Price tables for tests that count cost: Anthropic's API (its list prices for a model the table does not name)."""

from __future__ import annotations

from roundtrip._kernel.storage.prices import PriceTable

SONNET_PRICES = '{"default": [3.0, 15.0, 3.75, 0.30]}'  # USD per million input, output, cache write, cache read tokens


def price_table(text: str = SONNET_PRICES) -> PriceTable:
    return PriceTable.from_json(text, "anthropic")
