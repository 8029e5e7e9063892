"""The rooms of services/ and which way their imports go (read from the code with `ast`, nothing imported).

A room is a top-level folder of services/ (installed as `roundtrip`): `_kernel`, `_sdk`, the five services, `_broker`,
`_simulator`, `_shop`, `_fleet`, `_cli`, the public `testing`, and the root `roundtrip` (services/__init__.py).
`roundtrip.schemas` (the folder schemas/) is data every room may read: it imports nothing of the package. Each room
imports only the rooms ALLOWED names for it, so no import climbs upward and the rooms form no cycle; inside `_kernel`
the sub-rooms (KERNEL_ROOMS) form no cycle either. Each failure lists every offending import as file:line.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.syntax import parse

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
FIVE = {"_gateway", "_model", "_guard", "_gate", "_executor"}
BELOW_THE_FLEET = {"_kernel", "_sdk", *FIVE, "_console", "_broker", "_simulator", "_shop", "roundtrip", "testing"}
ALLOWED = {  # room -> the rooms it may import (besides itself and roundtrip.schemas)
    "_kernel": set(),
    "_sdk": {"_kernel"},
    **{service: {"_kernel", "_sdk"} for service in FIVE},  # never another service
    # the console reads the ledger through the kernel's read port (storage/ledger_reads.py) as the CLI does, never
    # the guard; the CLI decides with the console's desk: one check and one signed decision for both
    "_console": {"_kernel", "_sdk"},
    "_broker": {"_kernel"},
    "_simulator": {"_kernel"},
    "_shop": {"_kernel", "_sdk", "roundtrip"},  # the demo agent is written as any author's: with the public API
    "roundtrip": {"_sdk"},
    "testing": {"_kernel", "_sdk", *FIVE},
    "_fleet": BELOW_THE_FLEET,
    "_cli": BELOW_THE_FLEET | {"_fleet"},
    "__main__": {"_cli"},  # `python -m roundtrip` (services/__main__.py): the command line
}
KERNEL_ROOMS = {
    "kafka",
    "wire",
    "storage",
    "observability",
    "settings",
    "migrations",
    "database",
    "runtime",
    "shell",
    "clock",
}


def _module(path: Path) -> str:
    parts = ["roundtrip", *path.relative_to(SERVICES).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> list[tuple[str, str, str]]:
    """(importing module, imported module, 'file:line') for each import of roundtrip.* in services/ (relative too)."""
    found = []
    for path in sorted(SERVICES.rglob("*.py")):
        module = _module(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                targets = [".".join([*base, *([node.module] if node.module else [])])]
            elif isinstance(node, ast.ImportFrom):
                targets = [node.module or ""]
            else:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            found += [(module, t, where) for t in targets if t == "roundtrip" or t.startswith("roundtrip.")]
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    return "schemas" if parts[1:2] == ["schemas"] else parts[1] if len(parts) > 1 else "roundtrip"


def _kernel_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "_kernel" else None


def test_every_room_is_declared():
    rooms = {path.name for path in SERVICES.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert rooms | {"roundtrip", "__main__"} == set(ALLOWED), (
        f"rooms without a rule (or rules without a room): {rooms ^ set(ALLOWED)}"
    )
    kernel = {
        p.stem if p.is_file() else p.name
        for p in (SERVICES / "_kernel").iterdir()
        if (p.is_file() and p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()
    }
    assert kernel == KERNEL_ROOMS, f"the kernel's sub-rooms changed: {sorted(kernel ^ KERNEL_ROOMS)}"


def test_no_import_climbs_upward_or_crosses_to_another_service():
    offending = [
        f"{where} {module} imports {target} ({_room(target)} is not in what {_room(module)} may import)"
        for module, target, where in _imports()
        if _room(target) not in ALLOWED[_room(module)] | {_room(module), "schemas"}
    ]
    assert offending == [], "\n".join(offending)


SHELLS = {f"roundtrip.{service}.app" for service in FIVE}  # what subscribes a service and owns its lifecycle


def test_the_in_process_harness_builds_the_services_cores_never_imports_their_shells():
    """roundtrip.testing runs a turn through the services' own logic (the model handler, the guard's rules, the gate,
    the runner), built as the services build them, without their subscriptions, brokers or lifecycles."""
    shells = [
        f"{where} {module} imports {target}"
        for module, target, where in _imports()
        if _room(module) == "testing" and (target in SHELLS or target.rsplit(".", 1)[0] in SHELLS)
    ]
    assert shells == [], "\n".join(shells)


def test_the_schemas_package_is_data_that_imports_nothing_of_the_package():
    for path in sorted((ROOT / "schemas").rglob("*.py")):
        tree = parse(path.read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], path


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle through the graph's strongly connected parts, each once, from its smallest node."""
    cycles: set[tuple[str, ...]] = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                cycles.add(tuple(path))
            elif nxt > start and nxt not in path:
                walk(start, nxt, [*path, nxt])

    for start in sorted(edges):
        walk(start, start, [start])
    return [list(c) for c in sorted(cycles)]


def _kernel_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    edges: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, target, line in _imports():
        a, b = _kernel_room(module), _kernel_room(target)
        if a and b and a != b:
            edges[a].add(b)
            where[(a, b)].append(f"{line} {module} imports {target}")
    return edges, where


def test_the_cycle_finder_finds_cycles_and_only_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b", "c"}, "b": {"c"}}) == []


def test_the_rooms_rules_themselves_form_no_cycle():
    assert _cycles({room: set(allowed) for room, allowed in ALLOWED.items()}) == []


def test_the_kernels_sub_rooms_form_no_cycle():
    """kafka/ reads observability/ (metrics, spans, health checks) and never the reverse: health is handed the seam's
    liveness and FastStream's metrics sit in kafka/faststream_metrics.py; storage/ and migrations/ both stand on
    database.py."""
    edges, where = _kernel_graph()
    said = [
        f"cycle {' -> '.join([*c, c[0]])}:\n  "
        + "\n  ".join(line for a, b in zip(c, [*c[1:], c[0]], strict=True) for line in where[(a, b)])
        for c in _cycles(edges)
    ]
    assert said == [], "\n".join(said)
