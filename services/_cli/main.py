"""`roundtrip`: run the fleet, one service, or talk to it.

Configuration comes from ROUNDTRIP_* environment variables (see `roundtrip config`).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import runpy
import signal
import sys
import uuid
from typing import Annotated, Any

import typer

from roundtrip._cli.agent import agent_app
from roundtrip._cli.evals import eval_app
from roundtrip._cli.help import flags_without_type, reflow_help, this_command
from roundtrip._kernel.observability.logs import configure as configure_logging
from roundtrip._kernel.settings import Settings, get_settings
from roundtrip._kernel.wire import topics, topology

flags_without_type()
app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
topics_app = typer.Typer(help="Kafka topics of the fleet.", no_args_is_help=True)
broker_app = typer.Typer(help="The embedded Apache Kafka broker (KRaft, from Maven Central).", no_args_is_help=True)
turns_app = typer.Typer(
    help="Turns in the guard's ledger: list them (with trace ids), cancel one.", invoke_without_command=True
)
app.add_typer(topics_app, name="topics")
conversations_app = typer.Typer(
    help="Conversations in the guard's store: list them, forget one (erasure).", invoke_without_command=True
)
app.add_typer(turns_app, name="turns")
app.add_typer(conversations_app, name="conversations")
app.add_typer(broker_app, name="broker")
approvals_app = typer.Typer(
    help="Calls waiting for a person's approval: list them, approve or deny one.", invoke_without_command=True
)
app.add_typer(approvals_app, name="approvals")
db_app = typer.Typer(
    help="The fleet's own tables (turns, approvals, conversations): their migrations.", no_args_is_help=True
)
app.add_typer(db_app, name="db")
app.add_typer(agent_app, name="agent")
app.add_typer(eval_app, name="eval")

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
    service = declared.name
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


def _claim_state_dir(settings: Settings) -> None:
    """A second up in this folder is told which fleet runs there (exit 1) before it says it starts one."""
    from roundtrip._fleet.supervisor import FleetError, claim_folder

    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        claim_folder(settings.state_dir)
    except (FleetError, OSError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None


@app.command()
def up(
    executors: Annotated[int, typer.Option(help="executor replicas to start")] = 1,
    health_port: Annotated[
        int | None,
        typer.Option(
            help="serve /healthz /readyz /metrics from each service on this port + its index "
            "(gateway +0, model +1, guard +2, gate +3, executor +4, console +5, more executors +6 each)"
        ),
    ] = None,
) -> None:
    """Start everything on this machine: broker, simulator, shop, the five services and the console.

    First the fleet's databases are brought to this code's revision (roundtrip db upgrade).
    Ready. is printed once every service has said it started, whatever the log level. One
    fleet per state folder (ROUNDTRIP_STATE_DIR): a second up there names the pid that runs it.

    With ROUNDTRIP_KAFKA_SECURITY_PROTOCOL (and its SASL settings) set and no
    ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS, the embedded broker is started secured that way:
    its only listener speaks that protocol, with a throwaway CA (state folder, kafka-secured/tls),
    the configured SCRAM or PLAIN user, a client certificate required for SSL, and Kafka's unsecured
    validator for OAUTHBEARER (roundtrip._broker.unsecured_token:UnsecuredTokenProvider); the
    services are given the CA (and the client certificate), and up prints them.

    Supervises them: a process that dies (any service, a replica, the simulator, the shop or
    the embedded broker) is restarted with exponential backoff (0.5 s doubling to 30 s, reset
    after a minute up); Ctrl-C (SIGINT or SIGTERM) stops everything. A part that exits before
    it is ready is restarted the same way, three times, while the rest go on starting; then up
    stops with one line: the cause from its log (a taken port and its setting, a refused setting)."""
    import os

    from roundtrip._broker.embedded import BrokerError
    from roundtrip._fleet.launcher import Fleet
    from roundtrip._fleet.supervisor import FleetError

    port = health_port if health_port is not None else get_settings().health_port
    if port:  # each service takes its own port from there (the children read these from the environment)
        os.environ["ROUNDTRIP_HEALTH_PORT"] = str(port)
        os.environ["ROUNDTRIP_HEALTH_PORT_PER_SERVICE"] = "true"
        get_settings.cache_clear()
    settings = get_settings()
    agent = _checked_agent(settings)  # before the broker: a bad agent or agent setting is said before any start-up
    _checked_keys(settings, agent)  # likewise a key a service would refuse, once, not as a restart loop
    _claim_state_dir(settings)
    typer.echo(f"roundtrip: starting the fleet (agent {agent.name})")
    fleet = Fleet(settings, executor_replicas=executors, say=typer.echo)
    try:
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


def _mark_folders(settings: Settings) -> None:
    """Leave the fleet's marker here and in its agent's project folder: commands run there find this fleet."""
    from pathlib import Path

    from roundtrip._cli.fleets import agent_project, mark

    written = mark([Path.cwd(), agent_project(settings.agent or "")], settings.state_dir)
    if written:
        folders = " and ".join(str(path.parent) for path in written)
        typer.echo(f"Commands run in {folders} (or below) talk to this fleet (marker {written[0].name}).")


def _say_ready(port: int | None, agent: Any, settings: Any) -> None:
    if port:
        typer.echo(
            "  health and metrics: "
            + ", ".join(f"{name} :{port + topology.index(name)}" for name in FLEET_SERVICES)
            + " (/healthz /readyz /metrics)"
        )
    typer.echo(_ready(agent, settings))


def _checked_agent(settings: Any) -> Any:
    """The agent the fleet will run, found and checked (its own settings too); one line and exit 1 if it cannot."""
    from roundtrip._kernel.settings import ConfigurationError
    from roundtrip._sdk.agent import current_agent

    try:
        return current_agent(settings.agent)
    except ConfigurationError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None


def _checked_keys(settings: Any, agent: Any) -> None:
    """Every service's keys as `roundtrip run` checks them; one line and exit 1 if one cannot."""
    from roundtrip._kernel.settings import ConfigurationError

    try:
        settings.refuse_unfit_keys("the fleet", ())  # a retired setting, whichever service it was meant for
        for declared in topology.SERVICES:
            settings.refuse_unfit_keys(declared.name, declared.keys, agent.holds_calls())
    except ConfigurationError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None


