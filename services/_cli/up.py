"""`roundtrip up`, `console` and `config`: the local fleet started and supervised, where its console answers, and
the configuration in effect."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Annotated

import typer

from roundtrip._cli.fleets import FleetOption
from roundtrip._cli.help import this_command
from roundtrip._kernel.settings import Settings, get_settings
from roundtrip._kernel.wire import topology

if TYPE_CHECKING:
    from roundtrip._sdk.agent import Agent

AgentVersions = Annotated[
    list[str] | None,
    typer.Option(
        help="NAME=AGENT: also run agent version NAME (its own model, gate and executor, running AGENT as "
        "ROUNDTRIP_AGENT takes it) beside the default version; again for another. `roundtrip versions ramp` sends it "
        "conversations"
    ),
]


def up(
    executors: Annotated[int, typer.Option(help="executor replicas to start")] = 1,
    health_port: Annotated[
        int | None,
        typer.Option(
            help="serve /healthz /readyz /metrics from each service on this port + its index "
            "(gateway +0, model +1, guard +2, gate +3, executor +4, console +5, more executors +6 each)"
        ),
    ] = None,
    version: AgentVersions = None,
) -> None:
    """Start everything on this machine: broker, simulator, shop, the five services and the console.

    First the fleet's databases are brought to this code's revision (roundtrip db upgrade).
    Ready. is printed once every service has said it started, whatever the log level. One
    fleet per state folder (ROUNDTRIP_STATE_DIR): a second up there names the pid that runs it.

    With ROUNDTRIP_KAFKA_SECURITY_PROTOCOL (and its SASL settings) set and no ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS, the
    embedded broker is started secured that way: its only listener speaks that protocol, with a throwaway CA (state
    folder, kafka-secured/tls), the configured SCRAM or PLAIN user, a client certificate required for SSL, and Kafka's
    unsecured validator for OAUTHBEARER (roundtrip._broker.unsecured_token:UnsecuredTokenProvider); the services are
    given the CA (and the client certificate), and up prints them.

    Supervises them: a process that dies (any service, a replica, the simulator, the shop or
    the embedded broker) is restarted with exponential backoff (0.5 s doubling to 30 s, reset
    after a minute up); Ctrl-C (SIGINT or SIGTERM) stops everything. A part that exits before
    it is ready is restarted the same way, three times, while the rest go on starting; then up
    stops with one line: the cause from its log (a taken port and its setting, a refused setting)."""
    _refuse_hidden_package()  # before the imports below: they load the agent
    from roundtrip._broker.embedded import BrokerError
    from roundtrip._cli.common import checked_agent
    from roundtrip._fleet.launcher import Fleet
    from roundtrip._fleet.supervisor import FleetError

    port = health_port if health_port is not None else get_settings().health_port
    if port:  # each service takes its own port from there (the children read these from the environment)
        os.environ["ROUNDTRIP_HEALTH_PORT"] = str(port)
        os.environ["ROUNDTRIP_HEALTH_PORT_PER_SERVICE"] = "true"
        get_settings.cache_clear()
    settings = get_settings()
    agent = checked_agent(settings)  # before the broker: a bad agent or agent setting is said before any start-up
    _checked_keys(settings, agent)  # likewise a key a service would refuse, once, not as a restart loop
    _claim_state_dir(settings)
    typer.echo(f"roundtrip: starting the fleet (agent {agent.name})")
    try:
        fleet = Fleet(settings, executor_replicas=executors, versions=_versions(version or []), say=typer.echo)
        fleet.start()
    except (FleetError, BrokerError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    _mark_folders(settings)  # before Ready.: whoever waits for it finds the markers written
    _say_ready(port, agent, settings)
    stop = {"now": False}
    for signum in (signal.SIGINT, signal.SIGTERM):  # explicit: SIGINT may be ignored when started in the background
        signal.signal(signum, lambda *_: stop.update(now=True))
    fleet.supervise(lambda: stop["now"])
    typer.echo("\nroundtrip: stopping")
    fleet.stop()
    typer.echo("roundtrip: stopped")


def _refuse_hidden_package() -> None:
    """The fleet's processes start as `python -m` in this folder, which Python searches first for `roundtrip`."""
    from pathlib import Path

    from roundtrip._cli import hidden_line, hiding

    if (hidden := hiding(Path.cwd())) is not None:
        typer.secho(hidden_line(hidden, "the fleet's processes"), fg="red", err=True)
        raise typer.Exit(1)


