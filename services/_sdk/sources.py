"""Tool sources (`SchemaFolder`, a `@tool` function, `McpServer`): the one protocol every place of tools implements.

`Toolbox` is an agent's sources in one process: it mounts the tools a source lists later into the registry as they
come, and until then `unavailable(name)` says why one cannot be called.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from roundtrip._sdk.context import ToolContext, ToolError
from roundtrip._sdk.registry import Handler, Registry, RegistryError, ToolSpec, collect_specs

log = logging.getLogger("roundtrip.tools")

OnListed = Callable[["ToolSource"], None]


class ToolSource(ABC):
    """Where some of an agent's tools come from: what it offers, how one is called, what it opens and closes."""

    label = "tool source"

    @abstractmethod
    def specs(self) -> Mapping[str, ToolSpec]:
        """The tools it offers now, by name (a source that lists them at start: none until it has)."""

    @abstractmethod
    async def call(self, name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        """Run one of its tools on an input the gate approved (ToolError: an `is_error` result the model reads)."""

    def problems(self, kinds: Collection[str]) -> list[str]:
        return []

    def declared(self) -> frozenset[str]:
        """The tools it is known to bring: the agent's bindings (policies, approval rules) may name them."""
        return frozenset(self.specs())

    def handlers(self) -> Mapping[str, Handler]:
        return {name: self.handler(name) for name in self.specs()}

    def handler(self, name: str) -> Handler:
        async def handle(args: dict[str, Any], ctx: ToolContext) -> Any:
            return await self.call(name, args, ctx)

        return handle

    def bind(self, own_settings: Any) -> ToolSource:
        return self

    async def start(self, on_listed: OnListed) -> None:  # noqa: B027 - an optional hook: a local source has none
        """Open what it needs (a local source: nothing); a source whose tools come later calls `on_listed(self)`."""

    async def check(self, on_listed: OnListed) -> list[str]:
        return []

    async def close(self) -> None:  # noqa: B027 - an optional hook: a local source has none
        """Close what `start` opened."""

    def refusals(self) -> Mapping[str, str]:
        return {}

    def unavailable(self, name: str) -> str | None:
        """Why a tool it declares cannot be called now (asked only while the tool is not in the registry)."""
        return f"Tool {name} is not offered by the {self.label} any more; nothing was done."


class SchemaFolder(ToolSource):
    """JSON Schema tool documents (`path`/*.json, one a tool, named like its file), each bound to its handler:
    `SchemaFolder(Path(__file__).parent / "tools", handlers={"lookup_order": lookup_order})`."""

    def __init__(self, path: Path | str, handlers: Mapping[str, Handler] | None = None) -> None:
        self.path, self._handlers = Path(path), dict(handlers or {})
        self.label = f"schema folder {self.path}"

    @cached_property
    def _read(self) -> tuple[dict[str, ToolSpec], list[str]]:
        if not self.path.is_dir():
            return {}, [f"{self.label} is not a folder"]
        return collect_specs(self.path)

    def specs(self) -> Mapping[str, ToolSpec]:
        return self._read[0]

    def problems(self, kinds: Collection[str]) -> list[str]:
        return self._read[1]

    def handlers(self) -> Mapping[str, Handler]:
        return self._handlers

    async def call(self, name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        if name not in self._handlers:
            raise ToolError(f"Tool {name} has no handler; nothing was done.")
        return await self._handlers[name](args, ctx)

    def __repr__(self) -> str:
        return f"SchemaFolder({str(self.path)!r})"


class Toolbox:
    """An agent's tool sources in one process: they mount the tools they list at start into its registry."""

    def __init__(self, sources: list[ToolSource], registry: Registry) -> None:
        self.sources, self.registry = sources, registry
        self.refused: dict[str, str] = {}
        self.api_tools: list[dict[str, Any]] = registry.api_tools(cache=True)  # updated in place: the model holds it
        self._mounted: set[str] = set()

    def owner(self, name: str) -> ToolSource | None:
        return next((source for source in self.sources if name in source.declared()), None)

    def mount_listed(self, source: ToolSource) -> None:
        self.refused.update(source.refusals())
        for name, spec in sorted(source.specs().items()):
            if name in self._mounted:
                continue
            try:
                self.registry.mount(spec, source.handler(name))
                self._mounted.add(name)
            except RegistryError as exc:
                self.refused[name] = str(exc)
                log.error("%s: tool %s not mounted: %s", source.label, name, exc)
        self.api_tools[:] = self.registry.api_tools(cache=True)
        log.info("%s is up: mounted %s", source.label, sorted(n for n in source.specs() if n in self._mounted))

    async def start(self) -> None:
        """Start every source; return once each has been asked (a listing goes on in the background)."""
        await asyncio.gather(*(source.start(self.mount_listed) for source in self.sources))

    async def problems(self) -> list[str]:
        found = [problem for source in self.sources for problem in await source.check(self.mount_listed)]
        return found + [f"MCP tool {name} not mounted: {why}" for name, why in sorted(self.refused.items())]

    async def aclose(self) -> None:
        await asyncio.gather(*(source.close() for source in self.sources))

    def run_with(self, app: Any) -> None:
        app.on_startup(self.start)
        app.after_shutdown(self.aclose)

    async def __aenter__(self) -> Toolbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def unavailable(self, name: str) -> str | None:
        if name in self.refused:
            return f"Tool {name} is not available: its schema does not fit this agent. Do without it."
        source = self.owner(name)
        if source is None or name in self.registry:
            return None
        return source.unavailable(name)

    def handler(self, name: str) -> Handler:
        """The executor's handler of a tool not mounted here (yet): its source's call, or a refusal."""
        source = self.owner(name)
        if source is not None and name not in self.refused:
            return source.handler(name)
        why = self.unavailable(name) or f"Tool {name} is unavailable; nothing was done."

        async def refuse(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
            raise ToolError(why)

        return refuse
