"""Prices per model (USD per million tokens) and the cost of a turn's usage: what the ledger's `cost_usd` is."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from roundtrip._kernel.wire.events import Usage

BATCH_SHARE = 0.5  # Message Batches bill every kind of token (input, output, cache write, cache read) at half
BATCH_ENTRY = "batch:"  # ROUNDTRIP_PRICES's `batch:<model>`: that model's batch price, where it is not half


@dataclass(frozen=True)
class Price:
    input: float
    output: float
    cache_write: float
    cache_read: float

    def share(self, share: float) -> Price:
        return Price(self.input * share, self.output * share, self.cache_write * share, self.cache_read * share)


# list prices by model family, the same at the platforms' global endpoints (a regional or negotiated rate is
# ROUNDTRIP_PRICES's to say); the longest family a model id starts with is its price
LIST_PRICES = {
    "claude-opus-4-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-6": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4": Price(15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4": Price(3.0, 15.0, 3.75, 0.30),
    "claude-3-7-sonnet": Price(3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 1.0, 0.08),
}
PROVIDER_PRICES: dict[str, dict[str, Price]] = {
    "anthropic": LIST_PRICES,
    "bedrock": LIST_PRICES,
    "vertex": LIST_PRICES,
    "foundry": LIST_PRICES,
}


def family(model: str) -> str:
    """The Anthropic name of a platform's model id: `us.anthropic.claude-sonnet-4-5-20250929-v1:0` (Bedrock) and
    `claude-sonnet-4-5@20250929` (Vertex) are `claude-sonnet-4-5-20250929`."""
    name = re.sub(r"^(?:[a-z]{2,6}\.)?anthropic\.", "", model)
    return re.sub(r"-v\d+(?::\d+)?$", "", name).replace("@", "-")


def _configured(prices: dict[str, Price], names: tuple[str, ...]) -> Price | None:
    """The entry named by the model's id or family, else the first the id or family starts with."""
    for name in names:
        if name in prices:
            return prices[name]
        if found := next((v for k, v in prices.items() if name.startswith(k)), None):
            return found
    return None


class PriceTable:
    def __init__(self, prices: dict[str, Price], provider: str) -> None:
        if "default" not in prices:
            raise ValueError("the price table needs a 'default' entry")
        self._default = prices["default"]
        self._prices = {k: v for k, v in prices.items() if k != "default" and not k.startswith(BATCH_ENTRY)}
        self._batch = {k.removeprefix(BATCH_ENTRY): v for k, v in prices.items() if k.startswith(BATCH_ENTRY)}
        self._listed = PROVIDER_PRICES.get(provider, {})

    @classmethod
    def from_json(cls, text: str, provider: str) -> PriceTable:
        try:
            raw = json.loads(text)
            return cls({model: Price(*map(float, values)) for model, values in raw.items()}, provider)
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f'ROUNDTRIP_PRICES must be JSON like {{"default": [3.0, 15.0, 3.75, 0.30]}} '
                f"(USD per million input, output, cache write, cache read tokens): {exc}"
            ) from exc

    def cost(self, model: str, usage: Usage, batch: bool = False) -> float:
        """What `usage` cost on `model`; `batch`: a call a Message Batch answered (`batch_price`)."""
        p = self.batch_price(model) if batch else self.price(model)
        return (
            usage.input_tokens * p.input
            + usage.output_tokens * p.output
            + usage.cache_creation_input_tokens * p.cache_write
            + usage.cache_read_input_tokens * p.cache_read
        ) / 1_000_000

    def price(self, model: str) -> Price:
        """ROUNDTRIP_PRICES's entry (by id or family), else the provider's list price, else the configured default."""
        names = (model, family(model))
        if (configured := _configured(self._prices, names)) is not None:
            return configured
        listed = [k for k in self._listed if names[1].startswith(k)]
        return self._listed[max(listed, key=len)] if listed else self._default

    def batch_price(self, model: str) -> Price:
        """ROUNDTRIP_PRICES's `batch:` entry for the model (by id or family), else half its price."""
        configured = _configured(self._batch, (model, family(model)))
        return configured if configured is not None else self.price(model).share(BATCH_SHARE)
