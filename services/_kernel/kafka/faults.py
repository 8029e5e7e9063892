"""Which failures mean "a dependency is away: try again later" and which "this message cannot be processed".

The one place the fleet classifies a failure (docs/faults.md, "Retry later or dead letter"). The rule is narrow on
purpose: a message's own fault taken for an outage would hold its consumer for good, so a bare `TimeoutError` is a
dependency's only when a client's code raised it. It knows the clients by their modules, so it imports none of them.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator

DATABASE, KAFKA, HTTP, MODEL, NETWORK = "database", "kafka", "http", "model", "network"
DEPENDENCIES = (DATABASE, KAFKA, HTTP, MODEL, NETWORK)

# class 08 (connection), 57P01-57P03 (shutting down, starting up), 53300 (too many connections), 40001/40P01
_PG_UNAVAILABLE = ("08", "57P01", "57P02", "57P03", "53300", "40001", "40P01")
_SQLITE_UNAVAILABLE = ("database is locked", "database is busy", "disk i/o error", "unable to open database file")
_BROKEN_CONNECTION = ("connection is closed", "connection was closed", "the underlying connection is closed")
_KAFKA_AWAY = ("KafkaConnectionError", "KafkaTimeoutError", "NodeNotReadyError", "RequestTimedOutError")
_HTTP_RETRY_STATUSES = frozenset({429, 502, 503, 504, 529})
_NETWORK_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.EHOSTUNREACH, errno.ENETUNREACH}
    | {errno.ENETDOWN, errno.ETIMEDOUT, errno.EHOSTDOWN}
)
_DEPTH = 16


class RetryLater(Exception):
    """A record's handler failed because `dependency` is unavailable: retry the record, do not dead-letter it.

    `backend`: one of the agent's systems, not the fleet's own, so only the record's key waits instead of the whole
    consumer. `until`: the epoch time (the turn's deadline) when the handler answers without it: tried again then."""

    def __init__(self, dependency: str, reason: str, *, backend: bool, until: float | None = None) -> None:
        super().__init__(f"{dependency} unavailable: {reason}")
        self.dependency = dependency
        self.reason = reason
        self.backend = backend
        self.until = until


def of_backend(exc: BaseException) -> RetryLater | None:
    """The backend's `RetryLater` that `exc` is or was raised `from`, or None: then it is the fleet's (the
    conservative answer). Only explicit causes count: the ledger failing while handling a backend's outage is the
    ledger's."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        found = [of_backend(e) for e in leaves]
        return found[0] if found and all(found) else None
    link: BaseException | None = exc
    for _ in range(_DEPTH):
        if link is None:
            return None
        if isinstance(link, RetryLater):
            return link if link.backend else None
        link = link.__cause__
    return None


def unavailable(exc: BaseException) -> str | None:
    try:
        return _classify(exc, 0)
    except Exception:  # noqa: BLE001 - classifying must never fail: unknown means "the message's"
        return None


def _classify(exc: BaseException, depth: int) -> str | None:
    if depth > _DEPTH:
        return None
    if isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        found = [_classify(e, depth + 1) for e in leaves]
        return found[0] if found and all(found) else None
    if isinstance(exc, RetryLater):
        return exc.dependency
    seen: set[int] = set()
    for link in _chain(exc):
        if id(link) in seen:
            break
        seen.add(id(link))
        if isinstance(link, BaseExceptionGroup):
            return _classify(link, depth + 1)
        if (dependency := _one(link)) is not None:
            return _origin(exc) or dependency
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    current: BaseException | None = exc
    for _ in range(_DEPTH):
        if current is None:
            return
        yield current
        orig = getattr(current, "orig", None)
        if isinstance(orig, BaseException) and orig is not current:
            yield orig
            nested = orig.__cause__ or orig.__context__
            if nested is not None:
                yield nested
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


_CLIENTS = (
    (("sqlalchemy", "asyncpg", "sqlite3", "psycopg"), DATABASE),
    (("aiokafka",), KAFKA),
    (("anthropic",), MODEL),
    (("httpx",), HTTP),
)


def _client_of(module: str) -> str | None:
    return next((dependency for prefixes, dependency in _CLIENTS if module.startswith(prefixes)), None)


def _origin(exc: BaseException) -> str | None:
    for link in _chain(exc):
        if (dependency := _client_of(type(link).__module__)) is not None:
            return dependency
    return _raised_in(exc)


def _raised_in(exc: BaseException) -> str | None:
    """The client whose code raised `exc` (a bare ConnectionRefusedError from asyncpg's connect), by its frames."""
    frames = exc.__traceback__
    found = None
    for _ in range(200):
        if frames is None:
            break
        found = _client_of(str(frames.tb_frame.f_globals.get("__name__", ""))) or found
        frames = frames.tb_next
    return found


def _one(exc: BaseException) -> str | None:
    module = type(exc).__module__
    if module.startswith("sqlalchemy"):
        return _sqlalchemy(exc)
    if module.startswith(("asyncpg", "psycopg")) or _sqlstate(exc) is not None:
        state = _sqlstate(exc)
        if state is not None and state.startswith(_PG_UNAVAILABLE):
            return DATABASE
        if type(exc).__name__ in ("ConnectionDoesNotExistError", "InterfaceError", "ConnectionFailureError"):
            return DATABASE if _broken(exc) or type(exc).__name__ != "InterfaceError" else None
        return None
    if module.startswith("sqlite3"):
        return DATABASE if _says(exc, _SQLITE_UNAVAILABLE) else None
    if module.startswith("aiokafka"):
        return KAFKA if getattr(exc, "retriable", False) or type(exc).__name__ in _KAFKA_AWAY else None
    if module.startswith("anthropic"):
        return _anthropic(exc)
    if module.startswith("httpx"):
        return _httpx(exc)
    if module.startswith("anyio") and type(exc).__name__ in ("ClosedResourceError", "BrokenResourceError"):
        return NETWORK
    if isinstance(exc, (ConnectionError, socket.gaierror)):
        return NETWORK
    if isinstance(exc, TimeoutError):  # a client's timeout is its dependency's; a handler's own wait_for is not
        return _raised_in(exc)
    if isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS:
        return NETWORK
    return None


def _sqlalchemy(exc: BaseException) -> str | None:
    name = type(exc).__name__
    if getattr(exc, "connection_invalidated", False):
        return DATABASE
    if name == "TimeoutError":  # the pool had no connection to give
        return DATABASE
    if name in ("OperationalError", "InterfaceError", "DBAPIError", "InternalError"):
        state = _sqlstate(getattr(exc, "orig", None))
        if state is not None and state.startswith(_PG_UNAVAILABLE):
            return DATABASE
        if _says(exc, _SQLITE_UNAVAILABLE) or _broken(exc):
            return DATABASE
    return None


def _anthropic(exc: BaseException) -> str | None:
    if type(exc).__name__ in ("APIConnectionError", "APITimeoutError"):
        return MODEL
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status in _HTTP_RETRY_STATUSES or status >= 500):
        return MODEL
    return None


def _httpx(exc: BaseException) -> str | None:
    import httpx  # already loaded: the error is one of its own

    if isinstance(exc, httpx.TransportError):
        return HTTP
    if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in _HTTP_RETRY_STATUSES:
        return HTTP
    return None


def _sqlstate(exc: object) -> str | None:
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return state if isinstance(state, str) and len(state) == 5 else None


def _broken(exc: BaseException) -> bool:
    return _says(exc, _BROKEN_CONNECTION)


def _says(exc: BaseException, phrases: tuple[str, ...]) -> bool:
    try:
        text = str(exc).lower()
    except Exception:  # noqa: BLE001
        return False
    return any(p in text for p in phrases)
