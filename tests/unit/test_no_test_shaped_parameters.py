"""No optional parameter in services/ exists only for tests (docs/decisions/service-shell.md, issue 53).

Every parameter of a function or method in services/ that has a default, or is typed `X | None`, is checked against
the calls in services/ (tests' calls don't count):
- a default must be passed explicitly by some call (a production caller wants another value), else every
  production caller takes the default and the parameter is there for tests;
- and a default must be left out by some call: when every production caller passes the parameter, the default is
  what only tests take (the test then passes the value, from one helper where many tests share it);
- an `X | None` must get None from some call: a literal None, the parameter left out when its default is None, or
  an argument that may be None (a name, an attribute, a function's result: mypy follows those; this test does not).
A caller is found by the callee's name (a class's for `__init__`) and the parameter's keyword or position; a call with
`*args`/`**kwargs` counts as passing anything. A command's options (typer's) are set by the person typing them and
are not checked. What remains is listed below with the production use that keeps it; none is there for tests alone
(a reason starting `DEBT:` fails)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.syntax import parse

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"

Call = tuple[dict[str, ast.expr], list[ast.expr], bool]
Parameter = tuple[str, str, str, int | None, ast.expr | None, bool]

PUBLIC = "the public API (roundtrip.testing): an agent author's test leaves it out or passes it"
DECORATOR = "`@tool` and `@tool(name=..., description=...)`: an agent author writes either (the public SDK)"
ENTRY = "an entry point: `python -m` calls main() and None reads sys.argv"
OTEL = "OpenTelemetry's SpanProcessor interface: the SDK calls it with its own arguments"
TOKEN = "aiokafka builds it from the import string in the settings, with no argument: None reads the environment"
SUBCLASSED = "raised as its subclasses too, by their own names: ShopUnavailable (unreachable, timed out) has no status"
FACTORY = "`field(default_factory=Dependencies)` (ToolContext, the gate) builds it empty: a call this test misses"
AUTHORED = "the public SDK: `Agent(tools=[SchemaFolder(path)], handlers=...)` binds the folder by the agent's handlers"
ALLOWED = {
    "services/_broker/embedded.py:main:argv": ENTRY,
    "services/_broker/unsecured_token.py:UnsecuredTokenProvider:lifetime_s": TOKEN,
    "services/_broker/unsecured_token.py:UnsecuredTokenProvider:subject": TOKEN,
    "services/_kernel/observability/telemetry.py:force_flush:timeout_millis": OTEL,
    "services/_kernel/observability/telemetry.py:on_start:parent_context": OTEL,
    "services/_sdk/context.py:Dependencies:clients": FACTORY,
    "services/_sdk/functions.py:tool:description": DECORATOR,
    "services/_sdk/functions.py:tool:fn": DECORATOR,
    "services/_sdk/functions.py:tool:name": DECORATOR,
    "services/_sdk/sources.py:SchemaFolder:handlers": AUTHORED,
    "services/_shop/agent/client.py:ShopError:status_code": SUBCLASSED,
    "services/_shop/app.py:main:argv": ENTRY,
    "services/_simulator/__main__.py:main:argv": ENTRY,
    "services/testing/__init__.py:arun_turn:approve": PUBLIC,
    "services/testing/__init__.py:arun_turn:deps": PUBLIC,
    "services/testing/__init__.py:arun_turn:persona": PUBLIC,
    "services/testing/__init__.py:arun_turn:state_dir": PUBLIC,
    "services/testing/__init__.py:reply:stop_reason": PUBLIC,
    "services/testing/__init__.py:run_turn:approve": PUBLIC,
    "services/testing/__init__.py:run_turn:deps": PUBLIC,
    "services/testing/__init__.py:run_turn:persona": PUBLIC,
    "services/testing/__init__.py:run_turn:state_dir": PUBLIC,
}

# Expressions that are never None: a literal, a class built, arithmetic, a comparison, a container, a lambda.
_NEVER_NONE = (
    ast.JoinedStr,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.List,
    ast.Tuple,
    ast.Dict,
    ast.Set,
    ast.Lambda,
    ast.ListComp,
    ast.DictComp,
    ast.SetComp,
    ast.GeneratorExp,
)


_RUNNERS = ("to_thread", "run_in_executor")


def _may_be_none(value: ast.expr) -> bool:
    if isinstance(value, ast.Constant):
        return value.value is None
    if isinstance(value, _NEVER_NONE):
        return False
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return not name[:1].isupper()
    return True


def _name(func: ast.expr) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _is_command_registration(func: ast.expr) -> bool:
    return isinstance(func, ast.Call) and _name(func.func) in ("command", "callback")


def _walk() -> tuple[dict[str, list[Call]], list[Parameter], set[str]]:
    calls: dict[str, list[Call]] = defaultdict(list)
    parameters: list[Parameter] = []
    commands: set[str] = set()
    for path in sorted(SERVICES.rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        tree = parse(path.read_text(), relative)
        for owner in ast.walk(tree):
            if isinstance(owner, ast.ClassDef):  # `cls(...)` in a classmethod builds the class
                for call in ast.walk(owner):
                    if isinstance(call, ast.Call) and _name(call.func) == "cls":
                        calls[owner.name].append(({k.arg: k.value for k in call.keywords if k.arg}, call.args, False))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) in _RUNNERS and node.args:  # to_thread(f, *args)
                head, *rest = node.args[_name(node.func) == "run_in_executor" :]
                calls[_name(head)].append(({k.arg: k.value for k in node.keywords if k.arg}, rest, False))
            if isinstance(node, ast.Call):
                if _is_command_registration(node.func) or _name(node.func).endswith("Validator"):
                    commands.update(_name(a) for a in node.args)
                spread = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
                calls[_name(node.func)].append(({k.arg: k.value for k in node.keywords if k.arg}, node.args, spread))
            if isinstance(node, ast.ClassDef | ast.Module):
                for child in node.body:
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                        if any(_is_command_registration(d) for d in child.decorator_list):
                            commands.add(child.name)
                        if not _called_by_a_library(child):
                            parameters += _optional(relative, child, node)
    return calls, parameters, commands


def _called_by_a_library(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Python's protocols (`__exit__`) and pydantic's validators: their caller passes every parameter."""
    dunder = function.name.startswith("__") and function.name != "__init__"
    return dunder or any("validator" in ast.unparse(d) for d in function.decorator_list)


