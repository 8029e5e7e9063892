"""An agent: everything a deployment's agent is, declared once and loaded once per process by every service.

`load_agent(spec)` finds it: `package.module:attribute` (an Agent, or a zero-argument factory returning one), a name
in the entry-point group `roundtrip.agents`, or, unset, the demo shop's support agent. What does not fit together
raises AgentError naming every problem the checks of CHECKS found. `Agent.digest` hashes what the model sees of the
agent (system prompt and tools): two processes with the same digest run the same agent.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from roundtrip._kernel.settings import ConfigurationError, ModelSettings, describe_invalid
from roundtrip._kernel.settings.checks import env_name_in
from roundtrip._sdk.context import Dependencies
from roundtrip._sdk.functions import FunctionTool, function_tool
from roundtrip._sdk.mcp import McpServer
from roundtrip._sdk.registry import ApprovalRule, EntityResolver, Handler, Policy, Registry, ToolSpec, binding_problems
from roundtrip._sdk.sources import SchemaFolder, Toolbox, ToolSource
from roundtrip._sdk.texts import gate_message, text_problems

DEFAULT_AGENT = "roundtrip._shop.agent:AGENT"
RENAMED = {"services.shop.agent:AGENT": DEFAULT_AGENT}  # the demo agent's former import string, still honoured
ENTRY_POINT_GROUP = "roundtrip.agents"
AGENT_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$")


class FleetSettings(Protocol):
    """What a dependency factory reads of the fleet's settings (`ROUNDTRIP_STATE_DIR`, ...)."""

    @property
    def state_dir(self) -> Path: ...

    @property
    def listen_host(self) -> str: ...

    @property
    def tool_timeout_s(self) -> float: ...


Factory = Callable[[FleetSettings, Any], Any]  # (the fleet's settings, the agent's own settings) -> a client


