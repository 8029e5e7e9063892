"""Issue 28's Done-when, as a user installs roundtrip: the built wheel, installed non-editable into a fresh venv
outside the checkout, runs `roundtrip up` with an empty Kafka cache (so up fetches the jars with mvn from the pom the
wheel ships; mvn resolves them from ~/.m2) and one `roundtrip ask` to end_turn on the embedded defaults.

Nothing of the checkout reaches that venv: its processes get a clean environment (the fresh venv's bin first on
PATH, no PYTHONPATH, none of this process's ROUNDTRIP_ settings) and run in a folder outside the checkout; the test
checks that `roundtrip` is imported from the venv's site-packages and that no sys.path entry lies in the checkout.
The wheel's dependencies come from PyPI through pip's cache (what CI's setup filled).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import roundtrip
import roundtrip.testing
from tests.ports import free_port_run
from tests.signing import key_environment
from tests.skeletons import agent_files
from tests.wheel import ROOT, build_wheel, pip_wheel

pytestmark = pytest.mark.timeout(1500)  # a fresh venv's dependencies, the jars fetched once, a fleet started

PASSED_THROUGH = (
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "JAVA_HOME",
    "M2_HOME",
    "MAVEN_OPTS",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)
INTROSPECT = """import json, sys, roundtrip, roundtrip.testing
print(json.dumps({"file": roundtrip.__file__, "all": roundtrip.__all__, "testing": roundtrip.testing.__all__,
                  "path": sys.path, "executable": sys.executable}))"""


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """What a user's shell gives the installed commands: the venv first on PATH, then the system's (java, mvn)."""
    env = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
    env |= {name: value for name, value in os.environ.items() if name.startswith("PIP_")}  # pip's index, cache, certs
    return {**env, "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(venv), **extra}


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv, outside the checkout, with the built wheel installed in it (not editable)."""
    root = tmp_path_factory.mktemp("installed")
    assert not root.resolve().is_relative_to(ROOT)
    wheel = build_wheel(root / "dist")
    venv = root / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)], clean_env(venv), root, 300)
    assert made.returncode == 0, made.stderr
    pip = run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], clean_env(venv), root, 1200)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return venv


def test_the_installed_wheel_imports_roundtrip_from_its_own_site_packages_with_the_public_api(installed, tmp_path):
    shown = run([str(installed / "bin" / "python"), "-c", INTROSPECT], clean_env(installed), tmp_path, 120)
    assert shown.returncode == 0, shown.stderr
    seen = json.loads(shown.stdout)
    assert Path(seen["file"]).is_relative_to(installed) and "site-packages" in seen["file"]
    assert not [entry for entry in seen["path"] if entry and Path(entry).resolve().is_relative_to(ROOT)], seen["path"]
    assert seen["all"] == roundtrip.__all__ and seen["testing"] == roundtrip.testing.__all__
    assert {"Agent", "tool", "Entity", "ToolContext", "ToolError", "McpServer", "always", "approval_rule"} <= set(
        seen["all"]
    )
    assert {"ScriptedModel", "FunctionModel", "call", "run_turn"} <= set(seen["testing"])
    # a dev command that writes into a checkout says it needs one, and writes nothing into site-packages
    contracts = run([str(installed / "bin" / "roundtrip"), "contracts"], clean_env(installed), tmp_path, 120)
    assert contracts.returncode == 1 and "wrote" not in contracts.stdout
    assert "of a checkout" in contracts.stderr and len(contracts.stderr.strip().splitlines()) == 1, contracts.stderr
    assert not list(installed.rglob("asyncapi.json"))


