"""The embedded broker stops its JVM when Python exits normally, each started broker on its own (a stand-in `java`)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from roundtrip._broker.embedded import EmbeddedKafka, free_port

CHILD = """
import sys
from roundtrip._broker.embedded import EmbeddedKafka, free_port
kept = EmbeddedKafka(sys.argv[1], free_port(), free_port(), libs_dir=sys.argv[1]).start()
stopped = EmbeddedKafka(sys.argv[2], free_port(), free_port(), libs_dir=sys.argv[2]).start()
print(kept.pid, stopped.stop(), flush=True)
"""


@pytest.fixture
def java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `java` that runs as long as a broker would, on storage already formatted."""
    home = tmp_path / "java"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\nexec sleep 120\n")
    (home / "bin" / "java").chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(home))
    return home


def broker_dir(tmp_path: Path, name: str) -> Path:
    (tmp_path / name / "data").mkdir(parents=True)
    (tmp_path / name / "data" / "meta.properties").write_text("formatted\n")
    return tmp_path / name


def test_the_exit_holds_a_broker_only_while_it_runs(tmp_path: Path, java: Path) -> None:
    kafka = EmbeddedKafka(broker_dir(tmp_path, "k"), free_port(), free_port(), libs_dir=tmp_path).start()
    held = weakref.ref(kafka)
    del kafka
    gc.collect()
    running = held()
    assert running is not None and running.running()  # kept by its stop at exit
    assert running.stop(timeout=5) == 0
    del running
    gc.collect()
    assert held() is None


def test_a_normal_exit_leaves_no_broker_behind(tmp_path: Path, java: Path) -> None:
    kept, stopped = broker_dir(tmp_path, "kept"), broker_dir(tmp_path, "stopped")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(kept), str(stopped)], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr
    pid, code = child.stdout.split()
    assert code == "0"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)
