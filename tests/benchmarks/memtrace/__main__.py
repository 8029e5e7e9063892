"""What a traced process holds more of as the run goes on (see sitecustomize.py here for what is written).

    .venv/bin/python -m tests.benchmarks.memtrace DIR [--from N] [--top 15]

For each process in DIR: the live objects of the types that grew most from sample N (default: the second) to the
last, and, where tracemalloc snapshots were taken, the traced total per sample and the tracebacks that grew most."""

import argparse
import json
import tracemalloc
from collections import Counter, defaultdict
from pathlib import Path

from tests.benchmarks.memtrace.sitecustomize import FREED


def _types(paths: list[Path], start: int, top: int) -> None:
    counts = [json.loads(p.read_text()) for p in paths]
    freed = [c.pop(FREED, 0) for c in counts]  # not a type: what the sampler's collection freed before it counted
    print("  live objects per sample: " + " ".join(str(sum(c.values())) for c in counts))
    print("  garbage freed before each sample: " + " ".join(map(str, freed)))
    if len(counts) <= start:
        return
    old, new = counts[start - 1], counts[-1]
    grew = sorted(new, key=lambda t: new[t] - old.get(t, 0), reverse=True)[:top]
    for name in grew:
        print(f"  {new[name] - old.get(name, 0):+8d} {name} (" + " ".join(str(c.get(name, 0)) for c in counts) + ")")


def _sql(paths: list[Path], start: int, top: int) -> None:
    caches = [json.loads(p.read_text()) for p in paths]
    print("  SQLAlchemy compiled statements per sample: " + " ".join(str(sum(map(len, c))) for c in caches))
    if len(caches) <= start:
        return
    old = Counter(s for cache in caches[start - 1] for s in cache)
    new = Counter(s for cache in caches[-1] for s in cache)
    for statement, n in (new - old).most_common(top):
        print(f"  {n:+6d} " + " ".join(statement.split())[:300])


def _snapshots(paths: list[Path], start: int, top: int) -> None:
    totals = [sum(s.size for s in tracemalloc.Snapshot.load(str(p)).statistics("filename")) for p in paths]
    print("  traced MB per sample: " + " ".join(f"{t / 1e6:.1f}" for t in totals))
    if len(paths) <= start:
        return
    old, new = (tracemalloc.Snapshot.load(str(p)) for p in (paths[start - 1], paths[-1]))
    for stat in new.compare_to(old, "traceback")[:top]:
        print(f"  {stat.size_diff / 1e3:+9.1f} kB {stat.count_diff:+7d} blocks")
        for line in stat.traceback.format()[-12:]:
            print("      " + line)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.memtrace")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--from", dest="start", type=int, default=2, help="the sample compared from (default 2)")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    types: dict[str, list[Path]] = defaultdict(list)
    sql: dict[str, list[Path]] = defaultdict(list)
    snaps: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(args.folder.iterdir()):
        process, kind = path.name.split("-")[0], path.name.split(".", 2)[-1]
        {"types.json": types, "sql.json": sql, "snap": snaps}.get(kind, {}).setdefault(process, []).append(path)
    for process in sorted({*types, *snaps}):
        print(process)
        if types[process]:
            _types(types[process], args.start, args.top)
        if sql[process]:
            _sql(sql[process], args.start, args.top)
        if snaps[process]:
            _snapshots(snaps[process], args.start, args.top)


if __name__ == "__main__":
    main()
