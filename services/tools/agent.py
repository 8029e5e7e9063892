"""An agent: everything a deployment's agent is, declared once, loaded once per process by every service.

An `Agent` names its system prompt, its tools (the JSON Schema documents in its own `tools_dir`, `x-entity`
included), the handlers, policies, entity resolvers, approval rules and serial declarations bound to them by
tool name, its own settings (a zero-argument factory, e.g. a pydantic-settings class, read once), the clients it
needs (`dependencies`: name -> `factory(fleet_settings, own_settings)`, opened once per process, closed at
shutdown, handed to handlers, resolvers and policies as `ctx.deps`), and the customer-facing texts of the
guard's polite replies (`replies`, by outcome) and of the gate's generic errors (`messages`), and the MCP servers
whose tools it mounts (`mcp_servers`: services/tools/mcp.py; their policies, approval rules and serial declarations
are in the same mappings, by tool name).

`load_agent(spec)` finds it: `package.module:attribute` (an Agent, or a zero-argument factory returning one), a
name in the entry-point group `roundtrip.agents`, or, unset, the demo shop's support agent. Anything that does
not fit together raises AgentError (a ConfigurationError: `roundtrip run` prints one line and exits 1).
`current_agent(spec)` is the per-process cached one the services use.

The digest (`Agent.digest`) is a hash of what the model sees of the agent (system prompt and tools): two
processes with the same digest run the same agent.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from services.kernel.events import Outcome
from services.kernel.settings import ConfigurationError, describe_invalid
from services.tools.context import Dependencies
from services.tools.mcp import McpMount, McpServer, McpTools
from services.tools.registry import ApprovalRule, EntityResolver, Handler, Policy, Registry, RegistryError, load_registry

DEFAULT_AGENT = "services.shop.agent:AGENT"  # the demo agent, when ROUNDTRIP_AGENT is unset
ENTRY_POINT_GROUP = "roundtrip.agents"
AGENT_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$")
GATE_MESSAGES = {
    "lookup_failed": "A system this call needs could not be reached to verify it; nothing was done. Try again shortly.",
    "internal_error": "This call could not be checked (an internal error in the gate); nothing was done. Try again.",
}
Factory = Callable[[Any, Any], Any]  # (the fleet's Settings, the agent's own settings) -> a client


class AgentError(ConfigurationError):
    """The agent cannot be found, or does not fit together."""


def approval_rule(can_hold: Callable[[Any], bool]) -> Callable[[ApprovalRule], ApprovalRule]:
    """Declare when a rule can hold a call at all, given the agent's own settings (e.g. only once a threshold is
    set). A rule without this declaration can always hold one: the fleet then treats approvals as configured."""

    def mark(rule: ApprovalRule) -> ApprovalRule:
        rule.can_hold = can_hold  # type: ignore[attr-defined]
        return rule

    return mark


def always(reason: str) -> ApprovalRule:
    """A rule that holds every call of the tool for a person."""

    def rule(args: dict[str, Any], entities: dict[str, dict[str, Any]], settings: Any) -> str | None:
        return reason

    return rule


@dataclass(frozen=True, eq=False)
class Agent:
    name: str
    system_prompt: str
    tools_dir: Path | str
    handlers: Mapping[str, Handler]
    policies: Mapping[str, Policy] = field(default_factory=dict)
    entities: Mapping[str, EntityResolver] = field(default_factory=dict)  # x-entity kind -> resolver
    approvals: Mapping[str, ApprovalRule] = field(default_factory=dict)
    serial: frozenset[str] = frozenset()
    settings: Callable[[], Any] | None = None  # the agent's own settings, read once; approval rules get them
    dependencies: Mapping[str, Factory] = field(default_factory=dict)
    replies: Mapping[str, str] = field(default_factory=dict)  # Outcome value -> what the customer reads
    messages: Mapping[str, str] = field(default_factory=dict)  # GATE_MESSAGES key -> what the model reads
    model: str | None = None  # the model, unless ROUNDTRIP_MODEL says otherwise
    mcp_servers: Sequence[McpServer] = ()  # MCP servers whose tools it mounts (services/tools/mcp.py)

    @cached_property
    def registry(self) -> Registry:
        try:
            return load_registry(Path(self.tools_dir), handlers=self.handlers, policies=self.policies,
                                 entity_resolvers=self.entities, approvals=self.approvals, serial=self.serial,
                                 mounted={name for server in self.mcp_servers for name in server.declared()})
        except RegistryError as exc:
            raise AgentError(f"agent {self.name}: {exc}") from None

    @cached_property
    def mcp(self) -> McpTools:
        """The agent's MCP servers in this process (`await agent.mcp.start()` lists them, `aclose()` stops that)."""
        mounts = [McpMount(server, server.url_for(self.own_settings) or "") for server in self.mcp_servers]
        return McpTools(mounts, self.registry)

    @cached_property
    def own_settings(self) -> Any:
        if self.settings is None:
            return None
        try:
            return self.settings()
        except ValidationError as exc:
            raise AgentError(f"agent {self.name}: invalid settings: {describe_invalid(exc)}") from None

    @cached_property
    def digest(self) -> str:
        """sha256 (first 16 hex digits) of the system prompt and the tools as the model sees them."""
        local = [tool for tool in self.registry.api_tools(cache=False) if tool["name"] in self.registry.local]
        seen: dict[str, Any] = {"system": self.system_prompt, "tools": local}
        if self.mcp_servers:  # what it mounts, not what the servers list (that is known only at run time)
            seen["mcp"] = [[s.name, sorted(s.tools or []), {t: dict(a) for t, a in s.entities.items()}] for s in self.mcp_servers]
        return hashlib.sha256(json.dumps(seen, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]

    def model_for(self, settings: Any) -> str:
        """The model the fleet calls: ROUNDTRIP_MODEL when set, else the agent's default, else the fleet's."""
        return settings.model if self.model is None or "model" in settings.model_fields_set else self.model

    def message(self, key: str) -> str:
        """A generic error of the gate, as this agent words it."""
        return self.messages.get(key, GATE_MESSAGES[key])

    def holds_calls(self) -> bool:
        """Some approval rule can hold a call with these settings: people's decisions matter, so do their keys."""
        return any(getattr(rule, "can_hold", None) is None or rule.can_hold(self.own_settings)
                   for rule in self.approvals.values())

    def open_dependencies(self, fleet_settings: Any) -> Dependencies:
        """The agent's clients, each made once (close them with `aclose()` at shutdown)."""
        clients: dict[str, Any] = {}
        for name, factory in self.dependencies.items():
            try:
                clients[name] = factory(fleet_settings, self.own_settings)
            except Exception as exc:  # noqa: BLE001 - a client that cannot be made stops the start, in one line
                raise AgentError(f"agent {self.name}: dependency {name!r} could not be made: {type(exc).__name__}: {exc}") from None
        return Dependencies(clients)

    def check(self) -> Agent:
        """Raise AgentError naming the first thing that does not fit together; else return the agent."""
        where = f"agent {self.name!r}"
        if not isinstance(self.name, str) or not AGENT_NAME.match(self.name):
            raise AgentError(f"{where}: the name must match {AGENT_NAME.pattern}")
        if not isinstance(self.system_prompt, str) or not self.system_prompt.strip():
            raise AgentError(f"{where}: the system prompt is empty")
        if not Path(self.tools_dir).is_dir():
            raise AgentError(f"{where}: tools_dir {self.tools_dir} is not a folder")
        outcomes = {o.value for o in Outcome}
        if stray := sorted(set(self.replies) - outcomes):
            raise AgentError(f"{where}: replies for unknown outcomes {stray} (known: {sorted(outcomes)})")
        if stray := sorted(set(self.messages) - set(GATE_MESSAGES)):
            raise AgentError(f"{where}: messages for unknown keys {stray} (known: {sorted(GATE_MESSAGES)})")
        if bad := sorted(n for n in self.dependencies if not n.isidentifier() or not callable(self.dependencies[n])):
            raise AgentError(f"{where}: dependencies {bad} need an identifier as name and a factory as value")
        self.registry  # noqa: B018 - builds and checks the tools
        self.own_settings  # noqa: B018 - reads and checks the agent's own settings
        self._check_mcp(where)
        return self

    def _check_mcp(self, where: str) -> None:
        problems = [p for server in self.mcp_servers for p in server.problems(self.entities)]
        names = [server.name for server in self.mcp_servers]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"MCP servers declared twice: {twice}")
        declared = [tool for server in self.mcp_servers for tool in server.declared()]
        if taken := sorted({t for t in declared if declared.count(t) > 1 or t in self.registry.specs}):
            problems.append(f"MCP tools declared by two servers or named like a local tool: {taken}")
        for server in [] if problems else self.mcp_servers:
            try:
                url = server.url_for(self.own_settings)
            except Exception as exc:  # noqa: BLE001 - the author's function failed: one line
                raise AgentError(f"{where}: the URL of MCP server {server.name} could not be read: {type(exc).__name__}: {exc}") from None
            if not url:
                problems.append(f"MCP server {server.name} has no URL: set {server.env_var} (or give McpServer a url)")
        if problems:
            raise AgentError(f"{where}: " + "; ".join(problems))


