"""Which fleet a command talks to when the author works from their agent's folder, not from where `up` was started.

`roundtrip up` leaves a marker, .roundtrip-fleet (the state folder's absolute path), in the folder it was started in and
in its agent's project folder (the one holding the agent's pyproject.toml); a command run with no ROUNDTRIP_STATE_DIR
and no fleet in its own state folder takes the first marker found walking up from its folder; `--fleet STATE_DIR`
(FleetOption: here, as the commands import this light module when declared, common.py when run) names one. `roundtrip
eval run` then refuses a suite whose project declares other agents than the one the fleet runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tomllib
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated

import typer

from roundtrip._kernel.settings import get_settings

MARKER = ".roundtrip-fleet"
AGENTS_GROUP = "roundtrip.agents"


def use_fleet(fleet: Path | None) -> None:
    """--fleet: the command reads the fleet running in that state folder, as ROUNDTRIP_STATE_DIR would (no marker is
    looked for). A group applies its own before its subcommand runs (`turns --fleet D cancel T`)."""
    if fleet is not None:
        os.environ["ROUNDTRIP_STATE_DIR"] = str(fleet.resolve())
        get_settings.cache_clear()


FleetOption = Annotated[
    Path | None,
    typer.Option(
        "--fleet",
        metavar="STATE_DIR",
        exists=True,
        file_okay=False,
        help="the state folder of the fleet to talk to (default: the one running in ROUNDTRIP_STATE_DIR, .roundtrip, "
        "else the one `roundtrip up` marked this folder or one above for)",
    ),
]


def mark(folders: Iterable[Path | None], state_dir: Path) -> list[Path]:
    """Write the marker naming `state_dir` in each folder that can take it; the markers written."""
    written = []
    for folder in dict.fromkeys(f.resolve() for f in folders if f is not None):
        with contextlib.suppress(OSError):  # a read-only folder: commands there read their own settings
            (folder / MARKER).write_text(f"{state_dir.resolve()}\n", encoding="utf-8")
            written.append(folder / MARKER)
    return written


def marked(start: Path) -> Path | None:
    """The state folder the nearest marker at or above `start` names."""
    for folder in (start.resolve(), *start.resolve().parents):
        with contextlib.suppress(OSError):
            named = (folder / MARKER).read_text(encoding="utf-8").strip()
            if named:
                return Path(named)
    return None


def project_of(path: Path) -> Path | None:
    """The nearest folder at or above `path` holding a pyproject.toml, outside an installed environment."""
    for folder in (path.resolve(), *path.resolve().parents):
        if folder.name in ("site-packages", "dist-packages"):
            return None
        if (folder / "pyproject.toml").is_file():
            return folder
    return None


def agent_project(spec: str) -> Path | None:
    """The project folder of the agent ROUNDTRIP_AGENT names (an entry point's name or package.module:attribute)."""
    if ":" not in spec:
        found = [ep.value for ep in entry_points(group=AGENTS_GROUP) if ep.name == spec]
        spec = found[0] if found else ""
    module = spec.partition(":")[0]
    try:
        origin = importlib.util.find_spec(module).origin if module else None  # type: ignore[union-attr]
    except (ImportError, ValueError, AttributeError):
        return None
    return project_of(Path(origin).parent) if origin else None


def declared_agents(suite: Path) -> tuple[Path, list[str]] | None:
    """(pyproject.toml, the agents it declares) of the project a suite's cases are in; None when it declares none."""
    project = project_of(suite if suite.is_dir() else suite.parent)
    if project is None:
        return None
    try:
        data = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    names = list(data.get("project", {}).get("entry-points", {}).get(AGENTS_GROUP, {}))
    return (project / "pyproject.toml", names) if names else None
