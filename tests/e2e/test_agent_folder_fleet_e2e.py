"""An author works from their agent's folder (issue 56, item 1), as the README `roundtrip agent init` writes says:
`pip install -e '.[test]'` into the venv of the roundtrip that made it, its tests, `agent check`, then
`ROUNDTRIP_AGENT=NAME roundtrip up` and `roundtrip eval run evals`, each line run as written, no PYTHONPATH anywhere.
With that agent's fleet on non-default ports and a second fleet running beside it, the eval from the agent's folder
(no ROUNDTRIP_STATE_DIR, no port settings) evaluates the fleet that runs that agent, found from the marker `up` left.

The author's venv is one of its own (so the agent installed in it leaves this venv as it was): this venv's
site-packages seen through a .pth (the fleet of this checkout, pip, pytest, setuptools) and the `roundtrip` command
as pip writes it. pip runs offline: no index, and the build with the setuptools already there.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.e2e.up_process import roundtrip_up

pytestmark = pytest.mark.timeout(900)  # two fleets started, an agent installed, its tests and its evaluation

NAME = "desk-mark"


@pytest.fixture(scope="module")
def author_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("author") / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "fleet.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    script = venv / "bin" / "roundtrip"
    python = venv / "bin" / "python"
    script.write_text(f"#!{python}\nimport sys\n\nfrom roundtrip._cli import entry\n\nsys.exit(entry())\n")
    script.chmod(0o755)
    return venv


def author_shell(venv: Path) -> dict[str, str]:
    """The author's shell with the venv first on PATH: none of this test's ROUNDTRIP_ settings, no PYTHONPATH."""
    kept = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ROUNDTRIP_", "PIP_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV", "ANTHROPIC_API_KEY")
    }
    # PIP_NO_BUILD_ISOLATION=0 reads as build_isolation=0 (pip's inversion of its --no-* options): no isolated build
    offline = {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return kept | offline | {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONNOUSERSITE": "1"}


def as_written(line: str, cwd: Path, shell: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=shell, capture_output=True, text=True, timeout=600)


def test_the_readme_run_as_written_from_the_agents_folder_evaluates_the_fleet_running_that_agent(author_venv, tmp_path):
    shell = author_shell(author_venv)
    made = as_written(f"roundtrip agent init {NAME}", tmp_path, shell)
    assert made.returncode == 0, made.stdout + made.stderr
    desk = tmp_path / NAME
    readme = (desk / "README.md").read_text()
    lines = [line.strip() for line in readme.splitlines() if line.startswith("    ") and "docker" not in line]
    install, tests, check, up, evaluate = lines  # the README's commands, in its order
    python = author_venv / "bin" / "python"
    assert install.startswith(f"{python} -m pip install -e '.[test]'") and tests.startswith(f"{python} -m pytest")
    said = {}
    for line in (install, tests, check):
        done = as_written(line, desk, shell)
        assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
        said[line] = done.stdout + done.stderr
    assert " passed" in said[tests] and "Warning" not in said[tests]  # pytest-asyncio's loop scope is set
    assert f"agent {NAME}: ok: 2 tools" in said[check]
    *settings, command, verb = shlex.split(up, comments=True)
    assert (settings, command, verb) == ([f"ROUNDTRIP_AGENT={NAME}"], "roundtrip", "up")  # roundtrip: on its PATH
    (tmp_path / "other").mkdir()
    (tmp_path / "mine").mkdir()
    with (
        roundtrip_up(tmp_path / "other"),  # a second fleet: the demo shop, on ports of its own
        roundtrip_up(
            tmp_path / "mine",
            env=dict(s.split("=", 1) for s in settings),
            shell=shell | {k: v for k, v in os.environ.items() if k == "ROUNDTRIP_KAFKA_CACHE"},
            command=[shutil.which(command, path=shell["PATH"]) or command, verb],
        ) as (_, env, log),
    ):
        assert "PYTHONPATH" not in env
        assert f"Commands run in {(tmp_path / 'mine').resolve()} and {desk.resolve()}" in log.read_text()
        ran = as_written(evaluate, desk, shell)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    state = (tmp_path / "mine" / "state").resolve()
    assert f"the fleet running in {state} (pid " in ran.stderr and f"agent {NAME}, its settings" in ran.stderr
    assert f"cases against agent {NAME}" in ran.stdout
    assert "2 passed, 0 failed, 0 skipped of 2 cases" in ran.stdout
