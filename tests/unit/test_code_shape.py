"""The shape of services/: short functions, short classes, and a long module only with a reason in the manual's Layout.

A function of more than FUNCTION_LINES lines (from its `def` to its last line, decorators not
counted) does more than one thing or hides its steps; a class of more than CLASS_LINES lines is
several objects; a module of more than MODULE_LINES lines is named in the Layout (docs/architecture.md)
section, with the reason it is one idea, and none is longer than MAX_MODULE_LINES (but those OVER_THE_MAXIMUM
lists). Each failure lists every offender as file:line and its length, longest first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.syntax import parse

ROOT = Path(__file__).resolve().parents[2]
FUNCTION_LINES, CLASS_LINES, MODULE_LINES = 60, 300, 400
MAX_MODULE_LINES = 500  # no module longer, reason or not
OVER_THE_MAXIMUM: set[str] = set()  # modules still longer: none


def _modules() -> list[Path]:
    return sorted((ROOT / "services").rglob("*.py"))


def _longer_than(kinds: tuple[type, ...], limit: int) -> list[tuple[int, str]]:
    """(length, 'file:line name (length lines)') of every definition of these kinds over the limit, longest first."""
    found = []
    for path in _modules():
        for node in ast.walk(parse(path.read_text(), str(path))):
            if isinstance(node, kinds) and (length := node.end_lineno - node.lineno + 1) > limit:
                found.append((length, f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)"))
    return sorted(found, reverse=True)


def _layout() -> str:
    """The Layout section of the manual's architecture page (docs/architecture.md), from its heading to the next one."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    start = page.index("\n## Layout\n")
    end = page.find("\n## ", start + 1)
    return page[start : end if end != -1 else None]


def test_no_function_of_services_is_longer_than_a_screen():
    offenders = [line for _, line in _longer_than((ast.FunctionDef, ast.AsyncFunctionDef), FUNCTION_LINES)]
    assert not offenders, f"functions over {FUNCTION_LINES} lines (split them):\n  " + "\n  ".join(offenders)


def test_no_class_of_services_is_longer_than_300_lines():
    offenders = [line for _, line in _longer_than((ast.ClassDef,), CLASS_LINES)]
    assert not offenders, f"classes over {CLASS_LINES} lines (split them):\n  " + "\n  ".join(offenders)


def test_every_long_module_is_named_in_the_readme_layout_with_its_reason():
    layout = _layout()
    long_modules = sorted(
        ((n, p) for p in _modules() if (n := len(p.read_text().splitlines())) > MODULE_LINES), reverse=True
    )
    unnamed = [
        f"{p.relative_to(ROOT)} ({n} lines)" for n, p in long_modules if f"`{p.relative_to(ROOT)}`" not in layout
    ]
    assert not unnamed, (
        f"modules over {MODULE_LINES} lines that the Layout (docs/architecture.md) does not name with the reason they "
        "are one idea (split them, or name them there):\n  " + "\n  ".join(unnamed)
    )
    named = [line for line in layout.splitlines() if "`services/" in line and line.lstrip().startswith("- ")]
    for _lines, path in long_modules:
        (line,) = [line for line in named if f"`{path.relative_to(ROOT)}`" in line]
        assert len(line.split(":", 1)[-1].split()) >= 4, (
            f"the Layout names {path.relative_to(ROOT)} without a reason: {line!r}"
        )


def test_no_module_of_services_is_longer_than_500_lines():
    over = {
        str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    unlisted = [f"{path} ({n} lines)" for path, n in sorted(over.items()) if path not in OVER_THE_MAXIMUM]
    assert not unlisted, f"modules over {MAX_MODULE_LINES} lines (split them):\n  " + "\n  ".join(unlisted)
    assert not (done := OVER_THE_MAXIMUM - set(over)), f"no longer over {MAX_MODULE_LINES} lines, unlist: {done}"


def test_the_readme_names_no_long_module_that_is_no_longer_long():
    """The list stays true: a module named as long that has been split is taken off it."""
    layout = _layout()
    named = {line.split("`")[1] for line in layout.splitlines() if line.lstrip().startswith("- `services/")}
    short = [
        name
        for name in named
        if not (ROOT / name).exists() or len((ROOT / name).read_text().splitlines()) <= MODULE_LINES
    ]
    assert not short, (
        f"the Layout (docs/architecture.md) names as over {MODULE_LINES} lines modules that are not: "
        f"{', '.join(sorted(short))}"
    )


def _layout_tree() -> str:
    """The tree drawn in the Layout (docs/architecture.md) section (its code block that starts at services/)."""
    return next(block for block in _layout().split("```")[1::2] if block.lstrip("\n").startswith("services/"))


def test_services_has_no_loose_module_but_the_public_front_door():
    """The top of services/ (the package `roundtrip`) shows rooms: a module there is `__init__.py`, the public API, or
    `__main__.py`, `python -m roundtrip`."""
    loose = sorted(p.name for p in (ROOT / "services").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"loose modules at the top of services/ (put each in its room): {', '.join(loose)}"


def test_every_room_of_services_and_of_the_kernel_is_drawn_in_the_readme_layout():
    tree = _layout_tree()
    rooms = [p for p in (ROOT / "services").iterdir() if (p / "__init__.py").is_file()]
    rooms += [
        p for p in (ROOT / "services" / "_kernel").iterdir() if (p / "__init__.py").is_file() or p.suffix == ".py"
    ]
    missing = sorted(
        str(p.relative_to(ROOT))
        for p in rooms
        if p.name != "__init__.py" and not re.search(rf"^\s+{re.escape(p.name)}/?\s", tree, re.M)
    )
    assert not missing, f"rooms the Layout (docs/architecture.md) does not draw: {', '.join(missing)}"
