"""The README's configuration table, topics and commands must say what the code does."""

from pathlib import Path

from typer.testing import CliRunner

from services.cli import app
from services.kernel import topology
from services.kernel.settings import CONCERNS, Settings, env_name

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
