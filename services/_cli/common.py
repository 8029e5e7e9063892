"""What the CLI's command groups share: the fleet a command talks to, the agent it runs, who decides, and how a
value is shown in a terminal (text from customers, models and tools never read as Rich markup).

The command modules import it where they use it, as they do everything heavier than typer: `roundtrip --help` and
`roundtrip run` start without it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console, RenderableType
from rich.markup import escape
from rich.segment import Segments

from roundtrip._kernel.settings import Settings, get_settings

if TYPE_CHECKING:
    from roundtrip._sdk.agent import Agent

EXAMPLE_PERSONA = "script:example"  # the agent's own example_script, as `ask --persona` names it


# emoji off: a customer's ":smile:" stays as typed; the markup is the fleet's, the values go through plain()
console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 200)


def plain(value: Any) -> str:
    """`value` shown as it is inside a line of markup: text from customers, models, tools and people
    (`[red]49,99[/red]`, `[[tx:echo]]`) is never read as Rich markup."""
    return escape(str(value))


def short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_label(name: str, tool_input: Any) -> str:
    """`cancel_order(ord_a1000003)`: the ids a call names, else its input in short."""
    ids = [str(v) for k, v in tool_input.items() if k.endswith("_id")] if isinstance(tool_input, dict) else []
    return f"{name}({', '.join(ids) if ids else short(tool_input, 60)})"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def print_wide(renderable: RenderableType, needed: int) -> None:
    """Print `renderable` `needed` columns wide when the terminal is narrower (the terminal wraps the lines) rather than
    cut or drop a column: Console.print itself never renders wider than the console."""
    width = max(console.width, needed)
    console.print(Segments(console.render(renderable, console.options.update_width(width))), crop=False)


def ledger_missing(settings: Settings, url: str | None = None) -> bool:
    """A SQLite ledger that does not exist means the wrong folder, not an empty fleet: say so, create nothing."""
    url = url or settings.ledger_db_url
    if url.startswith("sqlite") and not Path(url.split(":///", 1)[-1]).exists():
        console.print(
            f"[red]error:[/] no turn ledger at {url.split(':///', 1)[-1]}; run this where the fleet runs, "
            "or set ROUNDTRIP_STATE_DIR / ROUNDTRIP_LEDGER_DATABASE_URL"
        )
        return True
    return False


def fleet_settings(fleet: Path | None) -> Settings:
    """The settings of the fleet this command talks to: the one running in `fleet` (--fleet) or in the state folder
    (services/_fleet/state.py), else the one `up` marked this folder for, else this shell's; which fleet and agent is
    said on stderr, with the shell's variables that differ from the fleet's."""
    import os

    from roundtrip._cli.fleets import marked, use_fleet
    from roundtrip._fleet.state import adopt, running
    from roundtrip._kernel.database import shown

    use_fleet(fleet)
    state_dir = get_settings().state_dir
    if "ROUNDTRIP_STATE_DIR" not in os.environ and running(state_dir) is None:
        found = marked(Path.cwd())  # the fleet `up` marked this folder (or one above) for; a stopped one is not
        state_dir = found if found is not None and running(found) is not None else state_dir
    reading = adopt(state_dir)
    get_settings.cache_clear()
    settings = get_settings()
    for line in reading.lines(shown(settings.ledger_db_url)):
        typer.secho(line, fg="yellow" if line.startswith("warning") else None, err=True)
    return settings


def checked_agent(settings: Settings) -> Agent:
    """The agent the fleet will run, found and checked (its own settings too); one line and exit 1 if it cannot."""
    from roundtrip._kernel.settings import ConfigurationError
    from roundtrip._sdk.agent import current_agent

    try:
        return current_agent(settings.agent)
    except ConfigurationError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None


def me() -> str:
    import getpass
    import socket

    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # noqa: BLE001 - no user name: still a decision, by the host
        return f"operator@{socket.gethostname()}"