def _ready(agent: Any, settings: Any) -> str:
    """The banner once the fleet is up, with the agent's own example, else a greeting as a customer id of yours."""
    import json

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


@app.command()
def ask(
    text: Annotated[str, typer.Argument(help="what the customer writes")],
    customer: Annotated[str, typer.Option(help="customer id (the principal), e.g. cus_1001")],
    persona: Annotated[
        str | None,
        typer.Option(
            help="simulator persona: careful, careless, stubborn, sloppy, parallel, direct, ..., or script:NAME "
            "(script:example: the agent's example_script)"
        ),
    ] = None,
    conversation: Annotated[str | None, typer.Option(help="conversation id (default: a new one)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for the reply")] = 120.0,
    stream: Annotated[
        bool | None,
        typer.Option(
            "--stream/--no-stream", help="stream the reply's text as it is written (default: ROUNDTRIP_STREAM_REPLIES)"
        ),
    ] = None,
) -> None:
    """Publish one support request and show each step of its turn, then the reply (--conversation continues one).
    With --stream the text of each model call is shown as the model writes it (support.stream).

    A turn waiting for a person's approval is followed to its end: ask waits up to the approval deadline plus
    --timeout.

    Exit codes: 0 the model answered (end_turn); 1 no reply within --timeout; 2 not asked (a bad option, a
    script:NAME the simulator has not loaded, the fleet's topics missing); 3 the guard stopped the turn (step_limit,
    repeated_call, cycle, failure_streak, budget, deadline, cancelled, approval_timeout); 4 the model stopped without
    its answer (max_tokens, stop_sequence, refusal, model_context_window_exceeded, unknown_stop_reason); 5 model_error
    or model_busy; 6 the request was refused (conversation_refused, invalid_request).
    """
    from roundtrip._cli.terminal import ask as do_ask

    _check_persona(persona)
    settings = _fleet_settings()
    _hand_example_script(settings, persona)
    _check_script_loaded(settings, persona)
    code = asyncio.run(
        do_ask(settings, text, customer, persona, conversation or f"conv_{uuid.uuid4().hex[:12]}", timeout, stream)
    )
    raise typer.Exit(code)


