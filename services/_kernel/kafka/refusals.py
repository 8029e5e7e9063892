"""Why Kafka refused this process, in one line: aiokafka reports a refusal as "Unable to bootstrap", like a broker
that is down, so `refusal` connects once more to each server and names the cause, never a password or a token.
"""

from __future__ import annotations

import asyncio
import ssl

from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)

from roundtrip._kernel.kafka.clients import KafkaClients

AUTHORIZATION_ERRORS = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)


async def refusal(kafka: KafkaClients, timeout: float = 10.0) -> str | None:
    """The cause a bootstrap server gave for refusing this client, or None when none refused it (unreachable)."""
    for server in kafka.bootstrap_list:
        host, _, port = server.rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host.strip("[]"), int(port), request_timeout_ms=int(timeout * 1000), **kafka.security),
                timeout,
            )
        except Exception as exc:  # noqa: BLE001 - every failure is classified; an unknown one is "unreachable"
            if (cause := _cause(kafka, exc)) is not None:
                return cause
            continue
        conn.close()
    return None


def _cause(kafka: KafkaClients, exc: BaseException) -> str | None:
    if isinstance(exc.__cause__, ssl.SSLError):  # aiokafka's "connection closed" after the broker's TLS alert
        exc = exc.__cause__
    mechanism, user = kafka.security.get("sasl_mechanism"), kafka.security.get("sasl_plain_username")
    who = f"SASL {mechanism}" + (f" as {user!r}" if user else "")
    if isinstance(exc, (SaslAuthenticationFailed, AuthenticationFailedError)):
        return f"authentication failed ({who}): {_message(exc)}; check ROUNDTRIP_KAFKA_SASL_USERNAME and the password"
    if isinstance(exc, UnsupportedSaslMechanismError):
        return (
            f"the broker does not accept {who} on this listener ({_message(exc)}); check ROUNDTRIP_KAFKA_SASL_MECHANISM"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"the broker's TLS certificate is not trusted ({exc.verify_message}); set ROUNDTRIP_KAFKA_SSL_CAFILE to "
            "the "
            "CA that signed it"
        )
    if isinstance(exc, ssl.SSLError) and "CERTIFICATE" in str(exc.reason or ""):
        return (
            f"the TLS handshake failed: the broker refused this client's certificate or its absence ({exc.reason}); "
            "a listener that requires client certificates needs ROUNDTRIP_KAFKA_SSL_CERTFILE and _KEYFILE signed by a "
            "CA it trusts"
        )
    if isinstance(exc, ssl.SSLError):
        return f"the TLS handshake failed ({exc.reason or exc}); is this a TLS listener (SSL, SASL_SSL)?"
    if isinstance(exc, KafkaError) and not getattr(exc, "retriable", False):
        return f"{type(exc).__name__}: {_message(exc)}"
    return None


def authorization(exc: BaseException) -> str | None:
    if isinstance(exc, AUTHORIZATION_ERRORS):
        return (
            f"Kafka refused an operation: {type(exc).__name__} ({_message(exc)}); this principal lacks an ACL it needs"
        )
    return None


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or getattr(exc, "description", "") or type(exc).__name__
    return text.splitlines()[0]
