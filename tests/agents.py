"""The demo shop's agent for the tests, its registry with some bindings replaced, the `shop` fixture, and the settings
of a fleet that runs it (the fleet's and the shop agent's own: where the demo shop listens and keeps its data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roundtrip._executor.runner import Runner
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.settings.concerns import TranscriptLimits
from roundtrip._sdk.context import Dependencies
from roundtrip._sdk.registry import Registry, load_specs
from roundtrip._shop.agent import AGENT as SHOP
from roundtrip._shop.agent.settings import ShopAgentSettings

SCHEMAS = Path(SHOP.tools_dir)


def shop_registry(folder: Path | None = None, **overrides: Any) -> Registry:
    """The shop agent's tools (from `folder`, else its own schemas), with any of its bindings replaced."""
    bindings: dict[str, Any] = {
        "handlers": SHOP.handlers,
        "policies": SHOP.policies,
        "entity_resolvers": SHOP.entities,
        "approvals": SHOP.approvals,
        "serial": SHOP.serial,
        "mounted": frozenset(),
    }
    return Registry(load_specs(folder or SCHEMAS), **(bindings | overrides))


def shop_deps(client: Any) -> Dependencies:
    """The shop agent's dependencies with this shop client."""
    return Dependencies({"shop": client})


def shop_model_client(settings: Any, tools: list[dict[str, Any]] | None = None, sdk_retries: int = 0) -> Any:
    """The model service's client as it runs the shop agent (its tools, prompt and model)."""
    from roundtrip._model.client import ModelClient

    return ModelClient(
        settings,
        SHOP.registry.api_tools(cache=True) if tools is None else tools,
        SHOP.system_prompt,
        SHOP.model_for(settings),
        sdk_retries=sdk_retries,
    )


class ShopFleetSettings(Settings, ShopAgentSettings):
    """A test fleet's settings for the demo shop agent: the fleet's, and the shop agent's own (ROUNDTRIP_SHOP_*)."""

    @property
    def shop_db_url(self) -> str:  # type: ignore[override] - the shop agent's URL in this fleet's state_dir
        return ShopAgentSettings.shop_db_url(self, self.state_dir)


def tool_runner(registry: Any, deps: Dependencies, timeout_s: float = 5, fallback: Any = None) -> Runner:
    """An executor's runner of these tools as `runner_for` builds it: parallel, results cut at the setting's default."""
    return Runner(registry, deps, timeout_s, True, TranscriptLimits.model_fields["max_block_bytes"].default, fallback)