@app.command()
def chat(
    customer: Annotated[str, typer.Option(help="customer id (the principal), e.g. cus_1001")],
    persona: Annotated[
        str | None, typer.Option(help="simulator persona for every request (or script:NAME, as for ask)")
    ] = None,
    conversation: Annotated[str | None, typer.Option(help="conversation id to continue (default: a new one)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for each reply")] = 120.0,
) -> None:
    """Hold a conversation: each line you type is the next request, with the steps of its turn and the reply."""
    from roundtrip._cli.terminal import chat as do_chat

    _check_persona(persona)
    settings = _fleet_settings()
    _hand_example_script(settings, persona)
    _check_script_loaded(settings, persona)
    code = asyncio.run(do_chat(settings, customer, persona, conversation or f"conv_{uuid.uuid4().hex[:12]}", timeout))
    raise typer.Exit(code)


def _fleet_settings() -> Settings:
    """The settings of the fleet this command talks to: the one running in the state folder (services/_fleet/state.py),
    else this shell's; which one is said on stderr, with the shell's variables that differ from the fleet's."""
    import os
    from pathlib import Path

    from roundtrip._cli.fleets import marked
    from roundtrip._fleet.state import adopt, running
    from roundtrip._kernel.database import shown

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


EXAMPLE_PERSONA = "script:example"


def _check_persona(persona: str | None) -> None:
    """Refuse a persona the simulator does not play before anything is published (no model call is spent on it): one
    of its personas, or script:NAME (a script it has loaded: services/_simulator/scripted.py)."""
    from roundtrip._simulator.personas import NAMES
    from roundtrip._simulator.scripted import PREFIX

    if persona is None or persona in NAMES or (persona.startswith(PREFIX) and persona[len(PREFIX) :].strip()):
        return
    raise typer.BadParameter(
        f"unknown persona {persona!r}; the simulator's personas are: {', '.join(NAMES)}, or {PREFIX}NAME (a script "
        "it plays: ROUNDTRIP_SIMULATOR_SCRIPT, or the agent's example_script as script:example)",
        param_hint="'--persona'",
    )


def _hand_example_script(settings: Any, persona: str | None) -> None:
    """Put the agent's example_script to the simulator when the request names it (script:example), so the banner's
    example plays with no API key however often the simulator restarted; one line and exit 2 when it cannot."""
    import httpx

    if persona != EXAMPLE_PERSONA or not settings.use_simulator:
        return
    agent = _checked_agent(settings)
    if not agent.example_script:
        return  # a script of that name loaded some other way, or the simulator says it has none
    url = f"{settings.model_base_url}/v1/_scripts/example"
    try:
        answer = httpx.put(url, json=list(agent.example_script), timeout=10)
    except httpx.HTTPError as exc:
        typer.secho(f"error: the simulator at {url} does not answer ({type(exc).__name__}); is the fleet up?", err=True)
        raise typer.Exit(2) from None
    if answer.status_code != 200:
        typer.secho(f"error: the simulator refused agent {agent.name}'s example_script: {answer.text}", err=True)
        raise typer.Exit(2)


def _check_script_loaded(settings: Any, persona: str | None) -> None:
    """Refuse a script:NAME the simulator has not loaded before the turn starts (else it ends model_error on a 400):
    one line naming the loaded ones, the simulator's own words; exit 2."""
    import httpx

    from roundtrip._simulator.scripted import PREFIX, missing

    if persona is None or not persona.startswith(PREFIX) or not settings.use_simulator:
        return
    url = f"{settings.model_base_url}/v1/_scripts"
    try:
        loaded = httpx.get(url, timeout=10).raise_for_status().json()["scripts"]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        typer.secho(
            f"error: the simulator at {url} does not list its scripts ({type(exc).__name__}); is the fleet up?",
            err=True,
        )
        raise typer.Exit(2) from None
    if persona[len(PREFIX) :] not in loaded:
        typer.secho(f"error: {missing(persona[len(PREFIX) :], loaded)}", err=True)
        raise typer.Exit(2)


@app.command("console")
def console_command() -> None:
    """Where the fleet's console is (approvals and turns in a browser) and whether it answers; `roundtrip up` starts it,
    `roundtrip run console` runs one alone."""
    import httpx

    settings = _fleet_settings()
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


@app.command()
def trace(turn_or_trace_id: Annotated[str, typer.Argument(help="turn id or trace id")]) -> None:
    """Show the spans of one turn as an indented timeline: from Jaeger (ROUNDTRIP_JAEGER_QUERY_URL) or span files."""
    from roundtrip._cli.terminal import show_trace

    raise typer.Exit(show_trace(_fleet_settings(), turn_or_trace_id))


