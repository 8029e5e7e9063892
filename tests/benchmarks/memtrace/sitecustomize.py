"""Loaded by a service process only when the soak's `--trace-memory` puts this folder first on PYTHONPATH.

Every ROUNDTRIP_MEMTRACE_S seconds it writes to ROUNDTRIP_MEMTRACE_DIR the count of live objects per type (what
the garbage collector tracks: the containers that hold memory) and, with ROUNDTRIP_MEMTRACE_FRAMES set, a
tracemalloc snapshot (slow, and its own copies inflate the RSS); `python -m tests.benchmarks.memtrace DIR` compares
them: what a process holds more of as the run goes on."""

import os

FREED = "(objects the collection before this sample freed)"  # in each sample's counts; the reader shows it apart
HOLDER_LEVELS = 6  # how far up the holders sample follows what refers to an object

if _dir := os.environ.get("ROUNDTRIP_MEMTRACE_DIR"):
    import collections
    import gc
    import json
    import sys
    import threading
    import time
    import tracemalloc

    _frames = int(os.environ.get("ROUNDTRIP_MEMTRACE_FRAMES", "0"))
    if _frames:
        tracemalloc.start(_frames)

    def _name(kind: type) -> str:
        """module.qualname of a type (a few types' __module__ is a descriptor, not a string)."""
        return f"{type.__dict__['__module__'].__get__(kind)}.{kind.__qualname__}"

    def _sql(element: object) -> str:
        try:
            return " ".join(str(element).split())[:300]
        except Exception as exc:  # noqa: BLE001 - a fragment that cannot compile alone
            return f"(no SQL: {type(exc).__name__})"

    def _statements(stem: str) -> None:
        """The SQL in each SQLAlchemy cache (compiled statements, asyncpg's prepared ones): new SQL grows it."""
        lru = getattr(sys.modules.get("sqlalchemy.util._collections"), "LRUCache", None)
        if lru is None:
            return
        held = []
        for cache in [o for o in gc.get_objects() if isinstance(o, lru)]:
            for _ in range(3):  # the service's thread may change it meanwhile
                try:
                    held.append(
                        [k if isinstance(k, str) else getattr(v, "string", "?") for k, v in list(cache.items())]
                    )
                    break
                except RuntimeError:
                    continue
        with open(stem + ".sql.json", "w") as out:
            json.dump(held, out)

    def _holders(stem: str) -> None:
        """For a few objects of ROUNDTRIP_MEMTRACE_HOLDERS (a type's name): what refers to them, HOLDER_LEVELS levels
        up; a SQLAlchemy element is shown with its SQL."""
        name = os.environ.get("ROUNDTRIP_MEMTRACE_HOLDERS")
        if not name:
            return
        found = [o for o in gc.get_objects() if type(o).__qualname__ == name][-3:]
        lines: list[str] = []
        mine = {id(found)}  # the lists this sampler makes refer to the objects too: not holders

        def up(obj: object, depth: int) -> None:
            refs = gc.get_referrers(obj)
            mine.add(id(refs))
            shown = 0
            for ref in refs:
                if id(ref) in mine or type(ref).__name__ == "frame":
                    continue
                label = _name(type(ref))
                if isinstance(ref, dict):
                    label += " keys " + repr(list(ref)[:6])[:200]
                elif label.startswith("sqlalchemy.sql."):
                    label += " " + _sql(ref)
                lines.append("  " * depth + label)
                if depth < HOLDER_LEVELS:
                    up(ref, depth + 1)
                shown += 1
                if shown == (6 if depth == 1 else 2):  # deeper, the first few: the chain, not the tree
                    break

        for obj in found:
            lines.append(repr(obj)[:200] + " " + _sql(obj))
            up(obj, 1)
        with open(stem + ".holders.txt", "w") as out:
            out.write("\n".join(lines))

    def _dump(folder: str, every: float, name: str) -> None:
        n = 0
        while True:
            time.sleep(every)  # the interval between two memory snapshots
            n += 1
            stem = os.path.join(folder, f"{name}.{os.getpid()}-{n:04d}")
            # the collector first: what is left is reachable (a cycle of SQLAlchemy elements waits for the next full
            # collection otherwise and looks retained); the count of what it freed is kept beside the counts
            counts = collections.Counter({FREED: gc.collect()})
            counts.update(_name(type(o)) for o in gc.get_objects())
            with open(stem + ".types.json", "w") as out:
                json.dump(counts, out)
            _statements(stem)
            _holders(stem)
            if _frames:
                tracemalloc.take_snapshot().dump(stem + ".snap")

    _args = (_dir, float(os.environ.get("ROUNDTRIP_MEMTRACE_S", "60")), os.environ.get("ROUNDTRIP_MEMTRACE_NAME", ""))
    threading.Thread(target=_dump, args=_args, daemon=True).start()
