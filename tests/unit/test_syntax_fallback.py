"""tests/syntax.py: a file the in-process parser refuses with CPython 3.11's SystemError is parsed in a fresh
interpreter, to the same tree."""

from __future__ import annotations

import ast

from tests import syntax

SOURCE = "def f(x):\n    return [y for y in x if y]\n\n\nclass C:\n    a: int = 1\n"


def test_a_refused_parse_is_done_again_in_a_fresh_interpreter(monkeypatch):
    expected = ast.dump(ast.parse(SOURCE), include_attributes=True)

    def refused(source: str, filename: str = "<unknown>") -> ast.Module:
        raise SystemError("AST constructor recursion depth mismatch (before=123, after=177)")

    monkeypatch.setattr(syntax.ast, "parse", refused)
    tree = syntax.parse(SOURCE, "m.py")
    assert ast.dump(tree, include_attributes=True) == expected
