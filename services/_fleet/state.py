"""Which fleet an operator command talks to: the one `roundtrip up` runs in its state folder, with its settings.

`roundtrip up` records its services' ROUNDTRIP_* environment in state_dir/fleet.json, readable by its user only (it
holds the fleet's database URLs and keys, as the services' own environment does), until the fleet stops. A command run
with that state folder takes those settings instead of its shell's, so it reads the fleet's ledger, and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from roundtrip._fleet.supervisor import RUNNING_FILE, alive

STATE_FILE = "fleet.json"
PREFIX = "ROUNDTRIP_"
PER_PROCESS = ("ROUNDTRIP_INSTANCE_ID", "ROUNDTRIP_READY_FD")  # each child's own, not the fleet's
COMMANDS_OWN = ("ROUNDTRIP_JAEGER_QUERY_URL",)  # read by the commands only, never by a service: the shell's stands


def record(state_dir: Path, env: Mapping[str, str]) -> Path:
    """Write the fleet's settings (its services' ROUNDTRIP_* environment) next to fleet.pid, for its user only."""
    values = {k: v for k, v in env.items() if k.startswith(PREFIX) and k not in PER_PROCESS}
    values[f"{PREFIX}STATE_DIR"] = str(state_dir.resolve())
    path, tmp = state_dir / STATE_FILE, state_dir / f".{STATE_FILE}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        json.dump({"pid": os.getpid(), "env": values}, out, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def forget(state_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (state_dir / STATE_FILE).unlink()


@dataclass
class Reading:
    """What a command reads: the running fleet's settings (`pid` set) or its shell's, and the variables that differ."""

    state_dir: Path
    pid: int | None = None
    differ: list[str] = field(default_factory=list)
    agent: str = ""  # the fleet's ROUNDTRIP_AGENT, or the shell's when none runs ("": the default agent)

    def lines(self, ledger: str) -> list[str]:
        """What the command says about it (`ledger`: the ledger's URL as shown, without its password)."""
        agent = f"agent {self.agent}" if self.agent else "the default agent"
        if self.pid is None:
            return [
                f"no fleet runs in {self.state_dir.resolve()} (roundtrip up records it there; --fleet STATE_DIR names "
                f"another): reading this shell's settings: {agent}, ledger {ledger}"
            ]
        said = [
            f"the fleet running in {self.state_dir.resolve()} (pid {self.pid}): {agent}, its settings, ledger {ledger}"
        ]
        if self.differ:
            one = len(self.differ) == 1
            said.append(
                f"warning: this shell's {', '.join(self.differ)} {'differs' if one else 'differ'} from the fleet's; "
                f"the fleet's {'is' if one else 'are'} used (ROUNDTRIP_STATE_DIR names another fleet's folder)"
            )
        return said


def running(state_dir: Path) -> tuple[int, dict[str, str]] | None:
    """(pid, settings) of the fleet running in this folder: its record, if the process that claimed the folder runs."""
    try:
        claimed = int((state_dir / RUNNING_FILE).read_text().split()[0])
        found = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError, IndexError):
        return None
    if found.get("pid") != claimed or not alive(claimed) or not isinstance(found.get("env"), dict):
        return None
    return claimed, {str(k): str(v) for k, v in found["env"].items()}


def adopt(state_dir: Path) -> Reading:
    """Make this process's ROUNDTRIP_* settings those of the fleet running in `state_dir`, if one runs there."""
    found, environ = running(state_dir), os.environ
    if found is None:
        return Reading(state_dir, agent=environ.get(f"{PREFIX}AGENT", "").strip())
    pid, fleet = found
    shell = {
        k: v for k, v in environ.items() if k.startswith(PREFIX) and k not in PER_PROCESS and k not in COMMANDS_OWN
    }
    differ = sorted(
        k for k, v in shell.items() if fleet.get(k) != v and not (k == f"{PREFIX}STATE_DIR" and _same(v, fleet[k]))
    )
    for key in shell:
        del environ[key]
    environ.update({k: v for k, v in fleet.items() if k not in COMMANDS_OWN or k not in environ})
    return Reading(state_dir, pid, differ, fleet.get(f"{PREFIX}AGENT", "").strip())


def _same(a: str, b: str) -> bool:
    return Path(a).resolve() == Path(b).resolve()
