"""Runs the approved calls of one step, concurrently, each under a timeout.

Every call but a held one yields a tool_result block, in tool_use order; a failing, slow or rejected call yields one
with `is_error: true` and why. A step holding a serial tool runs its calls one after another, whatever `parallel` says.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from roundtrip._kernel.observability import metrics
from roundtrip._kernel.observability.telemetry import mark_error, tracer
from roundtrip._kernel.wire.events import CheckedCall, Turn
from roundtrip._kernel.wire.limits import cap_text
from roundtrip._sdk.context import Dependencies, ToolContext, ToolError
from roundtrip._sdk.registry import Handler, Registry

log = logging.getLogger("roundtrip.executor")


def tool_result(call_id: str, content: str, is_error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


class Runner:
    def __init__(
        self,
        registry: Registry,
        deps: Dependencies,
        timeout_s: float,
        parallel: bool,
        max_result_bytes: int,
        fallback: Callable[[str], Handler] | None,
    ) -> None:
        self.registry, self.deps, self.timeout_s, self.parallel = registry, deps, timeout_s, parallel
        self.fallback = fallback  # the handler of a tool not in the registry: an MCP tool
        self.max_result_bytes = max_result_bytes

    async def run_one(self, call: CheckedCall, turn: Turn) -> dict[str, Any]:
        if not call.approved:
            return tool_result(call.id, call.error or "This call was rejected.", is_error=True)
        started = time.perf_counter()
        result = await self._execute(call, turn)
        metrics.tool_duration.labels(call.name).observe(time.perf_counter() - started)
        metrics.tool_executions.labels(call.name, "error" if result.get("is_error") else "ok").inc()
        return result

    async def _execute(self, call: CheckedCall, turn: Turn) -> dict[str, Any]:
        with tracer().start_as_current_span(f"execute_tool {call.name}") as span:  # the GenAI execute_tool span
            span.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": call.name,
                    "gen_ai.tool.call.id": call.id,
                    "gen_ai.tool.type": "function",
                }
            )
            ctx = ToolContext(
                customer_id=turn.customer_id,
                tool_use_id=call.id,
                idempotency_key=f"{turn.turn_id}:{call.id}",
                deps=self.deps,
                metadata=dict(turn.metadata or {}),
            )
            try:
                fallback = self.fallback
                known = fallback is None or call.name in self.registry
                handler = self.registry.handler(call.name) if fallback is None or known else fallback(call.name)
                result = await asyncio.wait_for(handler(call.input, ctx), self.timeout_s)
                text = json.dumps(result, ensure_ascii=False, default=str)
                if len(text) > self.max_result_bytes // 4:  # only a long text can be over the limit in bytes
                    text = cap_text(text, self.max_result_bytes, "result")
                return tool_result(call.id, text)
            except ToolError as exc:
                mark_error(span, str(exc), "tool_error")
                return tool_result(call.id, cap_text(str(exc), self.max_result_bytes, "error"), is_error=True)
            except TimeoutError:
                mark_error(span, f"no answer within {self.timeout_s:g} s", "timeout")
                return tool_result(
                    call.id,
                    f"{call.name} did not answer within {self.timeout_s:g} s; it may be unavailable.",
                    is_error=True,
                )
            except Exception as exc:  # a tool bug becomes an error result, not a dead service
                span.record_exception(exc)
                mark_error(span, f"{type(exc).__name__}: {exc}", type(exc).__name__)
                log.exception("tool %s failed", call.name)
                return tool_result(
                    call.id, f"{call.name} failed with an internal error; nothing more is known.", is_error=True
                )

    def concurrent(self, calls: list[CheckedCall]) -> bool:
        return self.parallel and not any(c.approved and self.registry.is_serial(c.name) for c in calls)

    async def run(self, calls: list[CheckedCall], turn: Turn) -> list[dict[str, Any]]:
        todo = [c for c in calls if not c.hold]
        if self.concurrent(todo):
            return list(await asyncio.gather(*(self.run_one(c, turn) for c in todo)))
        if len(todo) > 1:
            trace.get_current_span().add_event(
                "calls run one after another", {"roundtrip.order": [c.name for c in todo]}
            )
        return [await self.run_one(c, turn) for c in todo]
