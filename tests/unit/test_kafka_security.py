"""The Kafka security settings: refused when they do not fit, the same options for every client, never shown."""

from __future__ import annotations

import ssl

import pytest
from aiokafka.abc import AbstractTokenProvider
from faststream.kafka.security import parse_security
from pydantic import ValidationError

from roundtrip._kernel.kafka.clients import KafkaClients, clients_of, kafka_clients
from roundtrip._kernel.kafka.security import broker_options, client_options, sasl_password
from roundtrip._kernel.settings import ConfigurationError, Settings, describe_invalid
from roundtrip._kernel.settings.display import render


class Provider(AbstractTokenProvider):
    async def token(self) -> str:
        return "t"


PROVIDER = Provider()


def make_provider() -> Provider:
    return Provider()


def settings(**values) -> Settings:
    return Settings(_env_file=None, kafka_bootstrap_servers="k1:9093,k2:9093", **values)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "needs ROUNDTRIP_KAFKA_SASL_MECHANISM"),
        (
            {
                "kafka_security_protocol": "SASL_SSL",
                "kafka_sasl_mechanism": "SCRAM-SHA-512",
                "kafka_sasl_username": "u",
            },
            "SCRAM-SHA-512 needs ROUNDTRIP_KAFKA_SASL_USERNAME and ROUNDTRIP_KAFKA_SASL_PASSWORD",
        ),
        (
            {"kafka_sasl_mechanism": "PLAIN", "kafka_sasl_username": "u", "kafka_sasl_password": "p"},
            "does not use SASL",
        ),
        (
            {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "OAUTHBEARER"},
            "needs ROUNDTRIP_KAFKA_SASL_OAUTH_TOKEN_PROVIDER",
        ),
        (
            {
                "kafka_security_protocol": "SASL_SSL",
                "kafka_sasl_mechanism": "OAUTHBEARER",
                "kafka_sasl_oauth_token_provider": "x",
            },
            "ROUNDTRIP_KAFKA_SASL_OAUTH_TOKEN_PROVIDER: 'x' is not module:attribute",
        ),
        (
            {"kafka_security_protocol": "SSL", "kafka_ssl_cafile": "/no/such/ca.pem"},
            "ROUNDTRIP_KAFKA_SSL_CAFILE: no file /no/such/ca.pem",
        ),
        (
            {"kafka_security_protocol": "sasl_ssl", "kafka_sasl_mechanism": "GSSAPI"},
            "ROUNDTRIP_KAFKA_SASL_MECHANISM: Input should be",
        ),
        ({"kafka_security_protocol": "SSL", "kafka_sasl_password": "p"}, "does not use SASL"),
    ],
)
def test_settings_that_do_not_fit_are_refused_in_one_line_naming_them(values, named):
    with pytest.raises(ValidationError) as refused:
        settings(**values)
    line = describe_invalid(refused.value)
    assert named in line and "\n" not in line


def test_plaintext_is_the_default_and_adds_nothing_to_any_client():
    kafka = kafka_clients(settings())
    assert kafka == KafkaClients("k1:9093,k2:9093") and kafka.security == {} and kafka.broker_options == {}
    assert clients_of("h:1") == KafkaClients("h:1")


async def test_scram_over_tls_gives_aiokafka_and_faststream_the_same_connection():
    s = settings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="svc",
        kafka_sasl_password="s3cret-pw",
    )
    options = client_options(s)
    assert options["security_protocol"] == "SASL_SSL" and isinstance(options["ssl_context"], ssl.SSLContext)
    assert options["ssl_context"].verify_mode == ssl.CERT_REQUIRED and options["ssl_context"].check_hostname
    assert (options["sasl_mechanism"], options["sasl_plain_username"], options["sasl_plain_password"]) == (
        "SCRAM-SHA-512",
        "svc",
        "s3cret-pw",
    )
    assert parse_security(broker_options(options)["security"]) == options  # what FastStream hands aiokafka is the same
    producer = kafka_clients(s).producer()
    assert producer.client._security_protocol == "SASL_SSL" and producer.client._sasl_mechanism == "SCRAM-SHA-512"


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_sasl_without_tls_has_no_ssl_context(mechanism):
    options = client_options(
        settings(
            kafka_security_protocol="SASL_PLAINTEXT",
            kafka_sasl_mechanism=mechanism,
            kafka_sasl_username="u",
            kafka_sasl_password="p",
        )
    )
    assert "ssl_context" not in options
    assert parse_security(broker_options(options)["security"]) == {**options, "ssl_context": None}


def test_the_password_can_come_from_a_mounted_file(tmp_path):
    (tmp_path / "password").write_text("from-a-file\n")
    s = settings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="u",
        kafka_sasl_password_file=tmp_path / "password",
    )
    assert sasl_password(s) == "from-a-file"


@pytest.mark.parametrize("spec", [f"{__name__}:PROVIDER", f"{__name__}:make_provider", f"{__name__}:Provider"])
def test_oauthbearer_takes_a_provider_or_a_factory_by_import_string(spec):
    options = client_options(
        settings(
            kafka_security_protocol="SASL_PLAINTEXT",
            kafka_sasl_mechanism="OAUTHBEARER",
            kafka_sasl_oauth_token_provider=spec,
        )
    )
    assert isinstance(options["sasl_oauth_token_provider"], Provider)
    broker = broker_options(options)
    assert broker["sasl_oauth_token_provider"] is options["sasl_oauth_token_provider"]
    assert parse_security(broker["security"])["sasl_mechanism"] == "OAUTHBEARER"


def test_a_provider_that_cannot_be_imported_is_one_line():
    s = settings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="OAUTHBEARER",
        kafka_sasl_oauth_token_provider="no_such_module_here:Provider",
    )
    with pytest.raises(
        ConfigurationError,
        match="ROUNDTRIP_KAFKA_SASL_OAUTH_TOKEN_PROVIDER=no_such_module_here:Provider: cannot import",
    ):
        client_options(s)


def test_mtls_files_that_are_not_pem_are_one_line(tmp_path):
    (tmp_path / "cert.pem").write_text("not a certificate")
    s = settings(kafka_security_protocol="SSL", kafka_ssl_certfile=tmp_path / "cert.pem")
    with pytest.raises(ConfigurationError, match=r"cannot load the Kafka TLS files .*ROUNDTRIP_KAFKA_SSL_CERTFILE="):
        client_options(s)


def test_roundtrip_config_never_shows_the_passwords():
    shown = render(
        settings(
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism="PLAIN",
            kafka_sasl_username="svc",
            kafka_sasl_password="s3cret-pw",
        ),
        [],
    )
    assert "s3cret-pw" not in shown
    assert any(line.split() == ["ROUNDTRIP_KAFKA_SASL_PASSWORD", "***"] for line in shown.splitlines())
    assert any(line.split() == ["ROUNDTRIP_KAFKA_SASL_USERNAME", "svc"] for line in shown.splitlines())
    assert "s3cret-pw" not in repr(
        kafka_clients(
            settings(
                kafka_security_protocol="SASL_SSL",
                kafka_sasl_mechanism="PLAIN",
                kafka_sasl_username="svc",
                kafka_sasl_password="s3cret-pw",
            )
        )
    )
