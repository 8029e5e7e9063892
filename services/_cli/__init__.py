"""The `roundtrip` command line (main.py) and what its commands do in a terminal (private to roundtrip)."""

from __future__ import annotations

import sys
from importlib import metadata
from importlib.machinery import PathFinder
from pathlib import Path

# On PyPI `roundtrip` is an unrelated project (round-trip translation, 2018) that installs a top-level package of the
# same name: installed beside roundtrip-fleet, one overwrites the other's files.
UNRELATED = "roundtrip"
PACKAGE = Path(__file__).resolve().parent.parent  # this package's folder: services/ in a checkout


def clash() -> str | None:
    """One line saying why this installation cannot work, when the unrelated `roundtrip` distribution is installed."""
    try:
        found = metadata.distribution(UNRELATED)
    except metadata.PackageNotFoundError:
        return None
    return (
        f"error: the unrelated distribution '{UNRELATED}' {found.version} is installed beside roundtrip-fleet and "
        "shares its import name `roundtrip`, so one has overwritten the other's files: "
        "pip uninstall roundtrip, then pip install --force-reinstall roundtrip-fleet"
    )


def hiding(folder: Path) -> Path | None:
    """What a Python started in `folder` (`python -m`, `python -c`) would import as `roundtrip` instead of this
    package: a folder named roundtrip there, such as a clone of the project, since Python looks in the current folder
    first. A folder without __init__.py hides only an editable install (its import hook comes after that search)."""
    spec = PathFinder.find_spec("roundtrip", [str(folder), *sys.path])
    if spec is None:  # nothing on the path: the editable install's hook finds this package
        return None
    found = [Path(p).resolve() for p in spec.submodule_search_locations or []]
    return None if found == [PACKAGE] else (found[0] if found else Path(spec.origin or folder))


def hidden_line(path: Path, who: str) -> str:
    """The cause and the fix in one line, for `who` (this command, the fleet's processes)."""
    return (
        f"error: {path} hides the installed roundtrip package from {who} (Python looks in the current folder first, "
        "and a clone of the project named roundtrip is such a folder): run it from another folder"
        + (f", e.g. cd {path}" if path.is_dir() else "")
    )


def shadowed() -> str | None:
    """One line when this process imported `roundtrip` from another folder than this package's (`python -m roundtrip`
    beside a clone): its submodules load from the install, but `from roundtrip import Agent` fails."""
    import roundtrip

    found = [Path(p).resolve() for p in getattr(roundtrip, "__path__", [])]
    return None if found == [PACKAGE] else hidden_line(found[0] if found else Path.cwd(), "this command")


def entry() -> None:
    """The `roundtrip` console script and `python -m roundtrip`: the checks first (nothing of the fleet is imported
    before them)."""
    if line := clash() or shadowed():
        print(line, file=sys.stderr)
        raise SystemExit(1)
    from roundtrip._cli.main import main as run

    run()
