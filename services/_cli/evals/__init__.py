"""`roundtrip eval run|record`: a suite of conversations through the running fleet, and a conversation made a case.
What the commands need is imported when they run."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from roundtrip._cli.fleets import FleetOption

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from roundtrip._cli.evals.cases import Case
    from roundtrip._cli.evals.report import Change
    from roundtrip._cli.evals.runner import CaseResult
    from roundtrip._kernel.settings import Settings
    from roundtrip._sdk.agent import Agent

VersionOption = Annotated[
    str | None,
    typer.Option(
        help="run every case's conversations on this agent version of the fleet (`default`: the default one), whatever "
        "its share of new conversations; a turn that ran on another version fails its case"
    ),
]
eval_app = typer.Typer(
    help="Evaluations: run a suite of conversation cases through the fleet, or record a conversation as a case.",
    no_args_is_help=True,
)


def _fleet_and_agent(suite: Path, fresh: bool, fleet: Path | None) -> tuple[Settings, Agent]:
    """The fleet the cases run through and its agent: refused when the suite is another agent's; reset with --fresh."""
    from roundtrip._cli.common import checked_agent, fleet_settings

    settings = fleet_settings(fleet)
    agent = checked_agent(settings)
    _refuse_other_agent(suite, agent.name, settings.state_dir)
    if fresh:
        _reset(agent, settings)
    return settings, agent


def _check_personas(settings: Settings, cases: list[Case]) -> None:
    """A case's script:NAME the simulator has not loaded is refused before any turn, in ask's words (exit 2); the
    agent's example_script is handed to it first when a case names script:example, as ask does."""
    from roundtrip._cli.asking import check_scripts_loaded, hand_example_script

    personas = sorted({p for case in cases for turn in case.turns if (p := turn.persona)})
    for persona in personas:
        hand_example_script(settings, persona)
    check_scripts_loaded(settings, personas)