@app.command("dead-letters")
def dead_letters(
    limit: Annotated[int, typer.Option(min=1, help="the last N dead letters")] = 20,
) -> None:
    """Show the messages no service could process, newest last, with the reason and whether each was handled.

    Each is marked waiting, re-driven or discarded (by whom, when, why) as the console's /dead-letters page recorded it.
    Exit code 2: the dead letters cannot be read."""
    from roundtrip._cli.terminal import show_dead_letters

    raise typer.Exit(asyncio.run(show_dead_letters(_fleet_settings(), limit)))


@app.command()
def lag(
    group: Annotated[
        str | None, typer.Option(help="only this consumer group (e.g. executor, or its full name)")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="one JSON document (per refresh with --watch)")] = False,
    watch: Annotated[float | None, typer.Option(help="refresh every SECONDS until Ctrl-C")] = None,
) -> None:
    """Each consumer group's lag per topic and partition (committed, log end, lag), totals and members."""
    from roundtrip._cli.terminal import show_lag

    if watch is not None and watch <= 0:
        raise typer.BadParameter("--watch takes a number of seconds > 0")
    settings = _fleet_settings()
    if group is not None and topology.find_group(group, settings.topic_prefix) is None:
        known = ", ".join(sorted(topology.groups(settings.topic_prefix)))
        raise typer.BadParameter(
            f"unknown consumer group {group!r}; the fleet's groups are: {known} "
            "(also without the topic prefix and roundtrip-)",
            param_hint="'--group'",
        )
    try:
        raise typer.Exit(asyncio.run(show_lag(settings, group, json_output, watch)))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command()
def config() -> None:
    """Print the effective configuration, grouped by concern (secrets hidden): the running fleet's, when one runs in
    the state folder, else this shell's."""
    from roundtrip._kernel.settings import ConfigurationError, display
    from roundtrip._sdk.agent import current_agent

    settings = _fleet_settings()
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


@app.command()
def keys(
    purpose: Annotated[
        str,
        typer.Argument(
            help="batch: the gate signs approved batches, executors and the guard verify; decision: the console and "
            "`roundtrip approvals` sign people's decisions, the gate and the guard verify"
        ),
    ],
    key_id: Annotated[
        str | None, typer.Option(help="the id the signatures name (default: the purpose and today's date)")
    ] = None,
) -> None:
    """Make a new Ed25519 key pair and print it as two settings: the private key line for the signer's Secret and
    the public key line for the verifiers (nothing is written anywhere else). Rotate by adding the new public key to
    the verify keys everywhere, then giving the signer the new private key, then dropping the old public key."""
    from roundtrip._cli.keys import Purpose, default_key_id, pair_lines

    if purpose not in tuple(Purpose):
        raise typer.BadParameter(f"unknown purpose {purpose!r}; choose batch or decision")
    try:
        lines = pair_lines(Purpose(purpose), key_id or default_key_id(Purpose(purpose)))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo("\n".join(lines))


@app.command()
def contracts() -> None:
    """Regenerate schemas/events/ (event JSON Schemas), contracts/ (AsyncAPI) and the manual's configuration reference
    (docs/reference/configuration.md) from the code, in a checkout."""
    from roundtrip._cli.contracts import NotACheckout, write

    try:
        written = write()
    except NotACheckout as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    for path in written:
        typer.echo(f"wrote {path}")


@turns_app.callback()
def turns(
    ctx: typer.Context,
    status: Annotated[
        str | None,
        typer.Option(
            help="running, stuck, waiting (a model call waits for the API's rate limits), awaiting (a call waits for "
            "a person's approval), ending (an end waiting for running calls) or ended"
        ),
    ] = None,
    customer: Annotated[str | None, typer.Option(help="only this customer's turns")] = None,
    limit: Annotated[int, typer.Option(help="most recent N turns")] = 30,
) -> None:
    """List running, stuck and ended turns with their trace ids (newest first)."""
    if ctx.invoked_subcommand is not None:
        return
    if status and status not in ("running", "stuck", "waiting", "awaiting", "ending", "ended"):
        raise typer.BadParameter("status must be running, stuck, waiting, awaiting, ending or ended")
    from roundtrip._cli.terminal import list_turns

    raise typer.Exit(asyncio.run(list_turns(_fleet_settings(), status, customer, limit)))