class AgentError(ConfigurationError):
    """The agent cannot be found, or does not fit together (`problems`: every one found, each a sentence)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems) if problems else [message]


def approval_rule(can_hold: Callable[[Any], bool]) -> Callable[[ApprovalRule], ApprovalRule]:
    """Declare when a rule can hold a call at all, given the agent's own settings (e.g. once a threshold is set).
    A rule without it can always hold one: the fleet then treats approvals as configured."""

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
    """An agent, declared once; the manual's "What an agent declares" (docs/agent/index.md) describes each field."""

    name: str
    system_prompt: str
    tools_dir: Path | str | None = None
    handlers: Mapping[str, Handler] = field(default_factory=dict)
    tools: Sequence[ToolSource | Callable[..., Any]] = ()  # any mix of SchemaFolder, @tool functions, McpServer
    policies: Mapping[str, Policy] = field(default_factory=dict)
    entities: Mapping[str, EntityResolver] = field(default_factory=dict)  # x-entity kind -> resolver
    approvals: Mapping[str, ApprovalRule] = field(default_factory=dict)
    serial: frozenset[str] = frozenset()
    settings: Callable[[], Any] | None = None  # the agent's own settings, read once
    dependencies: Mapping[str, Factory] = field(default_factory=dict)
    replies: Mapping[str, str] = field(default_factory=dict)
    messages: Mapping[str, str] = field(default_factory=dict)
    acted_replies: Mapping[str, str] = field(default_factory=dict)
    example_ask: str = ""
    example_customer: str = ""
    example_script: Sequence[Any] = ()
    model: str | None = None
    mcp_servers: Sequence[McpServer] = ()
    # (tool, input, result text) -> what a side effect did, e.g. "I cancelled order ord_1"; None: "<tool> succeeded"
    describe_action: Callable[[str, dict[str, Any], str], str | None] | None = None
    progress: Mapping[str, str] = field(default_factory=dict)
    # (fleet settings, own settings) -> None, or a coroutine: its backends back to a known state (eval run --fresh)
    reset: Callable[[FleetSettings, Any], Any] | None = None

    @cached_property
    def sources(self) -> tuple[ToolSource, ...]:
        folder = [SchemaFolder(self.tools_dir, self.handlers)] if self.tools_dir is not None else []
        given = [t if isinstance(t, ToolSource) else function_tool(t) for t in self.tools]
        return (*folder, *given, *self.mcp_servers)

    @cached_property
    def tool_parts(self) -> tuple[dict[str, ToolSpec], dict[str, Handler], list[str]]:
        """The tools its sources offer before any process starts them, their handlers, and every problem found."""
        specs: dict[str, ToolSpec] = {}
        handlers: dict[str, Handler] = {} if self.tools_dir is not None else dict(self.handlers)
        problems: list[str] = (
            []
            if self.sources
            else ["no tools: give tools_dir (JSON Schema documents), tools (Python functions) or mcp_servers"]
        )
        for source in self.sources:
            problems += source.problems(self.entities)
            offered = source.specs()
            problems += [f"{source.label}: tool {name} is declared twice" for name in sorted(set(specs) & set(offered))]
            specs, handlers = {**specs, **offered}, {**handlers, **source.handlers()}
        functions = {name for source in self.sources if isinstance(source, FunctionTool) for name in source.specs()}
        if twice := sorted(set(self.handlers) & functions):
            problems.append(f"handlers for function tools (a function is its own handler): {twice}")
        problems += binding_problems(
            specs, handlers, self.policies, self.entities, self.approvals, self.serial, self.mounted
        )
        return specs, handlers, problems

    @property
    def mounted(self) -> frozenset[str]:
        return frozenset(name for source in self.sources for name in source.declared() - set(source.specs()))

    @property
    def offered(self) -> frozenset[str]:
        return frozenset(self.tool_parts[0]) | self.mounted

    @property
    def mcp_sources(self) -> list[McpServer]:
        return [source for source in self.sources if isinstance(source, McpServer)]

    @cached_property
    def registry(self) -> Registry:
        specs, handlers, problems = self.tool_parts
        if problems:
            raise AgentError(f"agent {self.name}: " + "; ".join(problems), problems)
        return Registry(specs, handlers, self.policies, self.entities, self.approvals, self.serial, self.mounted)

    @cached_property
    def toolbox(self) -> Toolbox:
        """Its tool sources in this process: `toolbox.run_with(app)` starts them with a service, closes them after."""
        return Toolbox([source.bind(self.own_settings) for source in self.sources], self.registry)

    @cached_property
    def own_settings(self) -> Any:
        if self.settings is None:
            return None
        try:
            return self.settings()
        except ValidationError as exc:
            said = describe_invalid(exc, env_name_in(self.settings))
            raise AgentError(f"agent {self.name}: invalid settings: {said}") from None

    @cached_property
    def digest(self) -> str:
        local = [tool for tool in self.registry.api_tools(cache=False) if tool["name"] in self.registry.local]
        seen: dict[str, Any] = {"system": self.system_prompt, "tools": local}
        if servers := self.mcp_sources:  # what it mounts: what the servers list is known only at run time
            seen["mcp"] = [[s.name, s.named, {t: dict(a) for t, a in s.entities.items()}] for s in servers]
        return hashlib.sha256(json.dumps(seen, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]

    def model_for(self, settings: ModelSettings) -> str:
        """The model the fleet calls: ROUNDTRIP_MODEL when set, else the agent's default, else the fleet's."""
        return settings.model if self.model is None or "model" in settings.model_fields_set else self.model

    def message(self, key: str, **fields: Any) -> str:
        return gate_message(key, self.messages, **fields)

    def holds_calls(self) -> bool:
        return any(
            (can_hold := getattr(rule, "can_hold", None)) is None or can_hold(self.own_settings)
            for rule in self.approvals.values()
        )

    def open_dependencies(self, fleet_settings: FleetSettings) -> Dependencies:
        clients: dict[str, Any] = {}
        for name, factory in self.dependencies.items():
            try:
                clients[name] = factory(fleet_settings, self.own_settings)
            except Exception as exc:  # noqa: BLE001 - a client that cannot be made stops the start, in one line
                raise AgentError(
                    f"agent {self.name}: dependency {name!r} could not be made: {type(exc).__name__}: {exc}"
                ) from None
        return Dependencies(clients)

    def problems(self) -> list[str]:
        found: list[str] = []
        for check in CHECKS:
            try:
                found += check(self)
            except Exception as exc:  # noqa: BLE001 - a check that cannot even run is one more problem, not a traceback
                found.append(f"{getattr(check, '__name__', check)} could not run: {type(exc).__name__}: {exc}")
        return found

    def check(self) -> Agent:
        if problems := self.problems():
            raise AgentError(f"agent {self.name!r}: " + "; ".join(problems), problems)
        return self


def _identity(agent: Agent) -> list[str]:
    problems = []
    if not isinstance(agent.name, str) or not AGENT_NAME.match(agent.name):
        problems.append(f"the name must match {AGENT_NAME.pattern} (it is {agent.name!r})")
    if not isinstance(agent.system_prompt, str) or not agent.system_prompt.strip():
        problems.append("the system prompt is empty")
    return problems


def _dependencies(agent: Agent) -> list[str]:
    if agent.describe_action is not None and not callable(agent.describe_action):
        return ["describe_action must be a function (tool, input, result) -> str"]
    if bad := sorted(n for n in agent.dependencies if not n.isidentifier() or not callable(agent.dependencies[n])):
        return [f"dependencies {bad} need an identifier as name and a factory as value"]
    return []


def _tools(agent: Agent) -> list[str]:
    return agent.tool_parts[2]


def _own_settings(agent: Agent) -> list[str]:
    try:
        agent.own_settings  # noqa: B018 - reading them checks them
    except AgentError as exc:
        return [str(exc).removeprefix(f"agent {agent.name}: ")]
    return []


def _mcp(agent: Agent) -> list[str]:
    servers, problems = agent.mcp_sources, []
    names = [server.name for server in servers]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"MCP servers declared twice: {twice}")
    declared = [tool for server in servers for tool in server.declared()]
    if taken := sorted({t for t in declared if declared.count(t) > 1 or t in agent.tool_parts[0]}):
        problems.append(f"MCP tools declared by two servers or named like a local tool: {taken}")
    for server in [] if problems or any(s.problems(agent.entities) for s in servers) else servers:
        try:
            url = server.url_for(agent.own_settings)
        except AgentError:
            continue
        except Exception as exc:  # noqa: BLE001 - the author's function failed: one line
            problems.append(f"the URL of MCP server {server.name} could not be read: {type(exc).__name__}: {exc}")
            continue
        if not url:
            problems.append(f"MCP server {server.name} has no URL: set {server.env_var} (or give McpServer a url)")
        if (setting := server.auth and server.auth.setting_name) and not hasattr(agent.own_settings, setting):
            problems.append(
                f"MCP server {server.name}: its credentials name the setting {setting}, which the agent's "
                "own settings (Agent(settings=...)) do not have"
            )
    return problems


