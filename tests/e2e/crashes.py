"""The e2e tier's watch on the session's fleet (the autouse fixture `_fleet_whole_after_each_test` in
tests/e2e/conftest.py): a process of the fleet that exited during a test fails that test, named with how it ended
and the last lines of its log, unless the test ended it on purpose; either way the fleet is made whole again for
the next test.

On purpose means one of two things:
* `AsyncFleet.restart` (and `reconfigured`, which restarts) ended it: a restart is never a crash;
* the test carries the marker `kills_services`: it kills processes of the fleet (`fleet.kill`, a signal) and says
  so, since a kill it does not declare reads the same as a crash.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from roundtrip._fleet.launcher import Fleet

ON_PURPOSE = "kills_services"  # the marker of a test that kills processes of the session's fleet
LOG_LINES = 15


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def last_lines(path: Path, n: int = LOG_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError as exc:
        return f"    (no log: {exc})"
    return "\n".join(f"    {line}" for line in lines)


@dataclass
class Watch:
    """The fleet's live processes as a test began: (name, process, log)."""

    processes: list[tuple[str, subprocess.Popen, Path]]

    @classmethod
    def of(cls, fleet: Fleet) -> Watch:
        return cls([(c.name, c.process, c.log_path) for c in fleet.children if c.process.poll() is None])

    def exits(self, on_purpose: Collection[int] = ()) -> list[str]:
        """One paragraph per process that has exited since, but those of pids in `on_purpose`."""
        found = []
        for name, process, log in self.processes:
            if process.poll() is None or process.pid in on_purpose:
                continue
            found.append(
                f"{name} (pid {process.pid}) exited during the test: {how_it_ended(process.returncode)}; "
                f"the last lines of {log}:\n{last_lines(log)}"
            )
        return found


def after_test(fleet: Fleet, watch: Watch, restarted: set[int], declared: bool) -> str | None:
    """Make the fleet whole again; what to fail the test with when it lost a process it did not end on purpose."""
    exits = [] if declared else watch.exits(restarted)
    fleet.respawn_exited()
    if not exits:
        return None
    return (
        "a process of the session's fleet exited during this test (restarted for the next test; a test that kills "
        f"fleet processes on purpose says so with @pytest.mark.{ON_PURPOSE}):\n" + "\n".join(exits)
    )