@conversations_app.callback()
def conversations(
    ctx: typer.Context,
    customer: Annotated[str | None, typer.Option(help="only this customer's conversations")] = None,
    limit: Annotated[int, typer.Option(help="most recently active N")] = 30,
) -> None:
    """List conversations (newest activity first) with their turns, history kept and when they expire."""
    if ctx.invoked_subcommand is not None:
        return
    from roundtrip._cli.terminal import list_conversations

    raise typer.Exit(asyncio.run(list_conversations(_fleet_settings(), customer, limit)))


@conversations_app.command("forget")
def conversations_forget(conversation_id: Annotated[str, typer.Argument(help="the conversation to erase")]) -> None:
    """Delete a conversation and its history now (a customer's right to erasure)."""
    from roundtrip._cli.terminal import forget_conversation

    raise typer.Exit(asyncio.run(forget_conversation(_fleet_settings(), conversation_id)))


@turns_app.command("cancel")
def turns_cancel(
    turn_id: Annotated[str, typer.Argument(help="the turn to stop")],
    reason: Annotated[str, typer.Option(help="recorded with the turn")] = "cancelled by an operator",
) -> None:
    """Stop a running turn now (a kill switch): the customer gets a polite reply."""
    from roundtrip._cli.terminal import cancel_turn

    raise typer.Exit(asyncio.run(cancel_turn(_fleet_settings(), turn_id, reason)))


def _me() -> str:
    import getpass
    import socket

    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # noqa: BLE001 - no user name: still a decision, by the host
        return f"operator@{socket.gethostname()}"


@approvals_app.callback()
def approvals(
    ctx: typer.Context,
    all_: Annotated[
        bool, typer.Option("--all", help="every approval, decided ones too (who decided and when)")
    ] = False,
    limit: Annotated[int, typer.Option(help="most recent N")] = 30,
) -> None:
    """List the calls waiting for a person's approval (who, what, why, deadline, trace id)."""
    if ctx.invoked_subcommand is not None:
        return
    from roundtrip._cli.terminal import list_approvals

    raise typer.Exit(asyncio.run(list_approvals(_fleet_settings(), all_, limit)))


@approvals_app.command("approve")
def approvals_approve(
    approval_id: Annotated[str, typer.Argument(help="the approval (roundtrip approvals lists them)")],
    by: Annotated[str | None, typer.Option(help="who decides (default: user@host)")] = None,
    reason: Annotated[str, typer.Option(help="kept with the turn")] = "",
) -> None:
    """Approve one waiting call: it runs once, with exactly the arguments shown, and the turn goes on."""
    from roundtrip._cli.terminal import decide

    raise typer.Exit(asyncio.run(decide(_fleet_settings(), approval_id, True, reason, by or _me())))


@approvals_app.command("deny")
def approvals_deny(
    approval_id: Annotated[str, typer.Argument(help="the approval (roundtrip approvals lists them)")],
    reason: Annotated[str, typer.Option(help="why: the model is told and explains it to the customer")],
    by: Annotated[str | None, typer.Option(help="who decides (default: user@host)")] = None,
) -> None:
    """Deny one waiting call: it never runs; the model gets an error result with the reason and goes on."""
    from roundtrip._cli.terminal import decide

    raise typer.Exit(asyncio.run(decide(_fleet_settings(), approval_id, False, reason, by or _me())))


@topics_app.command("create")
def topics_create(
    partitions: Annotated[int | None, typer.Option(help="partitions per topic (default ROUNDTRIP_PARTITIONS)")] = None,
    executor_partitions: Annotated[int | None, typer.Option(help="partitions of the executor topic")] = None,
) -> None:
    """Create every topic of the fleet; topics that exist are left alone (or grown to more partitions)."""
    from roundtrip._kernel.kafka.admin import ensure_topics
    from roundtrip._kernel.kafka.clients import kafka_clients

    s = get_settings()
    report = asyncio.run(
        ensure_topics(
            kafka_clients(s),
            s.topic_prefix,
            partitions or s.partitions,
            executor_partitions or s.executor_partitions,
            s.replication_factor,
            min_insync_replicas=s.min_insync_replicas,
        )
    )
    typer.echo(str(report))
    for name in report.created:
        typer.echo(f"  created {name}")