def _resolve(spec: str) -> Any:
    if ":" not in spec:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
        if not found:
            raise AgentError(f"ROUNDTRIP_AGENT={spec!r}: not package.module:attribute, and no entry point of that name "
                             f"in the group {ENTRY_POINT_GROUP}")
        spec = found[0].value
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AgentError(f"ROUNDTRIP_AGENT={spec!r}: expected package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentError(f"ROUNDTRIP_AGENT={spec!r}: cannot import {module_name}: {exc}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise AgentError(f"ROUNDTRIP_AGENT={spec!r}: {module_name} has no attribute {attribute}")
        target = getattr(target, part)
    return target


def load_agent(spec: str | None = None) -> Agent:
    """The agent `spec` names (see the module docstring), checked."""
    spec = (spec or "").strip() or DEFAULT_AGENT
    target = _resolve(spec)
    if not isinstance(target, Agent) and callable(target):
        try:
            target = target()
        except AgentError:
            raise
        except Exception as exc:  # noqa: BLE001 - the author's factory failed: say so in one line
            raise AgentError(f"ROUNDTRIP_AGENT={spec!r}: the factory failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(target, Agent):
        raise AgentError(f"ROUNDTRIP_AGENT={spec!r}: is a {type(target).__name__}, not an Agent (services.agent.Agent)")
    return target.check()


@lru_cache(maxsize=8)
def current_agent(spec: str | None = None) -> Agent:
    """The agent of this process (loaded and checked once per spec)."""
    return load_agent(spec)
