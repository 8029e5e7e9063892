"""What a setting must look like to work, and how a refusal is said: one line naming the variable and the cause."""

from __future__ import annotations

import re

from pydantic import ValidationError

# The database drivers the fleet runs on (it is asyncio throughout): backend -> the URL scheme to write.
ASYNC_DRIVERS = {
    "postgresql": ("postgresql+asyncpg", "postgresql+asyncpg://user:password@host:5432/ledger"),
    "sqlite": ("sqlite+aiosqlite", "sqlite+aiosqlite:////var/lib/roundtrip/ledger.db"),
}


class ConfigurationError(RuntimeError):
    """Settings with which a service cannot work: it refuses to start, with one line naming the cause."""


class InsecureConfiguration(ConfigurationError):
    """A setting that must not be used outside development (the published approval key)."""


def env_name(field: str) -> str:
    """The environment variable of a setting: ROUNDTRIP_<FIELD>, and the SDK's own name for the API key."""
    return "ANTHROPIC_API_KEY" if field == "anthropic_api_key" else f"ROUNDTRIP_{field.upper()}"


_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?")  # a name, an IPv4 or a [IPv6] address


def parse_bootstrap_servers(value: str) -> list[str]:
    """`h1:9092,h2:9092` (spaces allowed) -> ["h1:9092", "h2:9092"]; ValueError naming the entry that is not host:port."""
    entries = [entry.strip() for entry in value.split(",")]
    if not any(entries):
        raise ValueError("empty: give host:port[,host:port...], e.g. broker-1:9092,broker-2:9092")
    for entry in entries:
        host, colon, port = entry.rpartition(":")
        if "://" in entry:
            raise ValueError(f"{entry!r} has a scheme: give host:port (the security protocol is not part of the address)")
        if not colon or not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{entry!r} is not host:port; give host:port[,host:port...], e.g. broker-1:9092,broker-2:9092")
    return entries


def check_database_url(value: str) -> str:
    """A URL the fleet's async engines can open: postgresql+asyncpg:// or sqlite+aiosqlite://; ValueError saying which
    form works otherwise. The message shows only the scheme, never the rest (it may carry a password)."""
    scheme, sep, _ = value.partition("://")
    if not sep:
        raise ValueError("not a database URL; write " + " or ".join(example for _, example in ASYNC_DRIVERS.values()))
    backend = scheme.split("+", 1)[0].lower()
    if backend == "postgres":
        backend = "postgresql"
    if backend not in ASYNC_DRIVERS:
        raise ValueError(f"{scheme}:// is not supported; write " + " or ".join(example for _, example in ASYNC_DRIVERS.values()))
    wanted, example = ASYNC_DRIVERS[backend]
    if scheme.lower() != wanted:
        raise ValueError(f"{scheme}:// names a driver the fleet does not use (it is asyncio throughout); write {wanted}://..., "
                         f"e.g. {example}")
    return value


def describe_invalid(error: ValidationError) -> str:
    """One line per invalid setting, named by its environment variable: what `roundtrip` prints instead of a traceback."""
    lines = []
    for item in error.errors():
        variable = env_name(str(item["loc"][0])) if item.get("loc") else "?"
        message = item.get("msg", "invalid").removeprefix("Value error, ")
        lines.append(f"{variable}: {message}")
    return "; ".join(lines)
