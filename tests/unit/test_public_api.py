"""The public API of the package, listed once: `roundtrip.__all__` and `roundtrip.testing.__all__`. A name that
disappears from either fails here; everything else the package holds is visibly private (an underscore-prefixed
component in its module path), and the public modules' docstrings show the imports an agent author writes."""

from __future__ import annotations

import importlib
import re
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {  # the public API: a name removed from here is a breaking change, said on purpose
    "roundtrip": [
        "Agent",
        "AgentError",
        "BearerToken",
        "ClientCredentials",
        "Dependencies",
        "Entity",
        "FleetSettings",
        "FunctionTool",
        "McpServer",
        "SchemaFolder",
        "ToolContext",
        "ToolError",
        "ToolSource",
        "allow",
        "always",
        "approval_rule",
        "load_agent",
        "tool",
    ],
    "roundtrip.testing": [
        "AWAITING_APPROVAL",
        "Call",
        "CallOptions",
        "FunctionModel",
        "Model",
        "ModelInfo",
        "Reply",
        "ScriptExhausted",
        "ScriptedModel",
        "ToolRun",
        "TurnResult",
        "arun_turn",
        "call",
        "reply",
        "run_turn",
    ],
}
PUBLIC_MODULES = {"roundtrip", "roundtrip.testing", "roundtrip.schemas"}
REQUIRED_IMPORTS = {  # what an agent author writes
    "roundtrip": "from roundtrip import Agent, tool, Entity, ToolContext, ToolError, McpServer, always, approval_rule",
    "roundtrip.testing": "from roundtrip.testing import ScriptedModel, FunctionModel, call, run_turn",
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_no_public_name_disappears(module):
    exported = importlib.import_module(module).__all__
    assert not (missing := sorted(set(PUBLIC[module]) - set(exported))), f"{module}.__all__ lost {missing}"
    assert sorted(exported) == sorted(PUBLIC[module]), (
        f"{module}.__all__ gained {sorted(set(exported) - set(PUBLIC[module]))}: "
        "add it to PUBLIC here if it is meant to be public"
    )
    assert len(exported) == len(set(exported))


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_is_importable_and_not_underscored(module):
    namespace: dict = {}
    exec(f"from {module} import {', '.join(PUBLIC[module])}", namespace)  # the import an author writes
    for name in PUBLIC[module]:
        assert not name.startswith("_"), name
        assert namespace[name] is getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("module", sorted(REQUIRED_IMPORTS))
def test_the_imports_the_issue_promises_work_and_the_docstring_shows_them(module):
    namespace: dict = {}
    exec(REQUIRED_IMPORTS[module], namespace)
    doc = importlib.import_module(module).__doc__ or ""
    shown = re.findall(rf"^\s*from {re.escape(module)} import ([\w, ]+)$", doc, re.M)
    assert shown, f"{module}'s docstring shows no `from {module} import ...`"
    names = {name.strip() for line in shown for name in line.split(",")}
    assert names <= set(PUBLIC[module]), (
        f"{module}'s docstring imports names it does not export: {names - set(PUBLIC[module])}"
    )
    required = [name.strip() for name in REQUIRED_IMPORTS[module].split(" import ")[1].split(",")]
    assert not (unsaid := [n for n in required if not re.search(rf"\b{n}\b", doc)]), (
        f"{module}'s docstring never says {unsaid}"
    )
    assert "services/" not in doc, f"{module}'s docstring points at internal paths, not at the public imports"


@pytest.mark.parametrize("name", ["run_turn", "arun_turn"])
def test_a_turn_takes_typed_keywords_and_never_the_fleets_settings(name):
    import inspect

    turn = getattr(importlib.import_module("roundtrip.testing"), name)
    parameters = inspect.signature(turn).parameters
    assert list(parameters) == ["agent", "customer_id", "text", "model", "deps", "state_dir", "approve", "persona"]
    assert all(parameters[p].kind is inspect.Parameter.KEYWORD_ONLY for p in list(parameters)[4:])
    hints = typing.get_type_hints(turn)
    assert hints["state_dir"] == Path | None
    assert not [p for p, hint in hints.items() if hint is typing.Any or "Settings" in str(hint)], hints


def test_the_agents_public_face_is_typed_with_what_it_reads():
    from roundtrip import Agent, FleetSettings
    from roundtrip._kernel.settings import ModelSettings

    assert typing.get_type_hints(Agent.model_for)["settings"] is ModelSettings
    assert typing.get_type_hints(Agent.open_dependencies)["fleet_settings"] is FleetSettings
    factory = typing.get_args(typing.get_type_hints(Agent)["dependencies"])[1]
    assert typing.get_args(factory)[0] == [FleetSettings, typing.Any]
    assert {"state_dir", "listen_host", "tool_timeout_s"} <= set(dir(FleetSettings))


def _modules() -> list[str]:
    """Every module the package installs: services/ as `roundtrip`, schemas/ as `roundtrip.schemas`."""
    found = []
    for folder, package in ((ROOT / "services", "roundtrip"), (ROOT / "schemas", "roundtrip.schemas")):
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_every_other_module_is_private():
    modules = _modules()
    assert set(modules) >= PUBLIC_MODULES and len(modules) > 100
    public = sorted(
        m for m in modules if m not in PUBLIC_MODULES and not any(p.startswith("_") for p in m.split(".")[1:])
    )
    assert public == [], f"modules that look public but are not the public API (prefix a component with _): {public}"
