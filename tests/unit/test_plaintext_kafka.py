"""A PLAINTEXT Kafka outside development is refused at start, unless ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT says so.

The process-level half (a service against a real broker with a PLAINTEXT listener) is
tests/integration/test_plaintext_refusal.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from roundtrip._kernel.settings import ConfigurationError, InsecureConfiguration, Settings
from roundtrip._sdk.agent import load_agent
from tests.signing import key_environment, key_settings

EXTERNAL = "kafka-1.example:9092"
PLAIN_IN_CLEAR = {
    "kafka_bootstrap_servers": EXTERNAL,
    "kafka_security_protocol": "SASL_PLAINTEXT",
    "kafka_sasl_mechanism": "PLAIN",
    "kafka_sasl_username": "roundtrip",
    "kafka_sasl_password": "secret",
}


def settings(**values) -> Settings:
    return Settings(_env_file=None, **values)


def test_plaintext_outside_development_is_refused_in_one_line_naming_the_way_out():
    with pytest.raises(ConfigurationError) as refused:
        settings(kafka_bootstrap_servers=EXTERNAL).refuse_plaintext_kafka("gateway")
    said = str(refused.value)
    assert said.startswith("gateway refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is PLAINTEXT"), said
    assert "\n" not in said and EXTERNAL in said and "ROUNDTRIP_ENV=unset" in said
    assert "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true" in said and "SASL_SSL" in said
    with pytest.raises(ConfigurationError):  # production said out loud: the same
        settings(env="production").refuse_plaintext_kafka("model")


@pytest.mark.parametrize(
    "values",
    [
        {},  # the embedded broker: the development fleet of `roundtrip up`
        {"kafka_bootstrap_servers": EXTERNAL, "env": "development"},
        {"kafka_bootstrap_servers": EXTERNAL, "kafka_allow_plaintext": True},  # a trusted network, on purpose
        {"env": "production", "kafka_allow_plaintext": True},
        {
            "kafka_bootstrap_servers": EXTERNAL,
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "SCRAM-SHA-512",
            "kafka_sasl_username": "roundtrip",
            "kafka_sasl_password": "secret",
        },
        {
            "kafka_bootstrap_servers": EXTERNAL,
            "kafka_security_protocol": "SASL_PLAINTEXT",  # SCRAM never sends the password itself
            "kafka_sasl_mechanism": "SCRAM-SHA-256",
            "kafka_sasl_username": "roundtrip",
            "kafka_sasl_password": "secret",
        },
        {**PLAIN_IN_CLEAR, "kafka_allow_plaintext": True},
        {**PLAIN_IN_CLEAR, "env": "development"},
        {"kafka_bootstrap_servers": EXTERNAL, "kafka_security_protocol": "SSL", "kafka_allow_anonymous": True},
    ],
)
def test_development_an_explicit_allowance_or_a_secured_protocol_start(values):
    settings(**values).refuse_plaintext_kafka("gateway")


def test_ssl_with_a_client_certificate_starts(tmp_path):
    (tmp_path / "client.pem").write_text("-")
    (tmp_path / "client.key").write_text("-")
    settings(
        kafka_bootstrap_servers=EXTERNAL,
        kafka_security_protocol="SSL",
        kafka_ssl_certfile=tmp_path / "client.pem",
        kafka_ssl_keyfile=tmp_path / "client.key",
    ).refuse_plaintext_kafka("gateway")


@pytest.mark.parametrize(
    "values,says,allowance",
    [
        (PLAIN_IN_CLEAR, "is SASL_PLAINTEXT with PLAIN", "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true"),
        (
            {
                **PLAIN_IN_CLEAR,
                "kafka_sasl_mechanism": "OAUTHBEARER",
                "kafka_sasl_username": None,
                "kafka_sasl_password": None,
                "kafka_sasl_oauth_token_provider": "roundtrip._broker.unsecured_token:UnsecuredTokenProvider",
            },
            "is SASL_PLAINTEXT with OAUTHBEARER",
            "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT=true",
        ),
        (
            {"kafka_bootstrap_servers": EXTERNAL, "kafka_security_protocol": "SSL"},
            "is SSL without a client certificate",
            "ROUNDTRIP_KAFKA_ALLOW_ANONYMOUS=true",
        ),
        (
            {"kafka_bootstrap_servers": EXTERNAL, "kafka_security_protocol": "SSL", "kafka_allow_plaintext": True},
            "is SSL without a client certificate",  # the plaintext allowance is not this one
            "ROUNDTRIP_KAFKA_ALLOW_ANONYMOUS=true",
        ),
    ],
)
def test_a_credential_in_the_clear_or_an_anonymous_tls_client_is_refused_outside_development(values, says, allowance):
    with pytest.raises(InsecureConfiguration) as refused:
        settings(**values).refuse_plaintext_kafka("executor")
    said = str(refused.value)
    assert said.startswith(f"executor refuses to start: ROUNDTRIP_KAFKA_SECURITY_PROTOCOL {says}"), said
    assert "\n" not in said and EXTERNAL in said and allowance in said and "secret" not in said


def test_the_allowance_is_read_from_its_variable(monkeypatch):
    for name in [n for n in os.environ if n.startswith("ROUNDTRIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS", EXTERNAL)
    assert Settings().kafka_allow_plaintext is False
    monkeypatch.setenv("ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT", "true")
    assert Settings().kafka_allow_plaintext is True
    Settings().refuse_plaintext_kafka("gate")


@pytest.mark.parametrize("service", ["gateway", "model", "guard", "gate", "executor", "console"])
def test_roundtrip_run_refuses_every_service_in_one_line_with_exit_1(service, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    env.update(
        ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1",  # never dialled: refused before any connection
        ROUNDTRIP_LEDGER_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}",
        **key_environment(),  # fresh pairs: what it refuses is the plaintext Kafka
        ROUNDTRIP_STATE_DIR=str(tmp_path / "state"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "run", service],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {service} refuses to start: "), done.stderr
    assert "PLAINTEXT" in lines[0] and "ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT" in lines[0]


@pytest.mark.parametrize("service", ["gateway", "executor", "console"])
async def test_the_apps_themselves_refuse_before_the_broker_is_contacted(service, tmp_path):
    import importlib

    values = dict(
        kafka_bootstrap_servers="127.0.0.1:1",
        ledger_database_url=f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}",
        **key_settings(),
        state_dir=tmp_path,
    )
    app = importlib.import_module(f"roundtrip._{service}.app").build(settings(**values), load_agent())
    with pytest.raises(ConfigurationError, match="ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is PLAINTEXT"):
        await app.start()


@pytest.mark.parametrize(
    "variable,value",
    [
        ("ROUNDTRIP_CONSOLE_LOCAL_USER", "me@laptop"),  # every visitor an approver: development only
        ("ROUNDTRIP_CONSOLE_TRUSTED_PROXIES", "127.0.0.1"),  # identity on the word of an address: development only
        ("ROUNDTRIP_CONSOLE_SECURE_COOKIES", "false"),  # the CSRF cookie over plain http: development only
    ],
)
def test_the_consoles_development_sign_in_is_refused_by_roundtrip_run_in_one_line(tmp_path, variable, value):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")}
    env.update(
        ROUNDTRIP_ENV="production",
        **{variable: value},
        ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1",
        ROUNDTRIP_KAFKA_ALLOW_PLAINTEXT="true",
        ROUNDTRIP_LEDGER_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}",
        **key_environment(),
        ROUNDTRIP_STATE_DIR=str(tmp_path / "state"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "run", "console"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: console refuses to start: {variable}"), done.stderr
