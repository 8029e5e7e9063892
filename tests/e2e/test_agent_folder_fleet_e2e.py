"""An author works from their agent's folder (issue 56, item 1): with that agent's fleet on non-default ports and a
second fleet running beside it, the README's `roundtrip eval run evals`, run there as written (no ROUNDTRIP_STATE_DIR,
no port settings), evaluates the fleet that runs that agent, found from the marker `up` left in the folder."""

from __future__ import annotations

import os
import subprocess
import sys

from roundtrip._cli.skeleton import skeleton
from tests.e2e.up_process import roundtrip_up


def test_the_readmes_eval_from_the_agents_folder_evaluates_the_fleet_running_that_agent(tmp_path):
    desk = tmp_path / "desk-mark"
    for relative, text in skeleton("desk-mark").items():
        (desk / relative).parent.mkdir(parents=True, exist_ok=True)
        (desk / relative).write_text(text)
    path = os.pathsep.join(p for p in (str(desk), os.environ.get("PYTHONPATH", "")) if p)
    (tmp_path / "other").mkdir()
    (tmp_path / "mine").mkdir()
    with (
        roundtrip_up(tmp_path / "other"),  # a second fleet: the demo shop, on ports of its own
        roundtrip_up(tmp_path / "mine", env={"ROUNDTRIP_AGENT": "desk_mark.agent:AGENT", "PYTHONPATH": path}) as (
            _,
            _env,
            log,
        ),
    ):
        assert f"Commands run in {(tmp_path / 'mine').resolve()} and {desk.resolve()}" in log.read_text()
        shell = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_") and k != "ANTHROPIC_API_KEY"}
        ran = subprocess.run(
            [sys.executable, "-m", "roundtrip._cli.main", "eval", "run", "evals"],
            cwd=desk,
            env={**shell, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    state = (tmp_path / "mine" / "state").resolve()
    assert (
        f"the fleet running in {state} (pid " in ran.stderr
        and "agent desk_mark.agent:AGENT, its settings" in ran.stderr
    )
    assert "cases against agent desk-mark" in ran.stdout
    assert "2 passed, 0 failed, 0 skipped of 2 cases" in ran.stdout
