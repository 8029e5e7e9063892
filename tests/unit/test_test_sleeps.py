"""Every sleep in the tests says what its window stands for.

A fixed sleep in a test is either a wait for an event (better replaced by waiting on the event: the FleetClient's
`wait_for` or `settled`, a committed offset, a row), a poll interval, or the window in which something that must not
happen would have happened. A reader cannot tell which, or judge whether the window is long enough, unless the line
says so: each `sleep(` call (time.sleep, asyncio.sleep) needs a comment on its line or on the line above."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from tests.syntax import parse

TESTS = Path(__file__).resolve().parents[1]
MIN_WORDS = 3  # "# poll interval" alone says nothing of what is polled


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """Line number -> the text of the comment on it; and the lines that hold a comment only."""
    found: dict[int, str] = {}
    alone: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
            if not token.line[: token.start[1]].strip():
                alone.add(token.start[0])
    return found, alone


def _sleeps(tree: ast.AST) -> list[ast.Call]:
    def is_sleep(func: ast.expr) -> bool:
        return (isinstance(func, ast.Attribute) and func.attr == "sleep") or (
            isinstance(func, ast.Name) and func.id == "sleep"
        )

    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and is_sleep(node.func)]


def _explained(call: ast.Call, comments: dict[int, str], alone: set[int]) -> bool:
    """A comment on a line of the call, or on a line of its own just above it (the comment of the code above is not
    this sleep's)."""
    lines = [n for n in range(call.lineno - 1, (call.end_lineno or call.lineno) + 1) if n >= call.lineno or n in alone]
    return any(len(comments.get(n, "").split()) >= MIN_WORDS for n in lines)


def unexplained_sleeps(root: Path = TESTS) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        comments, alone = _comments(source)
        for call in _sleeps(parse(source, str(path))):
            if not _explained(call, comments, alone):
                found.append(f"{path.relative_to(root.parent)}:{call.lineno}")
    return found


def test_every_sleep_in_the_tests_says_what_its_window_stands_for():
    missing = unexplained_sleeps()
    assert not missing, (
        "a sleep with no comment naming what its window stands for (wait on the event instead, or say what the "
        "window is: a poll interval of what, the time in which what would have happened): " + ", ".join(missing)
    )


def test_the_check_finds_a_bare_sleep_and_accepts_an_explained_one(tmp_path):
    (tmp_path / "bare.py").write_text("import asyncio\n\nasync def f():\n    await asyncio.sleep(2)\n")
    (tmp_path / "terse.py").write_text("import time\n\ntime.sleep(1)  # wait\n")
    (tmp_path / "above.py").write_text("import time\n\n# the window a second reply would have come in\ntime.sleep(1)\n")
    (tmp_path / "others.py").write_text("import time\n\nx = 1  # the comment of another line\ntime.sleep(1)\n")
    (tmp_path / "inline.py").write_text("from time import sleep\n\nsleep(0.1)  # poll interval: the log written\n")
    (tmp_path / "split.py").write_text(
        "import asyncio\n\nasync def f():\n    await asyncio.sleep(\n        2  # a batch would run then\n    )\n"
    )
    assert unexplained_sleeps(tmp_path) == [
        f"{tmp_path.name}/bare.py:4",
        f"{tmp_path.name}/others.py:4",
        f"{tmp_path.name}/terse.py:3",
    ]