def _claim_state_dir(settings: Settings) -> None:
    """A second up in this folder is told which fleet runs there (exit 1) before it says it starts one."""
    from roundtrip._fleet.supervisor import FleetError, claim_folder

    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        claim_folder(settings.state_dir)
    except (FleetError, OSError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None


def _versions(given: list[str]) -> dict[str, dict[str, str]]:
    """`--version NAME=AGENT` as the fleet's versions: each one's own settings (its agent)."""
    import re

    from roundtrip._kernel.wire import topics

    versions: dict[str, dict[str, str]] = {}
    for each in given:
        name, _, agent = each.partition("=")
        if not re.fullmatch(topics.VERSION_NAME, name) or not agent:
            raise typer.BadParameter(f"{each!r}: a version is NAME=AGENT, NAME 1 to 40 letters, digits, '-' or '_'")
        versions[name] = {"ROUNDTRIP_AGENT": agent}
    return versions


def _mark_folders(settings: Settings) -> None:
    """Leave the fleet's marker here and in its agent's project folder: commands run there find this fleet."""
    from pathlib import Path

    from roundtrip._cli.fleets import agent_project, mark

    written = mark([Path.cwd(), agent_project(settings.agent or "")], settings.state_dir)
    if written:
        folders = " and ".join(str(path.parent) for path in written)
        typer.echo(f"Commands run in {folders} (or below) talk to this fleet (marker {written[0].name}).")


def _say_ready(port: int | None, agent: Agent, settings: Settings) -> None:
    if port:
        typer.echo(
            "  health and metrics: "
            + ", ".join(f"{name} :{port + topology.index(name)}" for name in topology.names())
            + " (/healthz /readyz /metrics)"
        )
    typer.echo(_ready(agent, settings))


def _checked_keys(settings: Settings, agent: Agent) -> None:
    """Every service's keys as `roundtrip run` checks them; one line and exit 1 if one cannot."""
    from roundtrip._kernel.settings import ConfigurationError

    try:
        settings.refuse_unfit_keys("the fleet", ())  # a retired setting, whichever service it was meant for
        for declared in topology.SERVICES:
            settings.refuse_unfit_keys(declared.name, declared.keys, agent.holds_calls())
    except ConfigurationError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None


def _ready(agent: Agent, settings: Settings) -> str:
    """The banner once the fleet is up, with the agent's own example, else a greeting as a customer id of yours."""
    import json

    from roundtrip._cli.common import EXAMPLE_PERSONA

    ask = json.dumps(agent.example_ask or "hello", ensure_ascii=False)
    customer = agent.example_customer or "<a customer id of yours>"
    # with no key the simulator plays the shop's personas, any other agent only from a script: the agent's own
    scripted = f" --persona {EXAMPLE_PERSONA}" if settings.use_simulator and agent.example_script else ""
    return (
        "\nReady. Publish to support.requests, read support.replies, or try:\n"
        f"  {this_command()} ask {ask} --customer {customer}{scripted}\n"
        f"The console (approvals, turns): {console_url(settings)}\n"
        "Crashed processes are restarted. Ctrl-C stops everything."
    )


def console_url(settings: Settings) -> str:
    """Where the console answers on this machine, and as whom a visitor is signed in."""
    host = "localhost" if settings.listen_host in ("127.0.0.1", "0.0.0.0", "::", "localhost") else settings.listen_host
    who = settings.console_local_identity
    return f"http://{host}:{settings.console_port}" + (
        f" (signed in as {who})" if who else " (through your sign-on proxy)"
    )


def console_command(fleet: FleetOption = None) -> None:
    """Where the fleet's console is (approvals and turns in a browser) and whether it answers; `roundtrip up` starts it,
    `roundtrip run console` runs one alone."""
    import httpx

    from roundtrip._cli.common import fleet_settings

    settings = fleet_settings(fleet)
    host = "127.0.0.1" if settings.listen_host in ("0.0.0.0", "::") else settings.listen_host
    url = f"http://{host}:{settings.console_port}"
    typer.echo(f"The console (approvals, turns): {console_url(settings)}")
    try:
        answer = httpx.get(f"{url}/approvals", timeout=3)
    except httpx.HTTPError as exc:
        typer.secho(
            f"error: nothing answers at {url} ({type(exc).__name__}); is the fleet up? (roundtrip up)",
            fg="red",
            err=True,
        )
        raise typer.Exit(1) from None
    hint = ": it serves only those its sign-on proxy signs in" if answer.status_code == 401 else ""
    typer.echo(f"  it answers (HTTP {answer.status_code}{hint})")


def config(fleet: FleetOption = None) -> None:
    """Print the effective configuration, grouped by concern (secrets hidden): the running fleet's, when one runs in
    the state folder, else this shell's."""
    from roundtrip._cli.common import fleet_settings
    from roundtrip._kernel.settings import ConfigurationError, display
    from roundtrip._sdk.agent import current_agent

    settings = fleet_settings(fleet)
    try:
        agent = current_agent(settings.agent)
    except ConfigurationError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    from roundtrip._model.providers import in_effect

    own = display.own_group(f"the agent's own settings ({agent.name})", agent.own_settings)
    typer.echo(display.render(settings, [("the model's platform in effect", in_effect(settings)), *own]))
    for warning in display.warnings(settings, agent.holds_calls()):
        typer.secho(f"warning: {warning}", fg="yellow", err=True)
