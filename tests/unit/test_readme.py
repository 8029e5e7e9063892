"""The README's configuration table, topics and commands must say what the code does."""

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from roundtrip._cli.main import app
from roundtrip._guard.pricing import PriceTable
from roundtrip._kernel.wire import topology
from roundtrip._kernel.settings import CONCERNS, Settings, env_name

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented_under_its_concern():
    configuration = README.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    sections = {part.split("\n", 1)[0]: part for part in configuration.split("\n### ")[1:]}
    assert list(sections) == [concern.heading for concern in CONCERNS]  # the headings `roundtrip config` prints
    for concern in CONCERNS:
        for name in concern.model_fields:
            assert f"| `{env_name(name)}` |" in sections[concern.heading], (concern.heading, env_name(name))
    documented = [line for line in configuration.splitlines() if line.startswith("| `")]
    assert len(documented) == len(Settings.model_fields)  # each once


def test_every_topic_is_documented():
    for name in topology.topic_names():
        assert f"`{name}`" in README, name


def test_the_two_commands_exist_and_every_cli_command_is_documented():
    assert "bash scripts/up.sh" in README and "bash scripts/test.sh" in README
    for script in ("scripts/up.sh", "scripts/test.sh", "scripts/setup.sh", ".ci/run"):
        assert (Path(__file__).resolve().parents[2] / script).exists()
    for command in app.registered_commands:
        assert f"roundtrip {command.name or command.callback.__name__}" in README
    for group in app.registered_groups:
        assert f"roundtrip {group.name}" in README


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
    """A real line reads as the README's: the same words, but where the README cuts it (`...`) and its turn and trace ids."""
    def part(text: str) -> str:
        if text == "...":
            return ".*"
        if re.fullmatch(r"turn_[0-9a-f]+", text):
            return r"turn_[0-9a-f]+"
        return r"[0-9a-f]{32}" if re.fullmatch(r"[0-9a-f]{32}", text) else re.escape(text)

    pieces = re.split(r"(turn_[0-9a-f]+|\b[0-9a-f]{32}\b|\.\.\.$)", example.strip())
    return re.fullmatch("".join(part(p) for p in pieces), real.strip()) is not None


def test_the_readme_ask_example_reads_as_the_console_prints_it():
    import roundtrip._cli.console as console
    from roundtrip._kernel.wire.events import Outcome, SupportReply, Usage

    args, shown = ask_example()
    assert args == '"cancel my last order" --customer cus_1001'
    reply_line = next(line for line in shown if line.startswith("reply ("))
    figures = [int(n) for n in re.findall(r"\d+", reply_line)]
    steps, usage = figures[0], Usage(input_tokens=figures[1], output_tokens=figures[2], cache_creation_input_tokens=figures[3],
                                     cache_read_input_tokens=figures[4])
    turn_id, trace_id = re.search(r"turn (turn_\w+)  trace (\w+)", shown[-1]).groups()
    with console.console.capture() as captured:
        console.show_reply(SupportReply(request_id="r", conversation_id="c", customer_id="cus_1001", turn_id=turn_id,
                                        text=shown[-2], outcome=Outcome.END_TURN, steps=steps, usage=usage, cost_usd=0.0,
                                        trace_id=trace_id))
    printed = [line for line in captured.get().splitlines() if line.strip()]
    assert printed == [line for line in shown[-3:]], printed
    # the contract section's reply is that same turn: its figures, and their cost at the default prices
    contract = README.split("\n## The public contract\n", 1)[1]
    example = json.loads(re.findall(r"```json\n(.*?)```", contract, re.S)[1])
    assert Usage(**example["usage"]) == usage and example["steps"] == steps
    assert example["cost_usd"] == round(PriceTable.from_json(Settings(_env_file=None).prices).cost("any", usage), 4)
    assert all(matches_example(line, line) for line in shown)


def test_no_blank_line_splits_a_table_of_the_readme():
    """A blank line inside a Markdown table ends it: the rows after it render as a paragraph of pipes."""
    lines = README.splitlines()
    split = [i + 1 for i in range(1, len(lines) - 1)
             if not lines[i].strip() and lines[i - 1].startswith("|") and lines[i + 1].startswith("|")]
    assert not split, f"blank lines splitting a table at README.md lines {split}"


def test_config_names_the_api_key_as_the_docs_do(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
    monkeypatch.setenv("ROUNDTRIP_STATE_DIR", "/nonexistent/roundtrip-state")  # no fleet runs there: this shell's settings
    from roundtrip._kernel.settings import get_settings

    get_settings.cache_clear()
    try:
        shown = CliRunner().invoke(app, ["config"])
    finally:
        get_settings.cache_clear()
    assert shown.exit_code == 0, shown.output
    (line,) = [line for line in shown.stdout.splitlines() if "API_KEY" in line]
    assert line.split() == ["ANTHROPIC_API_KEY", "***"] and "sk-ant-secret" not in shown.output
    assert "| `ANTHROPIC_API_KEY` |" in README
