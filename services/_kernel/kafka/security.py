"""The Kafka security settings as aiokafka's keyword arguments and FastStream's `security`; `{}` for PLAINTEXT.
Nothing here logs: the password and the tokens stay in the options the clients are built with.
"""

from __future__ import annotations

import importlib
import ssl
from functools import lru_cache
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.helpers import create_ssl_context
from faststream.security import BaseSecurity, SASLOAuthBearer, SASLPlaintext, SASLScram256, SASLScram512

from roundtrip._kernel.settings import ConfigurationError, KafkaSecurity

_SASL = {"PLAIN": SASLPlaintext, "SCRAM-SHA-256": SASLScram256, "SCRAM-SHA-512": SASLScram512}


def client_options(s: KafkaSecurity) -> dict[str, Any]:
    protocol = s.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol.endswith("SSL"):
        options["ssl_context"] = ssl_context(s)
    if protocol.startswith("SASL_"):
        options["sasl_mechanism"] = s.kafka_sasl_mechanism
        if s.kafka_sasl_mechanism == "OAUTHBEARER":
            options["sasl_oauth_token_provider"] = token_provider(s.kafka_sasl_oauth_token_provider)
        else:
            options["sasl_plain_username"], options["sasl_plain_password"] = s.kafka_sasl_username, sasl_password(s)
    return options


def broker_options(options: dict[str, Any]) -> dict[str, Any]:
    """FastStream's KafkaBroker arguments: its `security` object and the token provider it takes beside it."""
    if not options:
        return {}
    context, mechanism = options.get("ssl_context"), options.get("sasl_mechanism")
    use_ssl = options["security_protocol"].endswith("SSL")
    if mechanism is None:
        return {"security": BaseSecurity(ssl_context=context, use_ssl=use_ssl)}
    if mechanism == "OAUTHBEARER":
        return {
            "security": SASLOAuthBearer(ssl_context=context, use_ssl=use_ssl),
            "sasl_oauth_token_provider": options["sasl_oauth_token_provider"],
        }
    security = _SASL[mechanism](
        options["sasl_plain_username"], options["sasl_plain_password"], ssl_context=context, use_ssl=use_ssl
    )
    return {"security": security}


def sasl_password(s: KafkaSecurity) -> str | None:
    if s.kafka_sasl_password is not None:
        return s.kafka_sasl_password.get_secret_value()
    if s.kafka_sasl_password_file is not None:
        lines = s.kafka_sasl_password_file.read_text().splitlines()
        return lines[0] if lines else ""
    return None


def ssl_context(s: KafkaSecurity) -> ssl.SSLContext:
    """A client TLS context: the brokers' certificates and host names checked; a client certificate makes it mTLS."""
    try:
        return create_ssl_context(  # type: ignore[no-any-return]  # aiokafka ships no types
            cafile=str(s.kafka_ssl_cafile) if s.kafka_ssl_cafile else None,
            certfile=str(s.kafka_ssl_certfile) if s.kafka_ssl_certfile else None,
            keyfile=str(s.kafka_ssl_keyfile) if s.kafka_ssl_keyfile else None,
            password=s.kafka_ssl_key_password.get_secret_value() if s.kafka_ssl_key_password else None,
        )
    except (ssl.SSLError, OSError) as exc:
        files = ", ".join(
            f"{name}={path}"
            for name, path in (
                ("ROUNDTRIP_KAFKA_SSL_CAFILE", s.kafka_ssl_cafile),
                ("ROUNDTRIP_KAFKA_SSL_CERTFILE", s.kafka_ssl_certfile),
                ("ROUNDTRIP_KAFKA_SSL_KEYFILE", s.kafka_ssl_keyfile),
            )
            if path
        )
        raise ConfigurationError(f"cannot load the Kafka TLS files ({files or 'the system CAs'}): {exc}") from None


@lru_cache
def token_provider(spec: str) -> AbstractTokenProvider:
    """The OAUTHBEARER token provider `module:attribute` names (or a callable making one), shared in the process."""
    module_name, _, attribute = spec.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"ROUNDTRIP_KAFKA_SASL_OAUTH_TOKEN_PROVIDER={spec}: cannot import it ({exc})"
        ) from None
    provider = found if isinstance(found, AbstractTokenProvider) else found() if callable(found) else None
    if not isinstance(provider, AbstractTokenProvider):
        raise ConfigurationError(
            f"ROUNDTRIP_KAFKA_SASL_OAUTH_TOKEN_PROVIDER={spec}: neither an aiokafka AbstractTokenProvider "
            "nor a callable returning one"
        )
    return provider
