"""How `roundtrip ... --help` reads: a flag is shown with no `<bool>` type, and each docstring paragraph is one line
for typer, wrapped once at the terminal's width (typer keeps the source's line breaks and wraps again, cutting
sentences in the middle)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import typer
import typer.core


def _flag_type_shown(display_type_rich: Callable[..., str | None]) -> Any:  # Any: the caller marks the function
    def shown(option: typer.core.TyperOption, ctx: Any) -> str | None:
        return None if option.is_flag and option.metavar is None else display_type_rich(option, ctx)

    return shown


def flags_without_type() -> None:
    if not getattr(typer.core.TyperOption.display_type_rich, "_roundtrip", False):
        shown = _flag_type_shown(typer.core.TyperOption.display_type_rich)
        shown._roundtrip = True  # a mark on the function: patched once per process
        typer.core.TyperOption.display_type_rich = shown  # type: ignore[method-assign]  # typer has no hook for it


def reflowed(text: str) -> str:
    """Each paragraph (split on blank lines) on one line."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def reflow_help(app: typer.Typer) -> None:
    """Give every command of `app` (and of its sub-apps) its docstring, reflowed, as its help."""
    for command in app.registered_commands:
        text = command.help or (command.callback.__doc__ if command.callback else None)
        if text:
            command.help = reflowed(text)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)


def this_command() -> str:
    """How to run `roundtrip` from the user's shell: the bare name when PATH finds this installation, else its path."""
    import shutil
    from pathlib import Path

    mine = Path(sys.executable).parent / "roundtrip"
    found = shutil.which("roundtrip")
    if found and mine.exists() and Path(found).resolve() == mine.resolve():
        return "roundtrip"
    return str(mine) if mine.exists() else f"{sys.executable} -m roundtrip"
