"""The `roundtrip` command line (main.py) and what its commands do in a terminal (private to roundtrip)."""

from __future__ import annotations

import sys
from importlib import metadata

# On PyPI `roundtrip` is an unrelated project (round-trip translation, 2018) that installs a top-level package of the
# same name: installed beside roundtrip-fleet, one overwrites the other's files.
UNRELATED = "roundtrip"


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


def entry() -> None:
    """The `roundtrip` console script: the clash check first (nothing of the fleet is imported before it)."""
    if line := clash():
        print(line, file=sys.stderr)
        raise SystemExit(1)
    from roundtrip._cli.main import main as run

    run()