# What `Agent.check` asks, in order; a part of the fleet with more to check appends its own.
CHECKS: list[Callable[[Agent], Iterable[str]]] = [
    _identity,
    text_problems,
    _dependencies,
    _tools,
    _own_settings,
    _mcp,
]


def _resolve(spec: str) -> Any:
    spec = RENAMED.get(spec, spec)
    if ":" not in spec:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
        if not found:
            raise AgentError(
                f"ROUNDTRIP_AGENT={spec!r}: not package.module:attribute, and no entry point of that name "
                f"in the group {ENTRY_POINT_GROUP}"
            )
        spec = found[0].value
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AgentError(f"ROUNDTRIP_AGENT={spec!r}: expected package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as exc:  # in the module or one it imports: where, as Python says it
        raise AgentError(
            f"ROUNDTRIP_AGENT={spec!r}: cannot import {module_name}: SyntaxError: {exc.msg}"
            f"{_at(exc.filename, exc.lineno)}"
        ) from None
    except ImportError as exc:
        raise AgentError(
            f"ROUNDTRIP_AGENT={spec!r}: cannot import {module_name}: {_one_line(exc, False)}{_where(exc, module_name)}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the module raised as it was imported: one line saying what and where
        raise AgentError(
            f"ROUNDTRIP_AGENT={spec!r}: cannot import {module_name}: {_one_line(exc)}{_where(exc, module_name)}"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise AgentError(f"ROUNDTRIP_AGENT={spec!r}: {module_name} has no attribute {attribute}")
        target = getattr(target, part)
    return target


def _one_line(exc: BaseException, named: bool = True) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if named else message


def _at(filename: str | None, line: int | None) -> str:
    return f" ({filename}, line {line})" if filename and line else ""


def _where(exc: BaseException, module_name: str) -> str:
    """` (file, line N)` of the deepest frame in the agent's own package, else outside the import machinery."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name != __file__ and not name.startswith("<frozen importlib") and Path(name).parent.name != "importlib":
            frames.append((name, tb.tb_lineno))
        tb = tb.tb_next
    if not frames:
        return ""
    home = _home(module_name.partition(".")[0])
    own = [f for f in frames if home is not None and (Path(f[0]) == home or home in Path(f[0]).parents)]
    return _at(*(own or frames)[-1])


def _home(package: str) -> Path | None:
    try:
        found = importlib.util.find_spec(package)
    except Exception:  # noqa: BLE001 - not findable: no home to prefer
        return None
    if found is None or not found.origin:
        return None
    return Path(found.origin).parent if found.submodule_search_locations else Path(found.origin)


def load_agent(spec: str | None = None, check: bool = True) -> Agent:
    """The agent `spec` names, checked unless `check` is false."""
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
        raise AgentError(f"ROUNDTRIP_AGENT={spec!r}: is a {type(target).__name__}, not an Agent (roundtrip.Agent)")
    return target.check() if check else target


@lru_cache(maxsize=8)
def current_agent(spec: str | None) -> Agent:
    return load_agent(spec)
