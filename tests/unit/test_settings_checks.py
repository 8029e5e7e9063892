"""Configuration that cannot work refuses to start with one line naming the cause (issue 17).

A broker list is read as a list; a database URL the fleet cannot open says which form works (and never shows
the password); a service that shares the turn ledger refuses a private SQLite file outside development.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from roundtrip._kernel.settings import ConfigurationError, Settings, describe_invalid
from tests.signing import key_environment


def settings(**values) -> Settings:
    return Settings(_env_file=None, **values)


def clean_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_") and k != "ANTHROPIC_API_KEY"}
    return {**env, **values}


def test_a_list_of_brokers_is_a_list():
    s = settings(kafka_bootstrap_servers="h1:9092, h2:9092 ,[::1]:9093")
    assert s.bootstrap_list == ["h1:9092", "h2:9092", "[::1]:9093"]
    assert s.bootstrap_servers == "h1:9092,h2:9092,[::1]:9093"  # aiokafka's clients take the joined form
    assert settings().bootstrap_list == ["127.0.0.1:9092"]  # the embedded broker


@pytest.mark.parametrize(
    "value, says",
    [
        ("h1:9092,,h2:9092", "'' is not host:port"),
        ("h1", "'h1' is not host:port"),
        ("h1:port", "'h1:port' is not host:port"),
        ("h1:70000", "'h1:70000' is not host:port"),
        ("PLAINTEXT://h1:9092", "has a scheme"),
    ],
)
def test_a_broker_list_that_cannot_be_parsed_names_the_entry(value, says):
    with pytest.raises(ValidationError) as refused:
        settings(kafka_bootstrap_servers=value)
    line = describe_invalid(refused.value)
    assert line.startswith("ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS: ") and says in line


@pytest.mark.parametrize(
    "url, wanted",
    [
        ("postgresql://roundtrip:s3cret@db:5432/ledger", "postgresql+asyncpg://"),
        ("postgres://roundtrip:s3cret@db:5432/ledger", "postgresql+asyncpg://"),
        ("postgresql+psycopg2://roundtrip:s3cret@db/ledger", "postgresql+asyncpg://"),
        ("sqlite:////var/lib/ledger.db", "sqlite+aiosqlite://"),
        ("mysql://roundtrip:s3cret@db/ledger", "postgresql+asyncpg://"),
        ("db.internal/ledger", "postgresql+asyncpg://"),
    ],
)
def test_a_database_url_the_fleet_cannot_open_says_which_form_works(url, wanted):
    with pytest.raises(ValidationError) as refused:
        settings(ledger_database_url=url)
    line = describe_invalid(refused.value)
    assert line.startswith("ROUNDTRIP_LEDGER_DATABASE_URL: ") and wanted in line
    assert "s3cret" not in line and "s3cret" not in str(refused.value.errors(include_input=False))


def test_the_working_database_urls_are_taken():
    s = settings(
        ledger_database_url="postgresql+asyncpg://u:p@db/ledger",
        conversations_database_url="sqlite+aiosqlite:///x.db",
        shop_database_url="postgresql+asyncpg://u:p@db/shop",
    )
    assert s.ledger_db_url == "postgresql+asyncpg://u:p@db/ledger"


def test_min_insync_replicas_above_the_replication_factor_is_refused():
    assert settings(replication_factor=3, min_insync_replicas=2).min_insync_replicas == 2
    with pytest.raises(ValidationError) as refused:
        settings(replication_factor=1, min_insync_replicas=2)
    assert "ROUNDTRIP_MIN_INSYNC_REPLICAS: 2 is more than ROUNDTRIP_REPLICATION_FACTOR (1)" in describe_invalid(
        refused.value
    )


def test_a_private_ledger_is_refused_only_outside_development():
    production = settings(kafka_bootstrap_servers="kafka:9092")
    with pytest.raises(ConfigurationError, match="ROUNDTRIP_LEDGER_DATABASE_URL is not set"):
        production.refuse_private_ledger("model")
    settings(
        kafka_bootstrap_servers="kafka:9092", ledger_database_url="postgresql+asyncpg://u:p@db/ledger"
    ).refuse_private_ledger("model")
    settings(kafka_bootstrap_servers="kafka:9092", env="development").refuse_private_ledger("model")
    settings().refuse_private_ledger("executor")  # the embedded broker: the development fleet in one folder


@pytest.mark.parametrize("service", ["model", "executor", "guard"])
def test_a_service_that_shares_the_ledger_refuses_to_start_without_it(service):
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "run", service],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1", **key_environment()),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: {service} refuses to start: ROUNDTRIP_LEDGER_DATABASE_URL is not set"
    )


@pytest.mark.parametrize("command", [["run", "guard"], ["run", "model"], ["up"], ["turns"]])
def test_a_plain_postgresql_url_gives_one_line_and_exit_code_1(command, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", *command],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=clean_env(
            ROUNDTRIP_LEDGER_DATABASE_URL="postgresql://roundtrip:s3cret@127.0.0.1:1/ledger",
            ROUNDTRIP_STATE_DIR=str(tmp_path),
        ),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "error: invalid configuration: ROUNDTRIP_LEDGER_DATABASE_URL: postgresql:// names a driver"
    )
    assert "postgresql+asyncpg://" in lines[0] and "s3cret" not in done.stderr + done.stdout
    assert "Ready." not in done.stdout


def test_an_unparsable_broker_list_stops_every_command_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._cli.main", "run", "gateway"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS="h1:9092;h2:9092"),
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: invalid configuration: ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS: 'h1:9092;h2:9092' is not "
        "host:port; give host:port[,host:port...], e.g. broker-1:9092,broker-2:9092"
    )


def test_hosts_are_names_or_addresses():
    assert settings(
        kafka_bootstrap_servers="b-1.msk.eu-west-1.amazonaws.com:9098,10.0.0.7:9092,[fe80::1]:9092"
    ).bootstrap_list == ["b-1.msk.eu-west-1.amazonaws.com:9098", "10.0.0.7:9092", "[fe80::1]:9092"]
    for bad in ("h 1:9092", "h1:9092;h2:9092", "-h:9092", "[zz]:9092"):
        with pytest.raises(ValidationError):
            settings(kafka_bootstrap_servers=bad)
