"""The published development approval key outside development, and stable replica identities."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from roundtrip._kernel.kafka.transactions import transactional_id
from roundtrip._kernel.settings import DEV_APPROVAL_KEYS, InsecureConfiguration, Settings
from roundtrip._sdk.agent import load_agent


def settings(**values) -> Settings:
    return Settings(_env_file=None, **values)


def test_development_means_the_embedded_broker_or_an_explicit_env():
    assert settings().development is True
    assert settings(kafka_bootstrap_servers="kafka:9092").development is False
    assert settings(kafka_bootstrap_servers="kafka:9092", env="development").development is True
    assert settings(env="production").development is False


@pytest.mark.parametrize(
    "keys", [DEV_APPROVAL_KEYS, f"k2:{'ab' * 32},{DEV_APPROVAL_KEYS}", "other:roundtrip-dev-only-approval-key"]
)
def test_the_published_key_is_refused_outside_development_even_as_a_verifying_key(keys):
    production = settings(kafka_bootstrap_servers="kafka:9092", approval_keys=keys)
    assert production.dev_approval_key_in_use
    with pytest.raises(InsecureConfiguration, match="published development key") as refused:
        production.refuse_dev_approval_key("executor")
    assert "ROUNDTRIP_APPROVAL_KEYS" in str(refused.value) and "openssl rand" in str(refused.value)
    settings(approval_keys=keys).refuse_dev_approval_key("executor")  # the embedded development fleet: allowed
    settings(kafka_bootstrap_servers="kafka:9092", approval_keys=f"k1:{'ab' * 32}").refuse_dev_approval_key("gate")


@pytest.mark.parametrize("service", ["gate", "executor"])
def test_gate_and_executor_do_not_start_with_the_published_key_in_production(service):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    env.update(ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1", ROUNDTRIP_ENV="production")
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "run", service],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr  # refused like any setting that cannot be used here
    assert f"error: {service} refuses to start" in done.stderr and "published development key" in done.stderr


def test_roundtrip_config_warns_while_the_published_key_is_in_use(monkeypatch):
    from roundtrip._cli.main import app
    from roundtrip._kernel.settings import get_settings

    get_settings.cache_clear()
    monkeypatch.setenv("ROUNDTRIP_APPROVAL_KEYS", DEV_APPROVAL_KEYS)
    out = CliRunner().invoke(app, ["config"])
    assert "warning" in out.output and "published development key" in out.output
    monkeypatch.setenv("ROUNDTRIP_APPROVAL_KEYS", f"k1:{'ab' * 32}")
    get_settings.cache_clear()
    assert "warning" not in CliRunner().invoke(app, ["config"]).output
    get_settings.cache_clear()


def test_transactional_ids_are_stable_per_replica_not_per_process(monkeypatch):
    for var in ("ROUNDTRIP_INSTANCE_ID", "KUBERNETES_SERVICE_HOST", "HOSTNAME"):
        monkeypatch.delenv(var, raising=False)
    code = (
        "from roundtrip._kernel.settings import Settings; from roundtrip._kernel.kafka.transactions import "
        "transactional_id as t; "
        "print(t('gateway', 'support.replies', Settings().instance_id))"
    )
    env = {k: v for k, v in os.environ.items() if k != "ROUNDTRIP_INSTANCE_ID"}
    first, second = (
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    )
    assert first == second and str(os.getpid()) not in first  # a restarted process takes over its predecessor's id
    assert transactional_id("gateway", "r", "gateway-2") == "roundtrip-gateway-r-gateway-2"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", "gateway-0")
    assert transactional_id("gateway", "r") == "roundtrip-gateway-r-gateway-0"  # the StatefulSet pod name
    monkeypatch.setenv("ROUNDTRIP_INSTANCE_ID", "gw-a")  # read with the settings the gateway is built with
    assert transactional_id("gateway", "r", Settings().instance_id) == "roundtrip-gateway-r-gw-a"
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


@pytest.mark.parametrize("service", ["gate", "executor"])
async def test_the_apps_themselves_refuse_to_start_with_the_published_key_in_production(service):
    import importlib

    app = importlib.import_module(f"roundtrip._{service}.app").build(
        settings(kafka_bootstrap_servers="127.0.0.1:1", kafka_allow_plaintext=True), load_agent()
    )
    with pytest.raises(InsecureConfiguration):
        await app.start()  # before the broker is even contacted