@topics_app.command("wait")
def topics_wait(
    service: Annotated[str, typer.Argument(help=f"the service whose topics: one of {', '.join(FLEET_SERVICES)}")],
    timeout: Annotated[float, typer.Option(help="seconds to wait before giving up (exit code 1)")] = 600.0,
) -> None:
    """Wait until the topics SERVICE's principal is granted (`roundtrip acls --only SERVICE`) exist and it may see
    them: a service's first step where a setup job, not the service's own user, makes the ACLs and the topics."""
    from roundtrip._kernel.kafka.acls import for_service
    from roundtrip._kernel.kafka.admin import wait_for_topics
    from roundtrip._kernel.kafka.clients import kafka_clients

    if service not in FLEET_SERVICES:
        raise typer.BadParameter(f"unknown service {service!r}; choose one of {', '.join(FLEET_SERVICES)}")
    s = get_settings()
    # the shared dead letters of older fleets are read where they exist; nothing makes them any more
    legacy = s.topic_prefix + topics.DEAD_LETTERS
    granted = for_service(topology.service(service), s.topic_prefix)
    names = [a.name for a in granted if a.kind == "topic" and a.name != legacy]
    away = asyncio.run(wait_for_topics(kafka_clients(s), names, timeout))
    if away:
        why = {3: "no such topic", 29: "not authorized"}
        missing = ", ".join(
            f"{name} ({why.get(code, f'error {code}' if code else 'no leader')})" for name, code in away.items()
        )
        typer.secho(
            f"error: after {timeout:g} s {service} still cannot see {missing}: have the ACLs and the topics been made "
            "(`roundtrip acls --apply` and `roundtrip topics create`; in Kubernetes the roundtrip-kafka-setup Job)?",
            fg="red",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"topics: the {len(names)} of {service} are there")


@app.command()
def acls(
    principal: Annotated[
        str, typer.Option(help="each principal, {name} standing for the service (or operator, app)")
    ] = "User:roundtrip-{name}",
    only: Annotated[
        str | None, typer.Option("--only", help="just this principal's: a service, operator or app")
    ] = None,
    app_group: Annotated[
        str | None, typer.Option(help="also the user's app, reading replies in this consumer group")
    ] = None,
    command_config: Annotated[
        str | None, typer.Option(help="the admin client's properties file, passed on to kafka-acls.sh")
    ] = None,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="add them through the admin API instead, as the principal of the "
            "ROUNDTRIP_KAFKA_* settings (one allowed to alter ACLs)",
        ),
    ] = False,
) -> None:
    """Print the Kafka ACLs each service's principal needs, and nothing more (derived from the topology), as
    kafka-acls.sh commands: one principal per service, plus the operator's (these commands) and the app's.
    `--apply` adds them to the cluster instead."""
    from roundtrip._kernel.kafka.acls import apply as apply_acls
    from roundtrip._kernel.kafka.acls import derive, render
    from roundtrip._kernel.kafka.clients import kafka_clients

    s = get_settings()
    derived = derive(s.topic_prefix, principal, app_group)
    if only is not None:
        if only not in derived:
            raise typer.BadParameter(f"no principal {only!r}; known: {', '.join(derived)}", param_hint="--only")
        derived = {only: derived[only]}
    if not apply:
        typer.echo(render(derived, s.bootstrap_servers, command_config), nl=False)
        return

    async def add() -> int:
        admin = kafka_clients(s).admin(client_id="roundtrip-acls")
        await admin.start()
        try:
            return await apply_acls(admin, derived)
        finally:
            await admin.close()

    try:
        added = asyncio.run(add())
    except ValueError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{added} ACL bindings added for {', '.join(derived)} at {s.bootstrap_servers}")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Bring the ledger's and the conversations' tables to this code's revision (ROUNDTRIP_LEDGER_DATABASE_URL,
    ROUNDTRIP_CONVERSATIONS_DATABASE_URL); a database made before migrations is adopted, rows kept.
    Idempotent, and safe when several run at once."""
    from roundtrip._kernel.migrations.schema import upgrade_databases

    for line in upgrade_databases(get_settings()):
        typer.echo(line)


@db_app.command("current")
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


@db_app.command("roles")
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


@broker_app.command("fetch")
def broker_fetch() -> None:
    """Fetch the Kafka jars from Maven Central into the cache (once)."""
    from roundtrip._broker.embedded import fetch_configured

    typer.echo(str(fetch_configured(get_settings(), progress=typer.echo)))


@broker_app.command("run")
def broker_run() -> None:
    """Run the embedded broker in the foreground."""
    from roundtrip._broker.embedded import main as broker_main

    raise typer.Exit(broker_main(["run"]))


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
