"""What a tool handler, resolver or policy gets besides the model's input: the principal and the agent's clients.

The principal (`customer_id`) comes from the support request's envelope, never from the model. `idempotency_key`
is derived from the tool_use id, so a redelivered call performs its side effect once. `deps`: the agent's
`dependencies`, opened once per process (`ctx.deps.billing`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


class Dependencies(Mapping[str, Any]):
    """The agent's clients by name, readable as attributes (`deps.crm`) or items (`deps["crm"]`)."""

    def __init__(self, clients: Mapping[str, Any] | None = None) -> None:
        self._clients = dict(clients or {})

    def __getitem__(self, name: str) -> Any:
        return self._clients[name]

    def __getattr__(self, name: str) -> Any:
        try:
            return self._clients[name]
        except KeyError:
            raise AttributeError(
                f"the agent declares no dependency {name!r} (it has: {sorted(self._clients)})"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._clients)

    def __len__(self) -> int:
        return len(self._clients)

    async def aclose(self) -> None:
        """Close every client that can be closed (`aclose()` awaited, else `close()`), in reverse order of opening."""
        for client in reversed(list(self._clients.values())):
            closer = getattr(client, "aclose", None) or getattr(client, "close", None)
            if closer is not None:
                result = closer()
                if hasattr(result, "__await__"):
                    await result


@dataclass
class ToolContext:
    customer_id: str
    tool_use_id: str
    idempotency_key: str
    deps: Dependencies = field(default_factory=Dependencies)
    metadata: dict[str, Any] = field(default_factory=dict)  # the request's metadata: the app's own (locale, tier...)


class ToolError(Exception):
    """A failure the model should see (as an `is_error` tool_result) and can act on."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
