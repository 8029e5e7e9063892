"""scripts/saying.sh: setup.sh's long waits (pip, mvn) say what they still wait for instead of a silent minute."""

from __future__ import annotations

import subprocess
from pathlib import Path

SAYING = Path(__file__).resolve().parents[2] / "scripts" / "saying.sh"


def _saying(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f'source "{SAYING}" && saying "installing with pip" "$@"', "saying", *command],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "ROUNDTRIP_SAYING_EVERY": "1"},
    )


def test_a_long_command_is_said_to_still_run_and_keeps_its_exit_status():
    slow = _saying("sleep", "3")
    lines = slow.stdout.splitlines()
    assert slow.returncode == 0 and lines
    assert all(line.startswith("    ... still installing with pip (") for line in lines)
    failed = _saying("bash", "-c", "sleep 2; exit 7")
    assert failed.returncode == 7 and "still installing with pip" in failed.stdout


def test_setup_says_each_of_its_long_waits():
    setup = (SAYING.parent / "setup.sh").read_text()
    assert "source scripts/saying.sh" in setup
    for command in ("pip install --disable-pip-version-check -q -e", "--force-reinstall", "embedded fetch"):
        (line,) = [i for i, text in enumerate(setup.splitlines()) if command in text]
        assert "saying " in setup.splitlines()[line] or setup.splitlines()[line - 1].lstrip().startswith("saying ")
