"""The README and the manual (docs/) must say what the code does: the configuration reference, topics, commands,
the ask example and the contract's reply; every old README section has a home in the manual."""

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from roundtrip._cli.main import app
from roundtrip._kernel.settings import CONCERNS, Settings, env_name
from roundtrip._kernel.wire import topology
from tests.prices import price_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
MANUAL = "\n".join(path.read_text() for path in sorted(DOCS.rglob("*.md")))
CONFIGURATION = (DOCS / "reference" / "configuration.md").read_text()


def test_every_setting_is_documented_under_its_concern():
    configuration = CONFIGURATION
    sections = {part.split("\n", 1)[0]: part for part in configuration.split("\n## ")[1:]}
    assert list(sections) == [concern.heading for concern in CONCERNS]  # the headings `roundtrip config` prints
    for concern in CONCERNS:
        for name in concern.model_fields:
            assert f"| `{env_name(name)}` |" in sections[concern.heading], (concern.heading, env_name(name))
    documented = [line for line in configuration.splitlines() if line.startswith("| `")]
    assert len(documented) == len(Settings.model_fields)  # each once


def test_every_topic_is_documented():
    for name in topology.topic_names():
        assert f"`{name}`" in MANUAL, name


def test_the_two_commands_exist_and_every_cli_command_is_documented():
    assert "bash scripts/up.sh" in README and "bash scripts/test.sh" in README
    for script in ("scripts/up.sh", "scripts/test.sh", "scripts/setup.sh", ".ci/run"):
        assert (Path(__file__).resolve().parents[2] / script).exists()
    cli = (DOCS / "reference" / "cli.md").read_text()
    for command in app.registered_commands:
        assert f"roundtrip {command.name or command.callback.__name__}" in cli
    for group in app.registered_groups:
        assert f"roundtrip {group.name}" in cli


def test_help_tells_the_truth():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for word in ("up", "run", "ask", "turns", "trace", "topics", "broker", "contracts", "config"):
        assert word in result.output
    bad = CliRunner().invoke(app, ["run", "nonsense"])
    assert bad.exit_code != 0 and "unknown service" in bad.output


