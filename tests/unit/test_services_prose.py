"""Production code knows no test: no module under services/ talks of the test suite, the benchmarks or issue numbers,
nor branches on a client's type to reach a test double.

The prose of a module (its comments and its string literals, docstrings included) says why the code is as it is
today; how a design came about, and the figures behind it, are in docs/decisions/ and docs/benchmarks.md. Names in
the code itself (an `isinstance`, a keyword such as JUnit's `tests=`) are not prose; the branches are found in the
syntax tree instead.
"""

from __future__ import annotations

import ast
import builtins
import io
import re
import tokenize
from pathlib import Path

from tests.syntax import parse

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"

# what production prose must not say, and why; case-insensitive, matched in comments and string literals
TALK = {
    "test": (r"\btests?\b", "production code that speaks of tests is shaped for them"),
    "pytest": (r"\bpytest\b", "the test runner"),
    "suite path": (r"\btests/", "a path into the test suite"),
    "benchmark": (
        r"\bbench(?:mark(?:s|ed|ing)?)?\b|\bbench_\w+",
        "figures: docs/benchmarks.md; reasons: docs/decisions/",
    ),
    "issue number": (r"\bissues?\s+#?\d+|(?<![\w&#/])#\d{1,2}\b", "history: docs/decisions/"),
    "round": (r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) round\b", "history"),
}

# where talk of tests is the subject itself: the harness an agent's own tests run on, and the commands that write a
# new agent's project (its tests and their runner are files of it). Benchmarks and issue numbers are nowhere allowed.
SUBJECT_IS_TESTS = ("services/testing/", "services/_cli/skeleton.py", "services/_cli/agent.py")
ALLOWED_THERE = {"test", "pytest", "suite path"}

# names a test double's class takes
DOUBLE = re.compile(r"Scripted|Fake|Stub|Mock|Dummy|Double|FunctionModel")


def _modules() -> list[Path]:
    return sorted(SERVICES.rglob("*.py"))


def _prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and string literal (docstrings and f-strings' text included)."""
    kinds = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)}
    return [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type in kinds
    ]


def talk_in(relative: str, source: str) -> list[str]:
    """'file:line: what (the words)' for each forbidden phrase of this module's prose."""
    allowed = ALLOWED_THERE if relative.startswith(SUBJECT_IS_TESTS) else set()
    found = []
    for line, text in _prose(source):
        for what, (pattern, _) in TALK.items():
            if what not in allowed and (match := re.search(pattern, text, re.I)):
                found.append(f"{relative}:{line + text[: match.start()].count(chr(10))}: {what} ({match.group(0)!r})")
    return found


def _last_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def double_branches(relative: str, source: str) -> set[tuple[str, str]]:
    """(file, enclosing function) of each `isinstance` on a client or model object against a class of our own, and
    of each type check naming a test double's class."""
    found = set()

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else where
            if (
                isinstance(child, ast.Call)
                and _last_name(child.func) in ("isinstance", "issubclass")
                and len(child.args) == 2
            ):
                subject, kinds = child.args
                names = [_last_name(k) for k in (kinds.elts if isinstance(kinds, ast.Tuple) else [kinds])]
                ours = [n for n in names if n and not hasattr(builtins, n)]
                on_a_client = _last_name(child.func) == "isinstance" and re.search(
                    r"(client|model)$", _last_name(subject), re.I
                )
                if (on_a_client and ours) or any(DOUBLE.search(n) for n in names):
                    found.add((relative, where))
            visit(child, inner)

    visit(parse(source, relative), "<module>")
    return found


def test_no_module_of_services_talks_of_tests_benchmarks_or_issues():
    found = [hit for path in _modules() for hit in talk_in(str(path.relative_to(ROOT)), path.read_text())]
    reasons = "; ".join(f"{what}: {why}" for what, (_, why) in TALK.items())
    assert not found, (
        f"say why the code is as it is, not what tests or history it serves ({reasons}):\n  " + "\n  ".join(found)
    )


def test_no_module_of_services_branches_on_a_clients_type_to_reach_a_test_double():
    found = set().union(*(double_branches(str(p.relative_to(ROOT)), p.read_text()) for p in _modules()))
    assert not found, f"branches on a client's type (implement its port instead, services/_model/port.py): {found}"


def test_the_checks_find_what_they_look_for():
    """Each pattern catches a phrase as the code used to carry it, and lets a plain one through."""
    said = {
        "# None: every request stands alone (unit tests of the loop)": "test",
        '"""Endpoints a test steers the simulator with."""': "test",
        "# see tests/unit/test_seams.py": "suite path",
        "# docs/benchmarks.md, the figures": "benchmark",
        "# one round trip (issue 23)": "issue number",
        "# as #42 asked": "issue number",
        "# the eighth round": "round",
        "x = 1  # the rate-limit benchmark's": "benchmark",
    }
    for source, what in said.items():
        assert what in [hit.split(": ", 1)[1].split(" (")[0] for hit in talk_in("services/x.py", source + "\n")], source
    plain = '# one round trip; colour "#333"; roundtrip.testing; the JUnit count\nreport(tests=3)\n'
    assert talk_in("services/x.py", plain) == []
    assert talk_in("services/testing/x.py", "# a test's model\n") == []
    assert talk_in("services/testing/x.py", "# the benchmark's\n") != []

    branch = (
        "def call(client):\n    if isinstance(client, ModelClient):\n        return 1\n    return client.create()\n"
    )
    assert double_branches("services/x.py", branch) == {("services/x.py", "call")}
    assert double_branches("services/x.py", "def f(m):\n    return isinstance(m, ScriptedModel)\n") == {
        ("services/x.py", "f")
    }
    assert double_branches("services/x.py", "def f(model):\n    return isinstance(model, str)\n") == set()
    assert double_branches("services/x.py", "def f(model):\n    return issubclass(model, BaseModel)\n") == set()
