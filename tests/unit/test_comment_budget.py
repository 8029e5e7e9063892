"""The comments of services/ explain the code as it is: docstring and comment lines stay below a tenth of its lines,
and a module's docstring says what the module is for in at most eight lines (the package's, which agent authors read
as its manual's first page, and `roundtrip.testing`'s excepted). How a design came about is in docs/decisions/.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
SHARE = 0.10
MODULE_DOCSTRING_LINES = 8
LONGER_ALLOWED = {"services/__init__.py", "services/testing/__init__.py"}

_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_span(node: ast.AST) -> tuple[int, int] | None:
    """The first and last line of a module's, class's or function's docstring, None without one."""
    body = getattr(node, "body", None)
    if not isinstance(node, _DOCUMENTED) or not body or not isinstance(body[0], ast.Expr):
        return None
    value = body[0].value
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return None
    return body[0].lineno, body[0].end_lineno or body[0].lineno


def prose_lines(source: str) -> set[int]:
    """The lines of a module that hold a comment or a docstring."""
    lines = {
        tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT
    }
    for node in ast.walk(ast.parse(source)):
        if span := docstring_span(node):
            lines.update(range(span[0], span[1] + 1))
    return lines


def _modules() -> list[Path]:
    return sorted(SERVICES.rglob("*.py"))


def test_the_counter_counts_comments_and_docstrings_not_code_or_strings() -> None:
    source = '"""Module.\n\nMore."""\n\nX = "not prose"  # why\n\n\ndef f():\n    """One."""\n    return 1\n'
    assert prose_lines(source) == {1, 2, 3, 5, 9}


def test_comment_and_docstring_lines_stay_below_a_tenth_of_services() -> None:
    total = prose = 0
    for path in _modules():
        source = path.read_text()
        total += len(source.splitlines())
        prose += len(prose_lines(source))
    assert total > 10_000, "services/ was not found whole"
    assert prose / total < SHARE, (
        f"{prose} of {total} lines of services/ are comments or docstrings ({prose / total:.1%})"
    )


def test_module_docstrings_are_short() -> None:
    long = []
    for path in _modules():
        relative = path.relative_to(ROOT).as_posix()
        span = docstring_span(ast.parse(path.read_text()))
        if span and relative not in LONGER_ALLOWED and span[1] - span[0] + 1 > MODULE_DOCSTRING_LINES:
            long.append(f"{relative}: {span[1] - span[0] + 1} lines")
    assert not long, "module docstrings over 8 lines (history belongs in docs/decisions/):\n" + "\n".join(long)
