"""Which failures mean "a dependency is away: try again later" and which mean "this message cannot be processed".

The one place the fleet classifies a failure (docs/faults.md, "Retry later or dead letter"). A handler
that raises hands its record to the kernel's message path (services/_kernel/kafka/messaging.py), which asks
`unavailable(exc)`:

* **a dependency** (its name, one of DEPENDENCIES): the database refused the connection, dropped it,
  is starting up or shutting down, is locked by another writer; the broker is away (aiokafka's
  retriable errors); an HTTP backend (an agent's service, an MCP server over HTTP) did not answer or answered
  502, 503, 504 or 429; the Messages API's connection failed, timed out or it answered 429, 5xx or 529.
  The record is retried, its consumer paused until the dependency answers again (KeyOrderedConsumer); unless the
  failure is a **backend's** (`RetryLater(..., backend=True)`: a system of the agent's, reached by a resolver, a
  policy or a tool): then only the record's key (its conversation) waits, the other keys go on.
* **None**: the message fails for what it is (bad JSON, a schema violation, a bug the message
  triggers, an HTTP 4xx, a constraint the database refuses): it goes to the dead-letter topic. A bare
  `TimeoutError` counts as a dependency's only when a client's code raised it (the handler's own `wait_for`
  timing out may be the message's doing, and a record retried for ever would hold its consumer).

The rule reads the whole failure: the exception, its cause and context, SQLAlchemy's wrapped driver
error (`orig`), and every leaf of an exception group (unavailable only when each leaf that is not
asyncio's CancelledError is). It imports none of the clients: it knows them by the modules their types live in,
so it costs nothing in a process that does not use them.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterator

DATABASE, KAFKA, HTTP, MODEL, NETWORK = "database", "kafka", "http", "model", "network"
DEPENDENCIES = (DATABASE, KAFKA, HTTP, MODEL, NETWORK)

# PostgreSQL's SQLSTATEs of a server that is away, restarting or out of room for a connection:
# class 08 (connection exception), 57P01-57P03 (admin/crash shutdown, cannot connect now),
# 53300 (too many connections), 40001/40P01 (serialization failure, deadlock: run it again).
_PG_UNAVAILABLE = ("08", "57P01", "57P02", "57P03", "53300", "40001", "40P01")
# SQLite's: another process holds the lock, or the file cannot be reached right now.
_SQLITE_UNAVAILABLE = ("database is locked", "database is busy", "disk i/o error", "unable to open database file")
# what asyncpg and SQLAlchemy say of a connection that broke under them
_BROKEN_CONNECTION = ("connection is closed", "connection was closed", "the underlying connection is closed")
_KAFKA_AWAY = ("KafkaConnectionError", "KafkaTimeoutError", "NodeNotReadyError", "RequestTimedOutError")
_HTTP_RETRY_STATUSES = frozenset({429, 502, 503, 504, 529})
_NETWORK_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.EHOSTUNREACH, errno.ENETUNREACH}
    | {errno.ENETDOWN, errno.ETIMEDOUT, errno.EHOSTDOWN}
)
_DEPTH = 16  # how far along causes and contexts the rule looks (a cycle or a very deep chain ends there)


class RetryLater(Exception):
    """A record's handler failed because `dependency` is unavailable: retry the record, do not dead-letter it.

    `backend`: the dependency is one of the agent's backends (the company's systems, reached on behalf of one
    conversation), not the fleet's own (the ledger, the broker, the Messages API): the consumer holds only the
    record's key instead of pausing. `until`: the wall-clock time (epoch seconds, the turn's deadline) after which the
    handler answers the record without the backend, so the consumer tries it again right then."""

    def __init__(self, dependency: str, reason: str, *, backend: bool = False, until: float | None = None) -> None:
        super().__init__(f"{dependency} unavailable: {reason}")
        self.dependency = dependency
        self.reason = reason
        self.backend = backend
        self.until = until


def of_backend(exc: BaseException) -> RetryLater | None:
    """The backend's `RetryLater` that `exc` is or was raised from (`raise ... from`; every leaf's, for a group), or
    None: a failure that does not say it is a backend's is the fleet's (the conservative answer: the whole consumer
    waits). Only explicit causes count: the ledger failing while a handler handled a backend's outage is the
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
    """The dependency `exc` says is unavailable (one of DEPENDENCIES), or None when the failure is the message's."""
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
    """`exc`, then what SQLAlchemy wrapped (`orig`), its explicit cause, its context, in that order."""
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


# the clients whose errors (or code) say which dependency is away, by the module they live in
_CLIENTS = (
    (("sqlalchemy", "asyncpg", "sqlite3", "psycopg"), DATABASE),
    (("aiokafka",), KAFKA),
    (("anthropic",), MODEL),
    (("httpx",), HTTP),
)


def _client_of(module: str) -> str | None:
    """The dependency a client's module speaks for; None for any other module."""
    return next((dependency for prefixes, dependency in _CLIENTS if module.startswith(prefixes)), None)


def _origin(exc: BaseException) -> str | None:
    """The client the outermost error came from: a connection refused under SQLAlchemy is the database's."""
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
    """One link of the chain, on its own."""
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
        return NETWORK  # a stream (an MCP session's) closed under its user
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
    if name == "TimeoutError":  # the pool had no connection to give within its timeout
        return DATABASE
    if name in ("OperationalError", "InterfaceError", "DBAPIError", "InternalError"):
        state = _sqlstate(getattr(exc, "orig", None))
        if state is not None and state.startswith(_PG_UNAVAILABLE):
            return DATABASE
        if _says(exc, _SQLITE_UNAVAILABLE) or _broken(exc):
            return DATABASE
    return None  # an IntegrityError, a ProgrammingError, ...: the statement's (the message's) fault


def _anthropic(exc: BaseException) -> str | None:
    if type(exc).__name__ in ("APIConnectionError", "APITimeoutError"):
        return MODEL
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status in _HTTP_RETRY_STATUSES or status >= 500):
        return MODEL
    return None


def _httpx(exc: BaseException) -> str | None:
    import httpx  # loaded already: the error is one of its own

    if isinstance(exc, httpx.TransportError):  # connect, read, write, timeouts, a protocol error of the peer
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
