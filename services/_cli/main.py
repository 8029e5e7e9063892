"""`roundtrip`: run the fleet, one service, or talk to it.

Configuration comes from ROUNDTRIP_* environment variables (see `roundtrip config`).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import runpy
import sys
from typing import Annotated

import typer

from roundtrip._cli import (
    approvals,
    asking,
    broker,
    conversations,
    db,
    kafka_admin,
    making,
    observe,
    turns,
    up,
    versions,
)
from roundtrip._cli.agent import agent_app
from roundtrip._cli.evals import eval_app
from roundtrip._cli.help import flags_without_type, reflow_help
from roundtrip._kernel.observability.logs import configure as configure_logging
from roundtrip._kernel.settings import Settings, get_settings
from roundtrip._kernel.wire import topology

flags_without_type()
app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
# one module a command group (services/_cli/), each its commands and what they do; here `run`, a service's start-up
app.add_typer(kafka_admin.app, name="topics")
app.add_typer(turns.app, name="turns")
app.add_typer(conversations.app, name="conversations")
app.add_typer(broker.app, name="broker")
app.add_typer(approvals.app, name="approvals")
app.add_typer(db.app, name="db")
app.add_typer(agent_app, name="agent")
app.add_typer(eval_app, name="eval")
app.add_typer(versions.app, name="versions")

FLEET_SERVICES = topology.names()
ALL_RUNNABLE = (*FLEET_SERVICES, "simulator", "shop")


def _logging() -> None:
    level = get_settings().log_level.upper()
    configure_logging(level)
    for noisy in ("aiokafka", "httpx", "httpx2", "httpcore", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def _no_preflight(settings: object) -> None:
    """A service without checks to make before it is built."""


def _refuse_unfit(settings: Settings, declared: topology.Service, holds_calls: bool) -> None:
    """ConfigurationError for what this service must not run with outside development."""
    from roundtrip._kernel.settings import ConfigurationError

    service = declared.name
    if settings.agent_version and not declared.versioned:
        raise ConfigurationError(
            f"ROUNDTRIP_AGENT_VERSION={settings.agent_version}: the {service} serves every agent version; only a "
            f"model, gate or executor runs one (unset it for the {service})"
        )
    settings.refuse_unfit_keys(service, declared.keys, holds_calls)
    if declared.shares_ledger:
        settings.refuse_private_ledger(service)
    if declared.signs_decisions:  # the console: its development sign-in (everyone an approver) stays there
        settings.refuse_console_local_user(service)
        settings.refuse_weak_session_key(service)
    settings.refuse_plaintext_kafka(service)


def _refuse_wide_login(settings: Settings, declared: topology.Service) -> None:
    """InsecureConfiguration when the service's database login may do more than its part (outside development)."""
    if declared.shares_ledger:
        from roundtrip._kernel.storage.roles import refuse_excess

        asyncio.run(refuse_excess(settings, declared.name))


@app.command()
def run(service: Annotated[str, typer.Argument(help=f"one of: {', '.join(ALL_RUNNABLE)}")]) -> None:
    """Run one service in the foreground (Ctrl-C stops it)."""
    if service not in ALL_RUNNABLE:
        raise typer.BadParameter(f"unknown service {service!r}; choose one of {', '.join(ALL_RUNNABLE)}")
    _logging()
    settings = get_settings()
    if service in ("simulator", "shop"):
        sys.argv = [f"roundtrip run {service}"]  # its own argument parser reads settings, not our argv
        runpy.run_module(f"roundtrip._{service}", run_name="__main__")
        return
    from roundtrip._kernel.kafka import faststream_seam
    from roundtrip._kernel.observability import health
    from roundtrip._kernel.observability.telemetry import setup_telemetry
    from roundtrip._kernel.runtime import announce_ready, run_loop, settle_heap
    from roundtrip._kernel.settings import ConfigurationError
    from roundtrip._sdk.agent import current_agent

    # a refused connection is said once, by main(), not also by aiokafka
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        agent = current_agent(settings.agent)
        declared = topology.service(service)
        _refuse_unfit(settings, declared, agent.holds_calls())
        if service == "model":
            from roundtrip._model.providers import refuse_unusable

            refuse_unusable(settings, agent.model_for(settings))
        _refuse_wide_login(settings, declared)
        module = importlib.import_module(declared.app_module)
        asyncio.run(getattr(module, "preflight", _no_preflight)(settings))
    except ConfigurationError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    setup_telemetry(service, settings)
    stream = module.build(settings, agent)
    health.attach(stream, service, settings, health.of(stream), faststream_seam.consume_loops_alive)
    log = logging.getLogger(f"roundtrip.{service}")

    async def announce() -> None:
        logging.getLogger("aiokafka").setLevel(logging.WARNING)  # from here on its reconnects are worth seeing
        log.info("roundtrip %s started (broker %s)", service, settings.bootstrap_servers)
        announce_ready(service)

    stream.after_startup(announce)

    async def settle() -> None:
        log.debug("%d start-up objects frozen out of the garbage collector's reach", settle_heap())

    stream.after_startup(settle)

    async def main() -> None:
        from roundtrip._kernel.observability.telemetry import shutdown_telemetry

        try:
            await stream.run(sleep_time=0.5)
        finally:
            shutdown_telemetry()

    run_loop(main())


app.command()(up.up)
app.command()(asking.ask)
app.command()(asking.chat)
app.command("console")(up.console_command)
app.command()(observe.trace)
app.command("dead-letters")(observe.dead_letters)
app.command()(observe.lag)
app.command()(up.config)
app.command()(making.keys)
app.command()(making.contracts)
app.command()(kafka_admin.acls)
reflow_help(app)  # after every command is declared


def main() -> None:
    from aiokafka.errors import KafkaConnectionError
    from pydantic import ValidationError

    from roundtrip._kernel.kafka.clients import kafka_clients
    from roundtrip._kernel.kafka.refusals import AUTHORIZATION_ERRORS, authorization, refusal
    from roundtrip._kernel.migrations import DatabaseUnreachable, SchemaMismatch
    from roundtrip._kernel.settings import ConfigurationError, describe_invalid

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        app()
    except ValidationError as exc:
        typer.secho(f"error: invalid configuration: {describe_invalid(exc)}", fg="red", err=True)
        raise SystemExit(1) from None
    except ConfigurationError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise SystemExit(1) from None
    except (
        SchemaMismatch,
        DatabaseUnreachable,
    ) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise SystemExit(1) from None
    except KafkaConnectionError as exc:
        s = get_settings()
        if cause := asyncio.run(refusal(kafka_clients(s))):  # refused (a password, a certificate), not out of reach
            typer.secho(f"error: Kafka at {s.bootstrap_servers} refused the connection: {cause}", fg="red", err=True)
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # no "Unclosed AIOKafkaProducer" after the line
            raise SystemExit(2) from None
        typer.secho(
            f"error: cannot reach Kafka at {s.bootstrap_servers} ({exc}). Is the fleet up (`roundtrip up`), "
            "or ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS set?",
            fg="red",
            err=True,
        )
        raise SystemExit(2) from None
    except AUTHORIZATION_ERRORS as exc:  # an ACL the principal lacks: one line, not a retry loop
        typer.secho(f"error: {authorization(exc)}", fg="red", err=True)
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # no "Unclosed AIOKafkaProducer" after the line
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
