"""`roundtrip db upgrade|current|roles`: the fleet's own tables brought to this code's revision, checked, and the
PostgreSQL logins per service."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from roundtrip._kernel.settings import get_settings

app = typer.Typer(
    help="The fleet's own tables (turns, approvals, conversations): their migrations.", no_args_is_help=True
)


@app.command("upgrade")
def db_upgrade() -> None:
    """Bring the ledger's and the conversations' tables to this code's revision (ROUNDTRIP_LEDGER_DATABASE_URL,
    ROUNDTRIP_CONVERSATIONS_DATABASE_URL); a database made before migrations is adopted, rows kept.
    Idempotent, and safe when several run at once."""
    from roundtrip._kernel.migrations.schema import upgrade_databases

    for line in upgrade_databases(get_settings()):
        typer.echo(line)


@app.command("current")
def db_current(
    wait: Annotated[
        float,
        typer.Option(
            help="seconds to wait (asking every 2 s) for each store to reach this code's revision with this login, "
            "as a pod does while another one's init step migrates the tables and makes the logins"
        ),
    ] = 0.0,
) -> None:
    """Show each store's revision in its database against this code's (exit code 1 if one differs); writes nothing."""
    import time

    from roundtrip._kernel.database import shown
    from roundtrip._kernel.migrations import DatabaseUnreachable
    from roundtrip._kernel.migrations.schema import current, databases, mismatch

    until = time.monotonic() + wait
    while True:
        lines, code = [], 0
        try:
            for url, stores in databases(get_settings()).items():
                for store, found in asyncio.run(current(url, stores)).items():
                    why = mismatch(store, url, found)
                    lines.append(why or f"{store} database {shown(url)}: at {found}, this code's revision")
                    code = code or int(why is not None)
        except DatabaseUnreachable:
            if time.monotonic() >= until:
                raise
            code = 1
        if code == 0 or time.monotonic() >= until:
            break
        time.sleep(2)  # poll interval: another pod's migration and roles
    for line in lines:
        typer.echo(line)
    raise typer.Exit(code)


@app.command("roles")
def db_roles(
    apply: Annotated[
        bool, typer.Option("--apply", help="run them (in one transaction) instead of printing them")
    ] = False,
    database_url: Annotated[
        str | None,
        typer.Option(
            envvar="ROUNDTRIP_DB_ADMIN_URL",
            help="the login that grants: the tables' owner (the guard's, which migrated them; CREATEROLE to create "
            "the roles) or a superuser; default: ROUNDTRIP_LEDGER_DATABASE_URL (and the conversations' URL)",
        ),
    ] = None,
    prefix: Annotated[str, typer.Option(help="the roles' names: PREFIX + the service")] = "roundtrip_",
) -> None:
    """Print (or --apply) the PostgreSQL roles and grants of a login per service: the guard owns the ledger and the
    conversations; the executor and the model service may read the turns and UPDATE only their claims' columns;
    the gate and the gateway read the turns, the console the four tables; nothing else, nothing for PUBLIC.

    Run it after `roundtrip db upgrade` (it grants on the tables the migrations made) and again after each upgrade.
    Idempotent. A missing role is created with LOGIN and the password in ROUNDTRIP_<SERVICE>_DATABASE_URL
    (e.g. ROUNDTRIP_EXECUTOR_DATABASE_URL: the URL the executor connects with, or only its password); a
    password is never printed; an existing role's password is left as it is."""
    import os

    from roundtrip._kernel.database import is_sqlite, shown
    from roundtrip._kernel.migrations import STORES
    from roundtrip._kernel.migrations.schema import databases
    from roundtrip._kernel.storage import roles

    found = {database_url: STORES} if database_url else databases(get_settings())
    for url, stores in found.items():
        if is_sqlite(url):
            typer.secho(
                f"error: {shown(url)} is SQLite, which has no roles: one file, the laptop's", fg="red", err=True
            )
            raise typer.Exit(1)
        if not apply:
            typer.echo(f"-- the {' and '.join(stores)} database {shown(url)}")
            tables = [t for s in stores for t in roles.TABLES[s]]
            typer.echo(roles.shown_statements(roles.statements(tables, prefix)), nl=False)
            continue
        try:
            done = asyncio.run(roles.apply_to(url, roles.passwords_from(os.environ, prefix), prefix))
        except ValueError as exc:
            typer.secho(f"error: {exc}", fg="red", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"the {' and '.join(stores)} database {shown(url)}:")
        for line in done:
            typer.echo(f"  {line}")
