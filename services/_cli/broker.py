"""`roundtrip broker fetch|run`: the embedded Apache Kafka broker's jars, and the broker in the foreground."""

from __future__ import annotations

import typer

from roundtrip._kernel.settings import get_settings

app = typer.Typer(help="The embedded Apache Kafka broker (KRaft, from Maven Central).", no_args_is_help=True)


@app.command("fetch")
def broker_fetch() -> None:
    """Fetch the Kafka jars from Maven Central into the cache (once)."""
    from roundtrip._broker.embedded import fetch_configured

    typer.echo(str(fetch_configured(get_settings(), progress=typer.echo)))


@app.command("run")
def broker_run() -> None:
    """Run the embedded broker in the foreground."""
    from roundtrip._broker.embedded import main as broker_main

    raise typer.Exit(broker_main(["run"]))
