"""The signing keys refused at start (published, placeholder, malformed, retired), and stable replica identities."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from roundtrip._kernel.kafka.transactions import transactional_id
from roundtrip._kernel.settings import DEV_BATCH_SIGNING_KEY, DEV_BATCH_VERIFY_KEYS, InsecureConfiguration, Settings
from roundtrip._sdk.agent import load_agent
from tests.signing import key_environment, key_settings, pair


def settings(**values) -> Settings:
    return Settings(_env_file=None, **values)


def test_development_means_the_embedded_broker_or_an_explicit_env():
    assert settings().development is True
    assert settings(kafka_bootstrap_servers="kafka:9092").development is False
    assert settings(kafka_bootstrap_servers="kafka:9092", env="development").development is True
    assert settings(env="production").development is False


@pytest.mark.parametrize(
    "name,value",
    [
        ("batch_verify_keys", DEV_BATCH_VERIFY_KEYS),
        ("batch_verify_keys", f"{pair('k2').verify},{DEV_BATCH_VERIFY_KEYS}"),
        ("batch_verify_keys", "other:" + DEV_BATCH_VERIFY_KEYS.partition(":")[2]),
        ("batch_signing_key", DEV_BATCH_SIGNING_KEY),
    ],
)
def test_the_published_key_is_refused_outside_development_even_as_a_verifying_key(name, value):
    own = key_settings()
    production = settings(kafka_bootstrap_servers="kafka:9092", **own | {name: value})
    with pytest.raises(InsecureConfiguration, match="published development key") as refused:
        production.refuse_unfit_keys("executor", (name,))
    assert f"ROUNDTRIP_{name.upper()}" in str(refused.value) and "roundtrip keys" in str(refused.value)
    settings(**own | {name: value}).refuse_unfit_keys("executor", (name,))  # the embedded development fleet: allowed
    settings(kafka_bootstrap_servers="kafka:9092", **own).refuse_unfit_keys("gate", (name,))


def run_service(service: str, **variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    env.update(ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1", **variables)
    return subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "run", service],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("service", ["gate", "executor", "guard", "console"])
def test_no_service_that_holds_a_key_starts_with_the_published_one_in_production(service):
    # approvals on (the demo shop holds a cancel above 50.00 EUR): the decision keys matter to the console too
    done = run_service(service, ROUNDTRIP_ENV="production", ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS="5000")
    assert done.returncode == 1, done.stderr  # refused like any setting that cannot be used here
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {service} refuses to start") and "published" in lines[0]


SECRET_PART = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"  # valid base64 of 27 bytes: no key


@pytest.mark.parametrize(
    "variable,value,says",
    [
        ("ROUNDTRIP_BATCH_SIGNING_KEY", "k1:CHANGE-ME", "placeholder CHANGE-ME"),
        ("ROUNDTRIP_BATCH_SIGNING_KEY", f"k1:{SECRET_PART}", "an Ed25519 key is 32"),
        ("ROUNDTRIP_BATCH_SIGNING_KEY", f"{SECRET_PART}=", "must look like key_id:base64-key"),
        ("ROUNDTRIP_DECISION_VERIFY_KEYS", f"ops1:{SECRET_PART}%%", "is not base64"),
        ("ROUNDTRIP_APPROVAL_KEYS", f"k1:{SECRET_PART}", "is retired"),
        ("ROUNDTRIP_DECISION_KEYS", f"ops1:{SECRET_PART}", "Migrating from HMAC keys"),
    ],
)
def test_a_placeholder_malformed_or_retired_key_stops_the_gate_with_one_line_that_shows_no_secret(
    variable, value, says
):
    done = run_service("gate", ROUNDTRIP_ENV="production", **key_environment() | {variable: value})
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gate refuses to start") and says in lines[0], lines
    assert SECRET_PART[:8] not in done.stderr + done.stdout


def test_roundtrip_config_warns_while_the_published_key_is_in_use(monkeypatch):
    from roundtrip._cli.main import app
    from roundtrip._kernel.settings import get_settings

    get_settings.cache_clear()
    for variable in key_environment():
        monkeypatch.delenv(variable, raising=False)
    out = CliRunner().invoke(app, ["config"])
    assert "warning" in out.output and "published development pair" in out.output
    assert DEV_BATCH_SIGNING_KEY.partition(":")[2] not in out.output  # published or not, a private key is never shown
    for variable, value in key_environment().items():
        monkeypatch.setenv(variable, value)
    get_settings.cache_clear()
    shown = CliRunner().invoke(app, ["config"]).output
    assert "warning" not in shown and "ROUNDTRIP_BATCH_SIGNING_KEY" in shown and "k1:***" in shown
    get_settings.cache_clear()


def test_transactional_ids_are_stable_per_replica_not_per_process(monkeypatch):
    for var in ("ROUNDTRIP_INSTANCE_ID", "KUBERNETES_SERVICE_HOST", "HOSTNAME"):
        monkeypatch.delenv(var, raising=False)
    code = (
        "from roundtrip._kernel.settings import Settings; from roundtrip._kernel.kafka.transactions import "
        "transactional_id as t; "
        "print(t('gateway', 'support.replies', Settings().instance_id, ''))"
    )
    env = {k: v for k, v in os.environ.items() if k != "ROUNDTRIP_INSTANCE_ID"}
    first, second = (
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    )
    assert first == second and str(os.getpid()) not in first  # a restarted process takes over its predecessor's id
    assert transactional_id("gateway", "r", "gateway-2", "") == "roundtrip-gateway-r-gateway-2"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", "gateway-0")
    assert transactional_id("gateway", "r", None, "") == "roundtrip-gateway-r-gateway-0"  # the StatefulSet pod name
    monkeypatch.setenv("ROUNDTRIP_INSTANCE_ID", "gw-a")  # read with the settings the gateway is built with
    assert transactional_id("gateway", "r", Settings().instance_id, "") == "roundtrip-gateway-r-gw-a"
    assert (
        transactional_id("gateway", "r", "gw-a", "prod.") == "prod.roundtrip-gateway-r-gw-a"
    )  # a fleet's own, by its prefix


def test_the_local_fleet_gives_every_replica_its_own_stable_identity(tmp_path, monkeypatch):
    from roundtrip._fleet.launcher import Fleet

    spawned = {}

    class FakePopen:
        def __init__(self, argv, env, **kwargs):
            spawned[argv[-1]] = env["ROUNDTRIP_INSTANCE_ID"]
            self.pid, self.args = 1, argv

    monkeypatch.setattr("roundtrip._fleet.children.subprocess.Popen", FakePopen)
    fleet = Fleet(settings(state_dir=tmp_path))
    fleet.logs = tmp_path
    fleet._spawn("gateway", ["x", "gateway"], "")
    fleet._spawn("executor-2", ["x", "executor-2"], "")
    assert spawned["gateway"].endswith("-gateway") and spawned["executor-2"].endswith("-executor-2")


@pytest.mark.parametrize("service", ["gate", "executor", "guard"])
async def test_the_apps_themselves_refuse_to_start_with_the_published_key_in_production(service):
    import importlib

    app = importlib.import_module(f"roundtrip._{service}.app").build(
        settings(kafka_bootstrap_servers="127.0.0.1:1", kafka_allow_plaintext=True), load_agent()
    )
    with pytest.raises(InsecureConfiguration):
        await app.start()  # before the broker is even contacted


def test_roundtrip_approvals_signs_nothing_with_a_placeholder_or_malformed_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    for value, says in (("ops1:CHANGE-ME-with-roundtrip-keys-decision", "placeholder"), (f"ops1:{SECRET_PART}", "32")):
        done = subprocess.run(
            [sys.executable, "-m", "roundtrip._cli.main", "approvals", "approve", "appr_x"],
            env=env | {"ROUNDTRIP_STATE_DIR": str(tmp_path), "ROUNDTRIP_DECISION_SIGNING_KEY": value},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and "ROUNDTRIP_DECISION_SIGNING_KEY" in done.stdout and says in done.stdout, done
        assert SECRET_PART[:8] not in done.stdout + done.stderr


def test_roundtrip_up_says_a_retired_key_setting_once_before_starting_anything(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "up"],
        env=env | {"ROUNDTRIP_STATE_DIR": str(tmp_path), "ROUNDTRIP_APPROVAL_KEYS": f"k1:{SECRET_PART}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "ROUNDTRIP_APPROVAL_KEYS (HMAC) is retired" in lines[0], done
    assert "ROUNDTRIP_BATCH_SIGNING_KEY" in lines[0] and SECRET_PART[:8] not in done.stdout + done.stderr
    assert lines[0].startswith("error: the fleet refuses to start") and list(tmp_path.iterdir()) == []  # nothing ran
