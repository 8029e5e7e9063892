"""The public API of the package, listed once: `roundtrip.__all__` and `roundtrip.testing.__all__`. A name that
disappears from either fails here; everything else the package holds is visibly private (an underscore-prefixed
component in its module path), and the public modules' docstrings show the imports an agent author writes."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {  # the public API as of issue 28: a name removed from here is a breaking change, said on purpose
    "roundtrip": [
        "Agent",
        "AgentError",
        "BearerToken",
        "ClientCredentials",
        "Dependencies",
        "Entity",
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
        "FunctionModel",
        "ModelInfo",
        "Reply",
        "ScriptExhausted",
        "ScriptedModel",
        "Settings",
        "ToolRun",
        "TurnResult",
        "arun_turn",
        "call",
        "reply",
        "run_turn",
    ],
}
PUBLIC_MODULES = {"roundtrip", "roundtrip.testing", "roundtrip.schemas"}
REQUIRED_IMPORTS = {  # what issue 28 says an agent author writes
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