def _reset(agent: Agent, settings: Settings) -> None:
    """--fresh: the agent's reset hook, before any case, so a suite that changes data passes run after run."""
    import inspect

    if agent.reset is None:
        typer.secho(
            f"error: agent {agent.name} has no reset hook (Agent(reset=...)), so --fresh cannot put its backends back",
            fg="red",
            err=True,
        )
        raise typer.Exit(2)
    try:
        done = agent.reset(settings, agent.own_settings)
        if inspect.isawaitable(done):
            asyncio.run(_awaited(done))
    except Exception as exc:  # noqa: BLE001 - the author's code: what it raised, in one line
        typer.secho(f"error: agent {agent.name}'s reset failed: {type(exc).__name__}: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"roundtrip eval: agent {agent.name}'s backends reset (--fresh)")


async def _awaited(done: Awaitable[object]) -> None:
    await done


def _refuse_other_agent(suite: Path, running: str, state_dir: Path) -> None:
    """Cases in an agent's project are that agent's: against a fleet running another one they would all fail, or
    worse pass by chance; one line and exit 2 instead."""
    from roundtrip._cli.fleets import declared_agents

    declared = declared_agents(suite)
    if declared is None or running in declared[1]:
        return
    pyproject, names = declared
    typer.secho(
        f"error: the cases in {suite} are agent {' or '.join(names)}'s ({pyproject}), but the fleet of "
        f"{state_dir.resolve()} runs agent {running}; start theirs (ROUNDTRIP_AGENT={names[0]} roundtrip up) or name "
        "its state folder with ROUNDTRIP_STATE_DIR",
        fg="red",
        err=True,
    )
    raise typer.Exit(2)


@eval_app.command("run")
def run(
    suite: Annotated[list[Path], typer.Argument(help="case files (JSON), or folders of them")],
    runs: Annotated[int | None, typer.Option(help="run every case this many times (default: each case's runs)")] = None,
    baseline: Annotated[
        Path | None, typer.Option(help="compare with this saved baseline: a drop of a pass rate fails the run")
    ] = None,
    save_baseline: Annotated[Path | None, typer.Option(help="write this run's results as a baseline here")] = None,
    junit: Annotated[Path | None, typer.Option(help="write JUnit XML here (one testcase per case), for CI")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for each turn's reply")] = 120.0,
    concurrency: Annotated[int, typer.Option(help="runs in flight at once (each its own conversation)")] = 4,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="first put the agent's backends back to a known state (Agent(reset=...))")
    ] = False,
    version: VersionOption = None,
    fleet: FleetOption = None,
) -> None:
    """Run each case's conversation through the running fleet as a user's app would (support.requests, then its
    reply and its turn's events from the topics): against the real model when ANTHROPIC_API_KEY is set, else the
    simulator, which plays each turn's script (or persona). Then a table of the cases (pass rate, outcome, steps,
    tools, cost), the cost and tokens in all, and what changed against --baseline. With --fresh the agent's reset
    hook (Agent(reset=...)) first puts its backends back to a known state, so a suite that changes data passes run
    after run.

    Exit codes: 0 every case passed (with --baseline: none regressed); 1 a case failed (with --baseline: a pass rate
    dropped or a new case fails); 2 not run (a wrong case file, the fleet down, --fresh failing, a script unloaded)."""
    from roundtrip._cli.evals.cases import CaseError, load_suite
    from roundtrip._cli.evals.report import changes, load_baseline
    from roundtrip._cli.evals.report import junit as junit_xml
    from roundtrip._cli.evals.report import save_baseline as save
    from roundtrip._cli.evals.runner import FleetUnavailable, run_suite

    if (runs is not None and runs < 1) or concurrency < 1:
        raise typer.BadParameter("--runs and --concurrency take a number of at least 1")
    try:
        cases = load_suite(suite)
        before = load_baseline(baseline) if baseline else None
    except (CaseError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    if runs is not None:
        cases = [replace(case, runs=runs) for case in cases]
    settings, agent = _fleet_and_agent(suite[0], fresh, fleet)
    _check_personas(settings, cases)
    model = "the simulator" if settings.use_simulator else f"the model {agent.model_for(settings)}"
    typer.echo(f"roundtrip eval: {len(cases)} cases against {_against(agent.name, version)} and {model}")
    try:
        results = asyncio.run(run_suite(settings, version, cases, agent.own_settings, timeout, concurrency, _said))
    except FleetUnavailable as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    changed = changes(results, before) if before is not None else []
    _report(results, changed, before is not None)
    if save_baseline:
        save(save_baseline, results)
        typer.echo(f"baseline written to {save_baseline}")
    if junit:
        junit.write_text(junit_xml(results, suite[0].stem if len(suite) == 1 else "eval"), encoding="utf-8")
        typer.echo(f"JUnit XML written to {junit}")
    failed = any(c.regression for c in changed) if before is not None else any(not r.passed for r in results)
    raise typer.Exit(1 if failed else 0)


def _against(agent: str, version: str | None) -> str:
    """What the cases run against, in words: the fleet's agent, or the agent version `--version` names."""
    from roundtrip._kernel.storage.versions import named, shown

    return f"agent {agent}" if version is None else f"agent version {shown(named(version))} of the fleet"


def _said(result: CaseResult) -> None:
    """A line as each case's runs are in."""
    mark = "skip" if result.skipped else ("pass" if result.passed else "FAIL")
    typer.echo(f"  {mark}  {result.case.name}" + (f" ({result.skipped})" if result.skipped else ""))


def _report(results: list[CaseResult], changed: list[Change], compared: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from roundtrip._cli.evals.report import summary, totals

    console = Console(highlight=False, emoji=False, width=200)
    table = Table(box=None, pad_edge=False)
    for column in ("case", "result", "passed", "outcome", "steps", "tools", "cost $"):
        table.add_column(column)
    for result in results:
        if result.skipped:
            table.add_row(escape(result.case.name), "skipped", "-", "-", "-", result.skipped, "-", style="dim")
            continue
        said = summary(result)
        table.add_row(
            escape(result.case.name),
            "[green]pass[/]" if result.passed else "[red]FAIL[/]",
            f"{sum(r.passed for r in result.runs)}/{len(result.runs)}",
            said["outcome"],
            f"{said['steps']:g}",
            ", ".join(said["tools"]) or "-",
            f"{said['cost_usd']:.4f}",
        )
    console.print()
    console.print(table)
    for result in results:
        for i, run in enumerate(result.runs):
            for reason in run.failures:
                console.print(f"[red]{escape(result.case.name)}[/] run {i + 1} ({run.conversation}): {escape(reason)}")
    count = totals(results)
    console.print(
        f"\n{count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped of {count['cases']} cases "
        f"({count['runs']} runs); cost ${count['cost_usd']:.4f}, {count['input_tokens']} input and "
        f"{count['output_tokens']} output tokens"
    )
    if compared:
        if not changed:
            console.print("against the baseline: no change")
        for change in changed:
            mark = "[red]regression[/]" if change.regression else "changed"
            console.print(f"{mark}  {escape(change.case)}: {escape(change.said)}")


@eval_app.command("record")
def record(
    conversation: Annotated[str, typer.Argument(help="the conversation (roundtrip conversations lists them)")],
    out: Annotated[Path | None, typer.Option(help="write the case here (default: print it)")] = None,
    fleet: FleetOption = None,
) -> None:
    """Turn a conversation the fleet has had into a case that replays it: each turn the customer's words, the model's
    responses as a script, and what the turn did as expectations (outcome, tools called, steps)."""
    from roundtrip._cli.common import fleet_settings
    from roundtrip._cli.evals.cases import case_json
    from roundtrip._cli.evals.record import NotRecorded
    from roundtrip._cli.evals.record import record as make

    try:
        case, notes = asyncio.run(make(fleet_settings(fleet), conversation))
    except NotRecorded as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    for note in notes:
        typer.secho(f"note: {note}", fg="yellow", err=True)
    if out is None:
        typer.echo(case_json(case), nl=False)
        return
    out.write_text(case_json(case), encoding="utf-8")
    typer.echo(f"case written to {out} ({len(case['turns'])} turns)")