def test_the_installed_roundtrip_up_fetches_the_jars_runs_the_fleet_and_answers_one_ask(installed, tmp_path):
    base = free_port_run(5)
    cache, state, home = tmp_path / "kafka-cache", tmp_path / "state", tmp_path / "work"
    cache.mkdir()
    home.mkdir()
    env = clean_env(
        installed,
        ROUNDTRIP_KAFKA_CACHE=str(cache),
        ROUNDTRIP_STATE_DIR=str(state),
        ROUNDTRIP_KAFKA_PORT=str(base),
        ROUNDTRIP_KAFKA_CONTROLLER_PORT=str(base + 1),
        ROUNDTRIP_SIMULATOR_PORT=str(base + 2),
        ROUNDTRIP_SHOP_PORT=str(base + 3),
        ROUNDTRIP_CONSOLE_PORT=str(base + 4),
    )
    output = tmp_path / "up.log"
    with open(output, "w") as log:
        up = subprocess.Popen(
            [str(installed / "bin" / "roundtrip"), "up"], env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 600  # the jars, copied from ~/.m2 by mvn, then the fleet
            while "Ready." not in output.read_text():
                assert up.poll() is None, output.read_text()
                assert time.monotonic() < deadline, output.read_text()
                time.sleep(0.5)  # poll interval: `up` printing its banner
            started = output.read_text()
            assert f"with mvn into {cache}" in started, started  # the cache was empty: up fetched the jars itself
            assert list((cache / "libs").glob("kafka_2.13-*.jar"))

            ask = run(
                [str(installed / "bin" / "roundtrip"), "ask", "cancel my last order", "--customer", "cus_1001"],
                env,
                home,
                180,
            )
            assert ask.returncode == 0, ask.stdout + ask.stderr
            assert "end_turn" in ask.stdout and "I've cancelled order ord_a1000003" in ask.stdout, ask.stdout
        finally:
            if up.poll() is None:
                up.send_signal(signal.SIGINT)  # Ctrl-C
            try:
                code = up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                up.kill()
                raise
    assert code == 0 and "roundtrip: stopped" in output.read_text(), output.read_text()
    broker_log = (state / "logs" / "kafka.log").read_text(errors="replace")
    assert "No configuration found" not in broker_log  # log4j2.yaml came with the wheel
    assert re.search(r"(?m)^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d+\] INFO .+ \(\w+\)$", broker_log), broker_log[-2000:]


def test_an_agent_installed_from_wheels_alone_plays_its_banners_example_with_no_key(
    installed, tmp_path, kafka_bootstrap
):
    """Issue 45: an agent of `roundtrip agent init`, installed with roundtrip-fleet from a folder of wheels and no
    package index, runs in the installed fleet; with no API key the banner's example plays its example_script and
    calls its tool."""
    wheelhouse, source, home = tmp_path / "wheelhouse", tmp_path / "src", tmp_path / "work"
    home.mkdir()
    for relative, text in agent_files("desk-wheel").items():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_text(text)
    pip_wheel(source, wheelhouse)  # the agent's wheel, then the fleet's beside it
    shutil.copy(build_wheel(tmp_path / "fleet"), wheelhouse)
    python = str(installed / "bin" / "python")
    gone = run([python, "-m", "pip", "uninstall", "-y", "-q", "roundtrip-fleet"], clean_env(installed), home, 300)
    assert gone.returncode == 0, gone.stderr
    pip = run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheelhouse), "desk-wheel"],
        clean_env(installed),
        home,
        600,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr  # roundtrip-fleet came from the wheelhouse, as the agent did
    base = free_port_run(2)
    env = clean_env(
        installed,
        ROUNDTRIP_AGENT="desk-wheel",
        ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        ROUNDTRIP_TOPIC_PREFIX=f"whl{uuid.uuid4().hex[:6]}.",
        ROUNDTRIP_STATE_DIR=str(tmp_path / "state"),
        ROUNDTRIP_SIMULATOR_PORT=str(base),
        ROUNDTRIP_CONSOLE_PORT=str(base + 1),
        ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT="true",  # the test broker listens in the clear; the fleet is not development
        **key_environment("whl1"),  # not the embedded broker: fresh key pairs, never the published ones
    )
    output = tmp_path / "up.log"
    with open(output, "w") as log:
        up = subprocess.Popen([str(installed / "bin" / "roundtrip"), "up"], env=env, cwd=home, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 300
            while "Ready." not in output.read_text():
                assert up.poll() is None, output.read_text()
                assert time.monotonic() < deadline, output.read_text()
                time.sleep(0.5)  # poll interval: `up` printing its banner
            time.sleep(1)  # the rest of the banner
            line = next(line for line in output.read_text().splitlines() if " ask " in line)
            words = shlex.split(line)
            assert words[0] == "roundtrip" and words[words.index("--persona") + 1] == "script:example", line
            ask = run([str(installed / "bin" / "roundtrip"), *words[1:]], env, home, 180)
            assert ask.returncode == 0, ask.stdout + ask.stderr
            assert "calls get_ticket" in ask.stdout and "gate  get_ticket: approved" in ask.stdout, ask.stdout
        finally:
            if up.poll() is None:
                up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                up.kill()
                raise


def test_the_installed_wheel_with_the_bedrock_extra_runs_the_fleet_on_bedrock(installed, tmp_path):
    """The default install has no platform's library; with `roundtrip-fleet[bedrock]` installed, `roundtrip up` runs
    the fleet on Bedrock (the SDK's AsyncAnthropicBedrock signing with fake AWS keys) against the simulator in
    Bedrock's shape, run from the same venv, and one `roundtrip ask` ends its turn there."""
    python, roundtrip_bin = str(installed / "bin" / "python"), str(installed / "bin" / "roundtrip")
    light = run([python, "-c", "import boto3"], clean_env(installed), tmp_path, 60)
    assert light.returncode != 0 and "No module named 'boto3'" in light.stderr  # only through the extra
    (wheel,) = (installed.parent / "dist").glob("*.whl")
    pip = run([python, "-m", "pip", "install", "-q", f"{wheel}[bedrock]"], clean_env(installed), tmp_path, 1200)
    assert pip.returncode == 0, pip.stdout + pip.stderr

    base = free_port_run(5)
    simulator_url = f"http://127.0.0.1:{base + 2}"
    env = clean_env(
        installed,
        ROUNDTRIP_STATE_DIR=str(tmp_path / "state"),
        ROUNDTRIP_KAFKA_PORT=str(base),
        ROUNDTRIP_KAFKA_CONTROLLER_PORT=str(base + 1),
        ROUNDTRIP_SIMULATOR_PORT=str(base + 2),
        ROUNDTRIP_SHOP_PORT=str(base + 3),
        ROUNDTRIP_CONSOLE_PORT=str(base + 4),
        ROUNDTRIP_MODEL_PROVIDER="bedrock",
        ROUNDTRIP_MODEL="us.anthropic.claude-sonnet-4-6",
        ROUNDTRIP_MODEL_REGION="us-east-1",
        ROUNDTRIP_ANTHROPIC_BASE_URL=simulator_url,
        AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
        AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        AWS_EC2_METADATA_DISABLED="true",
    )
    home = tmp_path / "work"
    home.mkdir()
    simulator = subprocess.Popen(
        [roundtrip_bin, "run", "simulator"], env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    output = tmp_path / "up.log"
    try:
        with open(output, "w") as log:
            up = subprocess.Popen([roundtrip_bin, "up"], env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 600
                while "Ready." not in output.read_text():
                    assert up.poll() is None, output.read_text()
                    assert time.monotonic() < deadline, output.read_text()
                    time.sleep(0.5)  # poll interval: `up` printing its banner
                ask = run([roundtrip_bin, "ask", "cancel my last order", "--customer", "cus_1001"], env, home, 180)
                assert ask.returncode == 0, ask.stdout + ask.stderr
                assert "end_turn" in ask.stdout and "I've cancelled order ord_a1000003" in ask.stdout, ask.stdout
                health = run(
                    [
                        python,
                        "-c",
                        f"import urllib.request as u; print(u.urlopen('{simulator_url}/health').read().decode())",
                    ],
                    env,
                    home,
                    30,
                )
                assert json.loads(health.stdout)["platforms"].get("bedrock", 0) >= 2, health.stdout  # its every call
            finally:
                if up.poll() is None:
                    up.send_signal(signal.SIGINT)
                try:
                    up.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    up.kill()
                    raise
    finally:
        simulator.terminate()
        simulator.wait(timeout=30)
