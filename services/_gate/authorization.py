"""Existence and ownership of every entity a call references, then the tool's policy.

The principal is the customer of the request envelope; tool input never names it. A missing entity and another
customer's get the same answer, so a denial leaks nothing. Nothing here reads tool output: what a result says cannot
widen a turn. Ownership never changes but status does, so the cross-step ownership cache serves only tools without a
policy; within a step every call is checked before any runs, so a per-step memo is as fresh as asking again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Container
from typing import Any, cast

from roundtrip._kernel.clock import Clock
from roundtrip._kernel.kafka import faults
from roundtrip._sdk.context import ToolContext
from roundtrip._sdk.registry import ToolSpec

EntityLookup = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]
Policy = Callable[[dict[str, Any], dict[str, dict[str, Any]], ToolContext], Awaitable[str | None]]
Key = tuple[str, str, str]


class LookupFailed(Exception):
    """The backend could not answer; the gate fails closed."""


Say = Callable[..., str]  # (message key, **fields) -> the agent's words for the gate's refusal


def _not_found(say: Say, kind: str, entity_id: str, tools: Container[str]) -> str:
    """Not found, naming the agent's list tool for the kind only when it has one (`list_<kind>s`)."""
    shown = entity_id if len(entity_id) <= 40 else entity_id[:37] + "..."
    fields = {"Kind": kind.capitalize(), "kind": kind, "id": shown}
    if f"list_{kind}s" in tools:
        return say("not_found_listed", list_tool=f"list_{kind}s", **fields)
    return say("not_found", **fields)


def _belongs(entity: Any, kind: str, entity_id: str, customer_id: str) -> bool:
    """The backend's answer is exactly the entity asked for, and the principal's (when it says whose)."""
    if not isinstance(entity, dict):
        return False
    if entity.get(f"{kind}_id", entity_id) != entity_id:  # a lenient backend (case, trimming) must not widen access
        return False
    return cast(bool, entity.get("customer_id", customer_id) == customer_id)


async def authorize(
    spec: ToolSpec,
    tool_input: dict[str, Any],
    ctx: ToolContext,
    lookup: EntityLookup,
    policy: Policy | None,
    resolved: dict[str, dict[str, Any]],
    say: Say,
    tools: Container[str],
) -> str | None:
    """None when the call may run, else the reason it may not; `resolved` receives the entities it read."""
    for field, kind in spec.entity_refs.items():
        if field not in tool_input:
            continue
        entity_id = tool_input[field]
        if not isinstance(entity_id, str) or not entity_id:
            return say("not_an_id", field=field, kind=kind)
        try:
            entity = await lookup(kind, entity_id, ctx.customer_id)
        except Exception as exc:  # any backend failure denies the call ...
            if (dependency := faults.unavailable(exc)) is not None:  # ... but one that is away is asked again
                why = f"could not verify {kind} {entity_id[:40]}: {exc}"
                raise faults.RetryLater(dependency, why, backend=True) from exc  # the agent's: its conversation waits
            raise LookupFailed(f"could not verify {kind} {entity_id[:40]}: {exc}") from exc
        if entity is None or not _belongs(entity, kind, entity_id, ctx.customer_id):
            return _not_found(say, kind, entity_id, tools)
        resolved[field] = entity
    if policy is not None:
        try:
            return await policy(tool_input, resolved, ctx)
        except Exception as exc:  # a policy reads the agent's backends too
            if (dependency := faults.unavailable(exc)) is not None:
                raise faults.RetryLater(dependency, f"{spec.name}'s policy: {exc}", backend=True) from exc
            raise
    return None


class OwnershipCache:
    """(kind, id, customer) -> entity, positive answers only, for `ttl_s` seconds (LRU-bounded)."""

    MAX_ENTRIES = 10_000

    def __init__(self, ttl_s: float, clock: Clock) -> None:
        self.ttl_s, self._clock = ttl_s, clock
        self._entries: OrderedDict[Key, tuple[float, dict[str, Any]]] = OrderedDict()

    def get(self, key: Key) -> dict[str, Any] | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        stored, entity = hit
        if self._clock.monotonic() - stored > self.ttl_s:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entity

    def put(self, key: Key, entity: dict[str, Any]) -> None:
        self._entries[key] = (self._clock.monotonic(), entity)
        self._entries.move_to_end(key)
        while len(self._entries) > self.MAX_ENTRIES:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class StepLookups:
    """The look-ups of one step: memoised (in-flight ones shared), or from the ownership cache for policy-free tools."""

    def __init__(self, backend: EntityLookup, ownership: OwnershipCache | None, memo: bool) -> None:
        self._backend, self._ownership = backend, ownership
        self._memo: dict[Key, asyncio.Future[dict[str, Any] | None]] | None = {} if memo else None
        self.backend_calls = 0

    async def _fetch(self, key: Key) -> dict[str, Any] | None:
        self.backend_calls += 1
        entity = await self._backend(*key)
        if entity is not None and self._ownership is not None and _belongs(entity, key[0], key[1], key[2]):
            self._ownership.put(key, entity)
        return entity

    def for_call(self, state_free: bool) -> EntityLookup:
        async def lookup(kind: str, entity_id: str, customer_id: str) -> dict[str, Any] | None:
            key = (kind, entity_id, customer_id)
            if self._memo is not None and key in self._memo:
                return await asyncio.shield(self._memo[key])
            if state_free and self._ownership is not None:
                cached = self._ownership.get(key)
                if cached is not None:
                    return cached  # not memoised: a stateful call in this step must still fetch fresh
            if self._memo is None:
                return await self._fetch(key)
            task = asyncio.ensure_future(self._fetch(key))
            self._memo[key] = task
            try:
                return await asyncio.shield(task)
            except Exception:
                self._memo.pop(key, None)  # a failure is not remembered: the next call asks again
                raise

        return lookup
