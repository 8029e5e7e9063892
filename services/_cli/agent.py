"""`roundtrip agent check|init`: what an agent author runs before the fleet does. What they need is imported when
they run, not when `roundtrip` starts."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from roundtrip._sdk.agent import CHECKS, Agent

if TYPE_CHECKING:
    from roundtrip._sdk.agent import Agent

agent_app = typer.Typer(
    help="Your own agent: check one offline, or start a new one from a skeleton.", no_args_is_help=True
)


def summary(agent: Agent) -> str:
    """One line saying what a sound agent declares."""
    registry = agent.registry
    kinds = sorted({kind for spec in registry.specs.values() for kind in spec.entity_refs.values()})
    return (
        f"agent {agent.name}: ok: {len(registry)} tools ({', '.join(registry.names)}), entity kinds {kinds}, "
        f"{len(agent.policies)} policies, {len(agent.approvals)} approval rules, digest {agent.digest}"
    )


@agent_app.command("check")
def check(
    agent: Annotated[
        str | None,
        typer.Argument(
            help="package.module:attribute or an entry point name (default: ROUNDTRIP_AGENT; unset: the demo shop's)"
        ),
    ] = None,
    offline: Annotated[
        bool, typer.Option("--offline", help="do not ask the agent's MCP servers what they list")
    ] = False,
) -> None:
    """Load an agent offline (nothing is connected, no dependency is made) and list every problem of it: tool
    documents that break schemas/tool.json (one line each: the file, the JSON path, the rule), tools without a handler,
    entity kinds without a resolver, policies, approval rules or serial declarations for unknown tools, an empty prompt,
    a bad name, replies for unknown outcomes, invalid own settings.

    Exit status 1 when there is any problem (or the agent cannot be found), 0 with a one-line summary when it fits
    together. The current folder is on the import path (as for uvicorn), so a package not installed yet is found.
    An agent with MCP servers also has each server asked once what it lists (unless --offline): a server that does not
    answer, a server that refuses the credentials the agent gives it (named by kind and source, never their value), a
    tool the agent declares or annotates that it does not list, a listed schema that does not fit."""
    from roundtrip._kernel.settings import get_settings
    from roundtrip._sdk.agent import AgentError, load_agent

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    spec = agent or get_settings().agent
    try:
        found = load_agent(spec, check=False)
    except AgentError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    problems = found.problems()
    if not problems and found.mcp_sources and not offline:
        problems = asyncio.run(_asked(found))
    if problems:
        typer.echo(f"agent {found.name!r}: {len(problems)} problem{'s' * (len(problems) != 1)}")
        for problem in problems:
            typer.echo(f"  - {problem}")
        raise typer.Exit(1)
    typer.echo(summary(found))


async def _asked(agent: Agent) -> list[str]:
    try:
        return await agent.toolbox.problems()
    finally:
        await agent.toolbox.aclose()


@agent_app.command("init")
def init(
    name: Annotated[str, typer.Argument(help="the agent's name, e.g. acme-support (its package: acme_support)")],
    folder: Annotated[Path, typer.Option("--dir", help="where to make the NAME folder")] = Path("."),
) -> None:
    """Write a working skeleton of a new agent package into DIR/NAME: its pyproject.toml (an entry point in the group
    roundtrip.agents, package data for its JSON tool documents), a tool as a Python function and one as a JSON Schema
    document whose entity the agent's resolver checks for the caller, a policy, a backend in a SQLite file as its
    dependency (the gate's and the executor's processes share it), a Dockerfile on the fleet's image, tests of its
    turns (on roundtrip.testing; pytest in its `test` extra), an example the simulator plays with no API key, and two
    evaluation cases (roundtrip eval run evals). An existing folder that is not empty is left alone (exit status 1)."""
    from roundtrip._cli.help import this_command
    from roundtrip._cli.skeleton import package_name, skeleton

    try:
        files = skeleton(name, python=sys.executable, roundtrip=this_command())  # its README's: this venv's
    except ValueError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    target = folder / name
    if target.exists() and any(target.iterdir()):
        typer.secho(f"error: {target} exists and is not empty; nothing was written", fg="red", err=True)
        raise typer.Exit(1)
    for relative, text in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        typer.echo(f"  created {path}")
    cli = this_command()
    typer.echo(
        f"Next: cd {target} && {sys.executable} -m pip install -e '.[test]' && {sys.executable} -m pytest; "
        f"{cli} agent check {package_name(name)}.agent:AGENT; run it with ROUNDTRIP_AGENT={name} {cli} up and "
        f"try its conversations with {cli} eval run evals; its Dockerfile adds it to the fleet's image"
    )


def example_script_problems(agent: Agent) -> list[str]:
    """The example the simulator plays with no key (`roundtrip up`'s banner) is a script it can play, of this agent's
    tools: else `roundtrip ask` with it fails at the simulator, after the fleet is up."""
    if not agent.example_script:
        return []
    from roundtrip._simulator.scripted import ScriptError, parse_script

    try:
        replies = parse_script("example_script", list(agent.example_script))
    except ScriptError as exc:
        return [str(exc).replace("script 'example_script'", "example_script", 1)]
    called = {block["name"] for reply in replies for block in reply.content if block["type"] == "tool_use"}
    return [f"example_script calls {name}, not a tool of this agent" for name in sorted(called - agent.offered)]


# the SDK knows no simulator: the fleet's command line, which does, adds this check of the agent's example
CHECKS.append(example_script_problems)
