"""Where a service's CPU goes, by kind of work: each py-spy sample (raw, collapsed stacks from bench_loop --py-spy) goes
to the first kind below that any frame of its stack belongs to, so a span exported through pydantic counts as spans and
a statement's parameters encoded by SQLAlchemy count as ledger statements.

    .venv/bin/python -m tests.benchmarks.attribution DIR   # the folder bench_loop --py-spy wrote
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

KINDS: list[tuple[str, tuple[str, ...]]] = [
    ("spans and metrics", ("opentelemetry", "/observability/")),
    ("ledger statements", ("sqlalchemy", "aiosqlite", "sqlite3", "asyncpg", "/storage/")),
    ("schema validation", ("jsonschema", "referencing")),
    ("decode (JSON -> event)", ("model_validate", "validate_json", "validate_python", "json/decoder", "loads (json")),
    ("encode (event -> JSON)", ("model_dump", "dump_json", "dump_python", "json/encoder", "dumps (json")),
    ("Kafka publish", ("aiokafka/producer", "aiokafka/record")),
    ("Kafka consumer and client", ("aiokafka",)),
    ("HTTP client (model API, shop)", ("anthropic", "aiohttp", "httpx", "yarl", "multidict")),
    ("garbage collector", ("<gc>", "gc_collect")),
]
LOOP = ("asyncio/", "selectors", "uvloop", "<frozen runpy>")  # on every stack: the event loop only as the innermost
OWN = "the rest (handlers, kernel, stdlib)"


def kind_of(frames: list[str]) -> str:
    for kind, marks in KINDS:
        if any(mark in frame for frame in frames for mark in marks):
            return kind
    if frames and any(mark in frames[-1] for mark in LOOP):
        return "event loop (its own work: ready callbacks, selectors, timers)"
    return OWN


def attribute(path: Path) -> tuple[int, Counter]:
    counts: Counter = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        counts[kind_of(stack.split(";"))] += int(n)
    return total, counts


def table(folder: Path) -> str:
    rows = []
    for path in sorted(folder.glob("*.txt")):
        total, counts = attribute(path)
        if not total:
            continue
        shares = ", ".join(f"{kind} {100 * n / total:.0f} %" for kind, n in counts.most_common())
        rows.append(f"{path.stem:<11} {total:>6} samples: {shares}")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