def _optional(
    relative: str, function: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | ast.Module
) -> list[Parameter]:
    method = isinstance(owner, ast.ClassDef)
    name = owner.name if isinstance(owner, ast.ClassDef) and function.name == "__init__" else function.name
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    shift = 1 if method and not static else 0
    args = function.args
    positional = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    found: list[Parameter] = []
    for i, (a, d) in enumerate(zip(positional, defaults, strict=True)):
        found.append((relative, name, a.arg, i - shift, d, _optional_type(a.annotation)))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        found.append((relative, name, a.arg, None, d, _optional_type(a.annotation)))
    return [f for f in found if f[4] is not None or f[5]]


def _optional_type(annotation: ast.expr | None) -> bool:
    """`X | None` or `Optional[X]`, also inside `Annotated[...]`; `Callable[[], None]` is not."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if isinstance(annotation, ast.Subscript) and _name(annotation.value) in ("Annotated", "Optional"):
        if _name(annotation.value) == "Optional":
            return True
        inner = annotation.slice
        return _optional_type(inner.elts[0] if isinstance(inner, ast.Tuple) else inner)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return any(_optional_type(side) for side in (annotation.left, annotation.right))
    return isinstance(annotation, ast.Constant) and annotation.value is None


def _passed(call: Call, parameter: str, index: int | None) -> ast.expr | None:
    keywords, positional, _ = call
    if parameter in keywords:
        return keywords[parameter]
    if index is not None and index >= 0 and len(positional) > index:
        return positional[index]
    return None


def _test_shaped() -> list[str]:
    calls, parameters, commands = _walk()
    found = []
    for relative, name, parameter, index, default, optional in parameters:
        if name in commands or (default is not None and "typer." in ast.unparse(default)):
            continue
        callers = calls.get(name, [])
        spread = any(c[2] for c in callers)
        passed = [_passed(c, parameter, index) for c in callers]
        explicit = [p for p in passed if p is not None]
        why = []
        none_default = isinstance(default, ast.Constant) and default.value is None
        left_out = len(explicit) < len(passed)
        if default is not None and not explicit and not spread:
            why.append("default")
        elif default is not None and explicit and not (spread or left_out):
            why.append("overridden")  # every production caller passes it: the default is only tests'
        if optional and not (spread or any(map(_may_be_none, explicit)) or (none_default and left_out)):
            why.append("none")
        if why:
            found.append(f"{relative}:{name}:{parameter}")
    return found


def test_every_optional_parameter_has_a_production_caller_that_uses_it_or_says_why_it_stays():
    found = _test_shaped()
    assert not (unlisted := sorted(set(found) - set(ALLOWED))), (
        "optional parameters no production call uses (make them required, or list them in ALLOWED with why they "
        "stay):\n  " + "\n  ".join(unlisted)
    )
    assert not (stale := sorted(set(ALLOWED) - set(found))), f"ALLOWED lists parameters a caller uses now: {stale}"


def test_no_parameter_is_left_only_for_tests():
    assert not (debt := sorted(k for k, why in ALLOWED.items() if why.startswith("DEBT"))), debt
