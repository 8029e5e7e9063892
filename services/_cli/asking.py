"""`roundtrip ask` and `chat`: a customer's request published and its turn followed (following.py shows it), with
the persona the simulator plays checked before anything is published."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import Annotated

import typer

from roundtrip._cli.fleets import FleetOption
from roundtrip._kernel.settings import Settings


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
    fleet: FleetOption = None,
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
    from roundtrip._cli.common import fleet_settings
    from roundtrip._cli.following import ask as do_ask

    _check_persona(persona)
    settings = fleet_settings(fleet)
    hand_example_script(settings, persona)
    check_scripts_loaded(settings, [persona])
    code = asyncio.run(
        do_ask(settings, text, customer, persona, conversation or f"conv_{uuid.uuid4().hex[:12]}", timeout, stream)
    )
    raise typer.Exit(code)


def chat(
    customer: Annotated[str, typer.Option(help="customer id (the principal), e.g. cus_1001")],
    persona: Annotated[
        str | None, typer.Option(help="simulator persona for every request (or script:NAME, as for ask)")
    ] = None,
    conversation: Annotated[str | None, typer.Option(help="conversation id to continue (default: a new one)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for each reply")] = 120.0,
    fleet: FleetOption = None,
) -> None:
    """Hold a conversation: each line you type is the next request, with the steps of its turn and the reply."""
    from roundtrip._cli.common import fleet_settings
    from roundtrip._cli.following import chat as do_chat

    _check_persona(persona)
    settings = fleet_settings(fleet)
    hand_example_script(settings, persona)
    check_scripts_loaded(settings, [persona])
    code = asyncio.run(do_chat(settings, customer, persona, conversation or f"conv_{uuid.uuid4().hex[:12]}", timeout))
    raise typer.Exit(code)


def unknown_persona(persona: str) -> str | None:
    """Why the simulator cannot play `persona`: None for one of its personas, or script:NAME (a script it has loaded:
    services/_simulator/scripted.py)."""
    from roundtrip._simulator.personas import NAMES
    from roundtrip._simulator.scripted import PREFIX

    if persona in NAMES or (persona.startswith(PREFIX) and persona[len(PREFIX) :].strip()):
        return None
    return (
        f"unknown persona {persona!r}; the simulator's personas are: {', '.join(NAMES)}, or {PREFIX}NAME (a script "
        "it plays: ROUNDTRIP_SIMULATOR_SCRIPT, or the agent's example_script as script:example)"
    )


def _check_persona(persona: str | None) -> None:
    """Refuse a persona the simulator does not play before anything is published (no model call is spent on it)."""
    if persona is not None and (why := unknown_persona(persona)):
        raise typer.BadParameter(why, param_hint="'--persona'")


def hand_example_script(settings: Settings, persona: str | None) -> None:
    """Put the agent's example_script to the simulator when the request names it (script:example), so the banner's
    example plays with no API key however often the simulator restarted; one line and exit 2 when it cannot."""
    import httpx

    from roundtrip._cli.common import EXAMPLE_PERSONA, checked_agent

    if persona != EXAMPLE_PERSONA or not settings.use_simulator:
        return
    agent = checked_agent(settings)
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


def check_scripts_loaded(settings: Settings, personas: Iterable[str | None]) -> None:
    """Refuse a script:NAME the simulator has not loaded before any turn starts (else it ends model_error on a 400):
    one line naming the loaded ones, the simulator's own words; exit 2."""
    import httpx

    from roundtrip._simulator.scripted import PREFIX, missing

    wanted = [p[len(PREFIX) :] for p in personas if p is not None and p.startswith(PREFIX)]
    if not wanted or not settings.use_simulator:
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
    for name in wanted:
        if name not in loaded:
            typer.secho(f"error: {missing(name, loaded)}", err=True)
            raise typer.Exit(2)
