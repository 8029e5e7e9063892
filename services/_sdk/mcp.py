"""MCP tools: the tools of an MCP server (streamable HTTP, the `mcp` package's client) mounted by an agent.

It mounts only the tools it names (or, with `tools="all"`, those `entities` annotates): a tool a server adds later
never reaches the model before the agent says which of its arguments name an entity. Each process lists each server
in the background and keeps the listing for its life; until a server answers, its tools are refused, not the
service. A listed schema is checked as a local one, with MCP's two relaxations: an object without
`additionalProperties` is closed, a missing `required` means none. The manual: docs/agent/tools.md.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import propagate

from roundtrip._sdk.context import ToolContext, ToolError
from roundtrip._sdk.entity_places import NAMED_SUBSCHEMAS
from roundtrip._sdk.mcp_auth import BearerToken, ClientCredentials, CredentialError, McpAuth
from roundtrip._sdk.registry import RegistryError, ToolSpec, check_tool_document
from roundtrip._sdk.sources import OnListed, ToolSource

log = logging.getLogger("roundtrip.mcp")

SERVER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$")
FIRST_RETRY_S = 0.5
MAX_PAGES = 100  # a paginated listing that never ends cannot hold a process
REFUSING = (401, 403)


@dataclass(frozen=True)
class McpServer(ToolSource):
    """An MCP server whose tools an agent mounts (a tool source: `Agent(tools=[McpServer(...)])`).

    `url`: its streamable HTTP endpoint, a function of the agent's own settings returning it, or None: the
    variable ROUNDTRIP_MCP_<NAME>_URL. `tools`: the tools it mounts (left out: those `entities` names), or "all":
    every listed tool `entities` has an entry for. `entities`: per tool, {argument: x-entity kind} (`{}`: none)."""

    name: str
    url: str | Callable[[Any], str] | None = None
    tools: Collection[str] | Literal["all"] = ()
    entities: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    timeout_s: float = 10.0  # of one listing attempt
    retry_max_s: float = 30.0
    auth: McpAuth | None = None

    @property
    def credentials(self) -> str:
        """The credentials it is given, by kind and source, never a value."""
        return f"{self.auth.kind} ({self.auth.source})" if self.auth is not None else "none (McpServer gives no auth=)"

    @property
    def env_var(self) -> str:
        return "ROUNDTRIP_MCP_" + re.sub(r"[^A-Z0-9]", "_", self.name.upper()) + "_URL"

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"MCP server {self.name}"

    @property
    def takes_all(self) -> bool:
        return isinstance(self.tools, str) and self.tools == "all"

    @property
    def named(self) -> list[str] | str:
        return "all" if self.takes_all else sorted(self.tools or ())

    def declared(self) -> frozenset[str]:
        listed = () if isinstance(self.tools, str) else (self.tools or ())
        return frozenset(listed) | frozenset(self.entities)

    def specs(self) -> Mapping[str, ToolSpec]:
        return {}

    def bind(self, own_settings: Any) -> McpMount:
        return McpMount(self, self.url_for(own_settings) or "", own_settings)

    async def call(self, name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
        return await self.bind(None).call(name, args, ctx)

    def url_for(self, own_settings: Any) -> str | None:
        if callable(self.url):
            return self.url(own_settings)
        return self.url or os.environ.get(self.env_var) or None

    def problems(self, kinds: Collection[str]) -> list[str]:
        found = []
        if not isinstance(self.name, str) or not SERVER_NAME.match(self.name):
            found.append(f"MCP server name {self.name!r} must match {SERVER_NAME.pattern}")
        if isinstance(self.tools, str) and not self.takes_all:
            found.append(f"MCP server {self.name}: tools must be a list of tool names or 'all', not {self.tools!r}")
        elif not self.takes_all and not self.declared():
            found.append(
                f"MCP server {self.name} names no tools: list the ones the agent mounts (tools=[...]), or take every "
                "tool it lists with tools='all' and an entry in entities for each (an empty one for a tool that takes "
                "no entity id)"
            )
        elif not self.takes_all and self.tools and (stray := sorted(set(self.entities) - set(self.tools))):
            found.append(f"MCP server {self.name}: entities for tools it does not mount: {stray}")
        if unbound := sorted({k for args in self.entities.values() for k in args.values()} - set(kinds)):
            found.append(f"MCP server {self.name}: x-entity kinds without a resolver: {unbound}")
        if self.auth is not None and not isinstance(self.auth, BearerToken | ClientCredentials):
            found.append(
                f"MCP server {self.name}: auth must be a BearerToken or ClientCredentials, "
                f"not {type(self.auth).__name__}"
            )
        elif self.auth is not None:
            found += [f"MCP server {self.name}: {problem}" for problem in self.auth.problems()]
        return found


def leaf(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio's task groups wrap transport errors in them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    exc = leaf(exc)
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def shown(url: str) -> str:
    """A URL as a log line may show it: without user, password or query (they may carry a credential)."""
    parts = urlsplit(url)
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _object_schemas(schema: Any, path: str = "#") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, list):
        for i, sub in enumerate(schema):
            found += _object_schemas(sub, f"{path}/{i}")
        return found
    if not isinstance(schema, dict):
        return found
    if schema.get("type") == "object" or "properties" in schema:
        found.append((path, schema))
    for key, value in schema.items():
        if key in NAMED_SUBSCHEMAS and isinstance(value, dict):
            for name, sub in value.items():
                found += _object_schemas(sub, f"{path}/{key}/{name}")
        elif key in (
            "items",
            "additionalItems",
            "contains",
            "not",
            "if",
            "then",
            "else",
            "prefixItems",
            "allOf",
            "anyOf",
            "oneOf",
            "unevaluatedItems",
            "propertyNames",
        ):
            found += _object_schemas(value, f"{path}/{key}")
    return found


def strict_copy(server: McpServer, tool: Any) -> dict[str, Any]:
    """The tool document the registry checks: the listed tool with the agent's annotations and MCP's relaxations."""
    schema = copy.deepcopy(tool.input_schema) if isinstance(tool.input_schema, dict) else {}
    schema.setdefault("required", [])
    for _, sub in _object_schemas(schema):
        sub.setdefault("additionalProperties", False)
    properties = found if isinstance(found := schema.get("properties"), dict) else {}
    for argument, kind in server.entities.get(tool.name, {}).items():
        if not isinstance(properties.get(argument), dict):
            raise RegistryError(
                f"the agent annotates its argument {argument!r}, which the server's schema does not have"
            )
        properties[argument]["x-entity"] = kind
    description = tool.description if isinstance(tool.description, str) and len(tool.description) >= 20 else None
    if description is None:
        log.warning(
            "MCP server %s: tool %s has no description of 20 characters; one naming the server is used",
            server.name,
            tool.name,
        )
    return {
        "name": tool.name,
        "description": description or f"{tool.name}: a tool of the {server.name} service.",
        "input_schema": schema,
    }


def result_of(name: str, result: Any) -> dict[str, Any]:
    texts = [
        getattr(block, "text", None) or f"[{getattr(block, 'type', 'content')} omitted]" for block in result.content
    ]
    if result.is_error:
        raise ToolError(" ".join(texts).strip() or f"{name} reported an error and said nothing more.")
    if isinstance(result.structured_content, dict):
        return result.structured_content
    if len(texts) == 1:
        try:
            parsed = json.loads(texts[0])
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return {"content": "\n".join(texts)}


class McpMount(ToolSource):
    def __init__(self, server: McpServer, url: str, own_settings: Any) -> None:
        self.server, self.url = server, url
        self._own_settings = own_settings
        self.label = server.label
        self.listed: dict[str, Any] | None = None
        self.last_error: str | None = None
        self.refusing: str | None = None
        self._provider: Any = None
        self._fit: dict[str, ToolSpec] = {}
        self._refused: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        return self.listed is not None

    def specs(self) -> Mapping[str, ToolSpec]:
        return self._fit

    def refusals(self) -> Mapping[str, str]:
        return self._refused

    def declared(self) -> frozenset[str]:
        return self.server.declared()

    @asynccontextmanager
    async def connection(self, answers: list[int]) -> AsyncIterator[Any]:
        """A client over a connection of its own; `answers` gets the status of each answer of the MCP endpoint."""
        import httpx2  # imported where used: the SDK takes seconds to import, only an agent with servers needs it
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        headers: dict[str, str] = {}
        if isinstance(self.server.auth, BearerToken):
            headers = self.server.auth.headers(self._own_settings)
        elif isinstance(self.server.auth, ClientCredentials) and self._provider is None:
            self._provider = self.server.auth.provider(self.url, self._own_settings)
        endpoint = httpx2.URL(self.url)

        async def note(response: httpx2.Response) -> None:
            if response.request.url.copy_with(query=None) == endpoint.copy_with(query=None):
                answers.append(response.status_code)

        async with (
            httpx2.AsyncClient(
                headers=headers,
                auth=self._provider,
                timeout=httpx2.Timeout(30.0, read=300.0),  # the mcp package's own defaults
                event_hooks={"response": [note]},
            ) as http,
            Client(streamable_http_client(self.url, http_client=http)) as client,
        ):
            yield client

    def refusal(self, exc: BaseException, answers: list[int]) -> str | None:
        """Why a failed exchange failed when it is the credentials, else None."""
        exc = leaf(exc)
        if isinstance(exc, CredentialError):
            return f"its credentials cannot be read: {exc}"
        if type(exc).__name__ in ("OAuthTokenError", "OAuthFlowError", "OAuthRegistrationError"):
            self._provider = None  # made again at the next call, with the secret read again (it may have rotated)
            return f"the authorization server did not give a token: {describe(exc)}"
        if answers and answers[-1] in REFUSING:
            self._provider = None
            return f"HTTP {answers[-1]}"
        return None

    def note_refusal(self, why: str | None) -> None:
        """One line when the server starts refusing the credentials (never their value), one when it accepts them."""
        if why is not None and why != self.refusing:
            log.error(
                "MCP server %s (%s) refused the credentials %s: %s; its tools answer is_error until it accepts them",
                self.server.name,
                shown(self.url),
                self.server.credentials,
                why,
            )
        elif why is None and self.refusing is not None:
            log.warning("MCP server %s accepts the credentials %s again", self.server.name, self.server.credentials)
        self.refusing = why

    async def list_once(self) -> dict[str, Any]:
        answers: list[int] = []
        try:
            tools = await self._list(answers)
        except Exception as exc:
            self.note_refusal(self.refusal(exc, answers))
            raise
        self.note_refusal(None)
        return tools

    async def _list(self, answers: list[int]) -> dict[str, Any]:
        tools: dict[str, Any] = {}
        async with self.connection(answers) as client:
            cursor = None
            for _ in range(MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.update({tool.name: tool for tool in page.tools})
                cursor = page.next_cursor
                if not cursor:
                    break
        return tools

    def take(self, listed: dict[str, Any]) -> list[str]:
        """Keep a listing and check each tool it mounts; return what it lacks of the agent's declaration."""
        server, self.listed = self.server, listed
        if server.takes_all and (unannotated := sorted(set(listed) - server.declared())):
            why = (
                "the agent takes all of its server's tools but declares no entities for this one (name it in "
                "McpServer's entities, with {} if none of its arguments is an entity id)"
            )
            self._refused.update(dict.fromkeys(unannotated, why))
            log.warning("MCP server %s: tools %s not mounted: %s", server.name, unannotated, why)
        for name in sorted(n for n in listed if n in server.declared()):
            try:
                self._fit[name] = check_tool_document(
                    strict_copy(server, listed[name]), source=f"MCP server {server.name}"
                )
            except Exception as exc:  # noqa: BLE001 - a tool that does not fit is refused, the others are mounted
                self._refused[name] = str(exc) if isinstance(exc, RegistryError) else describe(exc)
                log.error("MCP server %s: tool %s not mounted: %s", server.name, name, self._refused[name])
        if missing := sorted(server.declared() - set(listed)):
            log.error("MCP server %s does not list %s, which the agent declares; refused", server.name, missing)
            return [f"MCP server {server.name} does not list {missing}, which the agent declares"]
        return []

    async def keep_listing(self, on_listed: OnListed, attempted: asyncio.Event) -> None:
        """List the tools, asking again with a bounded backoff until it answers; `attempted`: set after the first."""
        delay = FIRST_RETRY_S
        while True:
            try:
                listed = await asyncio.wait_for(self.list_once(), self.server.timeout_s)
            except Exception as exc:  # noqa: BLE001 - a server that is down is asked again, never a dead service
                attempted.set()
                error = describe(exc)
                if error != self.last_error and self.refusing is None:  # a refusal has said so already
                    log.warning(
                        "MCP server %s (%s) unavailable: %s; its tools are refused, asking again every %g s at most",
                        self.server.name,
                        shown(self.url),
                        error,
                        self.server.retry_max_s,
                    )
                self.last_error = error
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.server.retry_max_s)
                continue
            self.last_error = None
            try:
                self.take(listed)
                on_listed(self)
            finally:
                attempted.set()
            return

    async def start(self, on_listed: OnListed) -> None:
        """List the server in the background; return once it has been asked once (at most its timeout)."""
        if self.up or self._task is not None:
            return
        attempted = asyncio.Event()
        self._task = asyncio.create_task(self.keep_listing(on_listed, attempted), name=f"mcp-{self.server.name}")
        await attempted.wait()

    async def check(self, on_listed: OnListed) -> list[str]:
        try:
            listed = await asyncio.wait_for(self.list_once(), self.server.timeout_s)
        except Exception as exc:  # noqa: BLE001 - reported, like every other problem
            if self.refusing is not None:
                return [
                    f"MCP server {self.server.name} ({shown(self.url)}) refused the credentials "
                    f"{self.server.credentials}: {self.refusing}"
                ]
            return [f"MCP server {self.server.name} ({shown(self.url)}) does not answer: {describe(exc)}"]
        missing = self.take(listed)
        on_listed(self)
        return missing

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def unavailable(self, name: str) -> str | None:
        if not self.up and self.refusing is not None:
            return (
                f"Tool {name} is unavailable: the {self.server.name} service it belongs to does not accept the "
                "fleet's credentials right now; nothing was done. Do without it."
            )
        if not self.up:
            return (
                f"Tool {name} is unavailable: the {self.server.name} service it belongs to cannot be reached "
                "right now; nothing was done. Try again later or do without it."
            )
        return f"Tool {name} is not offered by the {self.server.name} service any more; nothing was done."

    async def call(self, name: str, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "roundtrip/customer_id": ctx.customer_id,
            "roundtrip/idempotency_key": ctx.idempotency_key,
        }
        propagate.inject(meta)  # the turn's traceparent (the execute_tool span's), so the server's spans join the turn
        answers: list[int] = []
        try:
            async with self.connection(answers) as client:
                result = await client.call_tool(name, args, meta=meta)
        except Exception as exc:  # noqa: BLE001 - the transport failed: the model reads it as an error result
            if (why := self.refusal(exc, answers)) is not None:
                self.note_refusal(why)
                raise ToolError(
                    f"{name} was not done: the {self.server.name} service did not accept the fleet's credentials. "
                    "Tell the customer it cannot be done right now; do not retry."
                ) from None
            log.warning("MCP server %s: %s failed: %s", self.server.name, name, describe(exc))
            from mcp.shared.exceptions import MCPError  # loaded already: the client was

            if isinstance(refusal := leaf(exc), MCPError):
                raise ToolError(
                    f"{name} was refused by the {self.server.name} service: {refusal.message[:300]}"
                ) from None
            raise ToolError(
                f"{name} could not be completed: the {self.server.name} service could not be reached or "
                "did not answer, so whether it acted is unknown. Tell the customer, do not retry at once."
            ) from None
        self.note_refusal(None)
        return result_of(name, result)