def ask_example() -> tuple[str, list[str]]:
    """The README's first `roundtrip ask` (its arguments) and the output it shows, line by line."""
    section = README.split("\n## The two commands\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    command = next(body for lang, body in blocks if " ask " in body)
    shown = next(body for lang, body in blocks if not lang)
    return command.strip().split(" ask ", 1)[1], shown.rstrip("\n").splitlines()


def matches_example(example: str, real: str) -> bool:
    """A real line reads as the README's: the same words, but where the README cuts it (`...`) and its ids."""

    def part(text: str) -> str:
        if text == "...":
            return ".*"
        if re.fullmatch(r"turn_[0-9a-f]+", text):
            return r"turn_[0-9a-f]+"
        return r"[0-9a-f]{32}" if re.fullmatch(r"[0-9a-f]{32}", text) else re.escape(text)

    pieces = re.split(r"(turn_[0-9a-f]+|\b[0-9a-f]{32}\b|\.\.\.$)", example.strip())
    return re.fullmatch("".join(part(p) for p in pieces), real.strip()) is not None


def test_the_readme_ask_example_reads_as_the_console_prints_it():
    from roundtrip._cli import common, following
    from roundtrip._kernel.wire.events import Outcome, SupportReply, Usage

    args, shown = ask_example()
    assert args == '"cancel my last order" --customer cus_1001'
    reply_line = next(line for line in shown if line.startswith("reply ("))
    figures = [int(n) for n in re.findall(r"\d+", reply_line)]
    steps, usage = (
        figures[0],
        Usage(
            input_tokens=figures[1],
            output_tokens=figures[2],
            cache_creation_input_tokens=figures[3],
            cache_read_input_tokens=figures[4],
        ),
    )
    turn_id, trace_id = re.search(r"turn (turn_\w+)  trace (\w+)", shown[-1]).groups()
    with common.console.capture() as captured:
        following.show_reply(
            SupportReply(
                request_id="r",
                conversation_id="c",
                customer_id="cus_1001",
                turn_id=turn_id,
                text=shown[-2],
                outcome=Outcome.END_TURN,
                steps=steps,
                usage=usage,
                cost_usd=0.0,
                trace_id=trace_id,
            )
        )
    printed = [line for line in captured.get().splitlines() if line.strip()]
    assert printed == [line for line in shown[-3:]], printed
    # the contract section's reply is that same turn: its figures, and their cost at the default prices
    contract = (DOCS / "contract.md").read_text()
    example = json.loads(re.findall(r"```json\n(.*?)```", contract, re.S)[1])
    assert Usage(**example["usage"]) == usage and example["steps"] == steps
    assert example["cost_usd"] == round(price_table(Settings(_env_file=None).prices).cost("any", usage), 4)
    assert all(matches_example(line, line) for line in shown)


def test_no_blank_line_splits_a_table_of_the_readme_or_the_manual():
    """A blank line inside a Markdown table ends it: the rows after it render as a paragraph of pipes."""
    for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        lines = path.read_text().splitlines()
        split = [
            i + 1
            for i in range(1, len(lines) - 1)
            if not lines[i].strip() and lines[i - 1].startswith("|") and lines[i + 1].startswith("|")
        ]
        assert not split, f"blank lines splitting a table at {path.relative_to(ROOT)} lines {split}"


def test_config_names_the_api_key_as_the_docs_do(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
    monkeypatch.setenv(
        "ROUNDTRIP_STATE_DIR", "/nonexistent/roundtrip-state"
    )  # no fleet runs there: this shell's settings
    from roundtrip._kernel.settings import get_settings

    get_settings.cache_clear()
    try:
        shown = CliRunner().invoke(app, ["config"])
    finally:
        get_settings.cache_clear()
    assert shown.exit_code == 0, shown.output
    (line,) = [line for line in shown.stdout.splitlines() if line.startswith("ANTHROPIC_API_KEY")]
    assert line.split() == ["ANTHROPIC_API_KEY", "***"] and "sk-ant-secret" not in shown.output
    assert "| `ANTHROPIC_API_KEY` |" in CONFIGURATION


# Where each of the old README's sections lives now (issue 30: nothing it said is lost): heading -> manual page.
OLD_SECTIONS = {
    "The two commands": "getting-started.md",
    "Demo scenarios": "getting-started.md",
    "Topology": "architecture.md",
    "The public contract": "contract.md",
    "Layout": "architecture.md",
    "CLI": "reference/cli.md",
    "The guard": "guard.md",
    "Conversations": "conversations.md",
    "When things go wrong": "guarantees.md",
    "The turn fence: nothing runs after a turn has ended": "guarantees.md",
    "Chaos suite": "guarantees.md",
    "Carrying load": "operating/scaling.md",
    "Your own agent": "agent/index.md",
    "From zero to your own tool in the fleet": "agent/index.md",
    "What an agent declares": "agent/index.md",
    "Loading, and a rolling upgrade": "agent/index.md",
    "The simulator plays your agent: scripted mode": "agent/testing.md",
    "The demo shop agent's own settings": "agent/index.md",
    "MCP tools": "agent/tools.md",
    "Tools as Python functions": "agent/tools.md",
    "Check it, start one, test it": "agent/testing.md",
    "Approvals by a person, and parallel use": "approvals.md",
    "Scaling executors": "operating/scaling.md",
    "Operating it": "operating/index.md",
    "Migrations": "operating/migrations.md",
    "Tracing": "operating/tracing.md",
    "Configuration": "reference/configuration.md",
    "Tests": "contributing.md",
    "Benchmarks": "benchmarks.md",
}


def test_every_section_of_the_old_readme_has_a_home_in_the_manual():
    import re

    for heading, page in OLD_SECTIONS.items():
        text = (DOCS / page).read_text()
        wanted = "Configuration reference" if heading == "Configuration" else heading
        assert re.search(rf"^#+ {re.escape(wanted)}", text, re.M), f"{heading!r} is not a heading of docs/{page}"


def test_every_page_of_the_manual_is_in_the_navigation():
    import yaml

    def pages(entries):
        for entry in entries:
            for value in entry.values() if isinstance(entry, dict) else [entry]:
                yield from (pages(value) if isinstance(value, list) else [value])

    nav = set(pages(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)["nav"]))
    on_disk = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    assert on_disk == nav, f"pages outside the navigation: {sorted(on_disk - nav)}; missing: {sorted(nav - on_disk)}"


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= 300


def _code_blocks(language: str) -> list[tuple[str, str]]:
    """(where, code) of every ```language block of the README and the manual."""
    import re

    found = []
    for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for match in re.finditer(rf"^```{language}\n(.*?)^```", path.read_text(), re.S | re.M):
            found.append((str(path.relative_to(ROOT)), match.group(1)))
    return found


def test_every_python_block_of_the_readme_and_the_manual_compiles():
    blocks = _code_blocks("python")
    assert blocks
    for where, code in blocks:
        compile(code, where, "exec")


def test_the_readme_ten_line_agent_is_an_agent_that_checks():
    where, code = next((w, c) for w, c in _code_blocks("python") if w == "README.md" and "Agent(" in c)
    namespace: dict = {}
    exec(compile(code, where, "exec"), namespace)
    agent = namespace["AGENT"]
    assert agent.problems() == [], agent.problems()


def test_every_roundtrip_command_in_a_shell_block_is_a_real_command():
    import re

    commands = {command.name or command.callback.__name__ for command in app.registered_commands}
    commands |= {group.name for group in app.registered_groups}
    unknown = []
    for where, code in _code_blocks("(?:bash|sh|console)"):
        for word in re.findall(r"(?:^|[\s/])roundtrip ([a-z][a-z-]*)", code):
            if word not in commands:
                unknown.append(f"{where}: roundtrip {word}")
    assert not unknown, f"commands that do not exist: {unknown}"


def test_every_metric_is_documented():
    """Each roundtrip_* metric the code defines is in the manual's table (the module's docstring points there)."""
    from prometheus_client import Counter, Gauge, Histogram

    from roundtrip._kernel.observability import metrics

    defined = [m for m in vars(metrics).values() if isinstance(m, (Counter, Gauge, Histogram))]
    names = [m.describe()[0].name + ("_total" if isinstance(m, Counter) else "") for m in defined]
    assert len(names) >= 15, names
    assert [name for name in names if f"`{name}`" not in MANUAL] == []


def test_the_benchmarks_page_is_todays_figures_each_with_its_command():
    """docs/benchmarks.md holds the latest figures only (their history is docs/benchmarks-archive.md): short, and each
    figure of its summary names the command that reproduces it."""
    page = (DOCS / "benchmarks.md").read_text()
    assert len(page.splitlines()) < 300
    summary = page.split("\n## The figures in short\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]
    assert len(rows) >= 10
    without = [row for row in rows if "`" not in row.rstrip(" |").rsplit("|", 1)[-1]]
    assert not without, f"figures without the command that reproduces them: {without}"
    assert not re.search(r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth) round\b", page, re.I)


def test_a_retired_key_setting_is_named_only_where_its_retirement_is_told():
    """A page telling to set a retired setting sends the reader to a service that refuses to start."""
    from roundtrip._kernel.settings.keys import RETIRED_KEY_SETTINGS

    for path in sorted(DOCS.rglob("*.md")):
        for name in RETIRED_KEY_SETTINGS:
            if name in path.read_text():
                assert path.name in ("approvals.md", "guarantees.md"), (path, name)


def test_the_port_taken_example_names_the_consoles_own_port():
    taken = re.findall(r"port (\d+) is taken", (DOCS / "getting-started.md").read_text())
    assert taken and set(taken) == {str(Settings.model_fields["console_port"].default)}
