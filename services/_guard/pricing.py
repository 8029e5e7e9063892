"""Prices per model (USD per million tokens) and the cost of a turn's usage."""

from __future__ import annotations

import json
from dataclasses import dataclass

from roundtrip._kernel.wire.events import Usage


@dataclass(frozen=True)
class Price:
    input: float
    output: float
    cache_write: float
    cache_read: float


class PriceTable:
    def __init__(self, prices: dict[str, Price]) -> None:
        if "default" not in prices:
            raise ValueError("the price table needs a 'default' entry")
        self._prices = prices

    @classmethod
    def from_json(cls, text: str) -> PriceTable:
        try:
            raw = json.loads(text)
            return cls({model: Price(*map(float, values)) for model, values in raw.items()})
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f'ROUNDTRIP_PRICES must be JSON like {{"default": [3.0, 15.0, 3.75, 0.30]}} '
                f"(USD per million input, output, cache write, cache read tokens): {exc}"
            ) from exc

    def cost(self, model: str, usage: Usage) -> float:
        p = (
            self._prices.get(model)
            or next((v for k, v in self._prices.items() if model.startswith(k)), None)
            or self._prices["default"]
        )
        return (
            usage.input_tokens * p.input
            + usage.output_tokens * p.output
            + usage.cache_creation_input_tokens * p.cache_write
            + usage.cache_read_input_tokens * p.cache_read
        ) / 1_000_000
