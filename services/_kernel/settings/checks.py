"""What a setting must look like to work, and how a refusal is said: one line naming the variable and the cause."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

# The database drivers the fleet runs on (it is asyncio throughout): backend -> the URL scheme to write.
ASYNC_DRIVERS = {
    "postgresql": ("postgresql+asyncpg", "postgresql+asyncpg://user:password@host:5432/ledger"),
    "sqlite": ("sqlite+aiosqlite", "sqlite+aiosqlite:////var/lib/roundtrip/ledger.db"),
}


class ConfigurationError(RuntimeError):
    """Settings with which a service cannot work: it refuses to start, with one line naming the cause."""


class InsecureConfiguration(ConfigurationError):
    """A setting that must not be used outside development (a published key, a PLAINTEXT Kafka, a local user)."""


def env_name(field: str) -> str:
    return "ANTHROPIC_API_KEY" if field == "anthropic_api_key" else f"ROUNDTRIP_{field.upper()}"


# a name, an IPv4 or a [IPv6] address
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?")


def parse_bootstrap_servers(value: str) -> list[str]:
    entries = [entry.strip() for entry in value.split(",")]
    if not any(entries):
        raise ValueError("empty: give host:port[,host:port...], e.g. broker-1:9092,broker-2:9092")
    for entry in entries:
        host, colon, port = entry.rpartition(":")
        if "://" in entry:
            raise ValueError(
                f"{entry!r} has a scheme: give host:port (the security protocol is not part of the address)"
            )
        if not colon or not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"{entry!r} is not host:port; give host:port[,host:port...], e.g. broker-1:9092,broker-2:9092"
            )
    return entries


SECURITY_PROTOCOLS = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SASL_MECHANISMS = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
_IMPORT_STRING = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def existing_file(path: Path | None) -> Path | None:
    """A file this process can read (a certificate, a key, a mounted secret); ValueError naming the path otherwise."""
    if path is None or not str(path).strip():
        return None
    path = path.expanduser()
    if not path.is_file():
        raise ValueError(f"no file {path}")
    try:
        path.open("rb").close()
    except OSError as exc:
        raise ValueError(f"cannot read {path} ({exc.strerror})") from None
    return path


def check_import_string(value: str) -> str:
    if not _IMPORT_STRING.fullmatch(value):
        raise ValueError(f"{value!r} is not module:attribute, e.g. my_package.kafka_auth:TokenProvider")
    return value


def check_kafka_security(s: Any) -> None:
    sasl, tls = s.kafka_security_protocol.startswith("SASL_"), s.kafka_security_protocol.endswith("SSL")
    mechanism, protocol = s.kafka_sasl_mechanism, f"ROUNDTRIP_KAFKA_SECURITY_PROTOCOL={s.kafka_security_protocol}"
    password = s.kafka_sasl_password is not None or s.kafka_sasl_password_file is not None
    if sasl and mechanism is None:
        raise ValueError(
            f"{protocol} needs ROUNDTRIP_KAFKA_SASL_MECHANISM: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"
        )
    if not sasl and (mechanism or s.kafka_sasl_username or password or s.kafka_sasl_oauth_token_provider):
        raise ValueError(
            f"SASL settings are set but {protocol} does not use SASL: set it to SASL_SSL or SASL_PLAINTEXT"
        )
    if not tls and (s.kafka_ssl_cafile or s.kafka_ssl_certfile or s.kafka_ssl_keyfile):
        raise ValueError(
            f"ROUNDTRIP_KAFKA_SSL_* files are set but {protocol} does not use TLS: set it to SSL or SASL_SSL"
        )
    if s.kafka_ssl_keyfile and not s.kafka_ssl_certfile:
        raise ValueError(
            "ROUNDTRIP_KAFKA_SSL_KEYFILE is set without ROUNDTRIP_KAFKA_SSL_CERTFILE (the certificate it belongs to)"
        )
    if s.kafka_sasl_password is not None and s.kafka_sasl_password_file is not None:
        raise ValueError("both ROUNDTRIP_KAFKA_SASL_PASSWORD and ROUNDTRIP_KAFKA_SASL_PASSWORD_FILE are set: keep one")
    if mechanism == "OAUTHBEARER":
        if not s.kafka_sasl_oauth_token_provider:
            raise ValueError(
                "ROUNDTRIP_KAFKA_SASL_MECHANISM=OAUTHBEARER needs ROUNDTRIP_KAFKA_SASL_OAUTH_TOKEN_PROVIDER "
                "(module:attribute)"
            )
        if s.kafka_sasl_username or password:
            raise ValueError(
                "OAUTHBEARER takes its token from ROUNDTRIP_KAFKA_SASL_OAUTH_TOKEN_PROVIDER, not a username or password"
            )
    elif mechanism:
        if s.kafka_sasl_oauth_token_provider:
            raise ValueError(f"ROUNDTRIP_KAFKA_SASL_OAUTH_TOKEN_PROVIDER is for OAUTHBEARER, not {mechanism}")
        if not s.kafka_sasl_username or not password:
            raise ValueError(
                f"{mechanism} needs ROUNDTRIP_KAFKA_SASL_USERNAME and ROUNDTRIP_KAFKA_SASL_PASSWORD (or _PASSWORD_FILE)"
            )


def check_database_url(value: str) -> str:
    """A URL the fleet's async engines can open; ValueError showing only the scheme (the rest may carry a password)."""
    scheme, sep, _ = value.partition("://")
    if not sep:
        raise ValueError("not a database URL; write " + " or ".join(example for _, example in ASYNC_DRIVERS.values()))
    backend = scheme.split("+", 1)[0].lower()
    if backend == "postgres":
        backend = "postgresql"
    if backend not in ASYNC_DRIVERS:
        raise ValueError(
            f"{scheme}:// is not supported; write " + " or ".join(example for _, example in ASYNC_DRIVERS.values())
        )
    wanted, example = ASYNC_DRIVERS[backend]
    if scheme.lower() != wanted:
        raise ValueError(
            f"{scheme}:// names a driver the fleet does not use (it is asyncio throughout); write {wanted}://..., "
            f"e.g. {example}"
        )
    return value


def describe_invalid(error: ValidationError, named: Callable[[str], str] = env_name) -> str:
    """One line per invalid setting, named by its environment variable: what `roundtrip` prints, not a traceback."""
    lines = []
    for item in error.errors(include_input=False):
        message = item.get("msg", "invalid").removeprefix("Value error, ")
        # a check of several settings together (no location) names its variables itself
        lines.append(f"{named(str(item['loc'][0]))}: {message}" if item.get("loc") else message)
    return "; ".join(lines)


def env_name_in(settings_class: Any) -> Callable[[str], str]:
    """field -> the environment variable a pydantic-settings class reads it from (its alias, else env_prefix + name)."""
    config = getattr(settings_class, "model_config", {}) or {}
    fields = getattr(settings_class, "model_fields", {}) or {}
    prefix = config.get("env_prefix", "") or ""

    def named(field: str) -> str:
        info = fields.get(field)
        alias = getattr(info, "validation_alias", None) or getattr(info, "alias", None)
        if isinstance(alias, str):
            return alias if config.get("case_sensitive") else alias.upper()
        name = f"{prefix}{field}"
        return name if config.get("case_sensitive") else name.upper()

    return named
