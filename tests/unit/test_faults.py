"""The one rule of retry-later against dead letter (services/_kernel/kafka/faults.py), per class of failure, with the
clients' own exception types; and what the key-ordered consumer and the message path do with a retry-later."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from types import SimpleNamespace

import anthropic
import asyncpg
import httpx
import pytest
import sqlalchemy.exc
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError
from prometheus_client import REGISTRY
from pydantic import BaseModel, ValidationError

from roundtrip._kernel.kafka import consumer as consumer_module
from roundtrip._kernel.kafka import faults
from tests.consumers import key_ordered

TP = TopicPartition("t", 0)
REQUEST = httpx.Request("POST", "http://shop.local/orders/o1/cancel")


def raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """`exc` as a raise leaves it (traceback, cause)."""
    try:
        if cause is not None:
            raise exc from cause
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def wrapped_by_sqlalchemy(orig: BaseException, kind=sqlalchemy.exc.OperationalError) -> BaseException:
    return raised(kind("SELECT 1", {}, orig), orig)


class Shape(BaseModel):
    n: int


def validation_error() -> ValidationError:
    try:
        Shape.model_validate({"n": "x"})
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "exc",
    [
        wrapped_by_sqlalchemy(sqlite3.OperationalError("database is locked")),
        wrapped_by_sqlalchemy(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")),
        wrapped_by_sqlalchemy(asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle")),
        wrapped_by_sqlalchemy(asyncpg.exceptions.CannotConnectNowError("the database system is starting up")),
        wrapped_by_sqlalchemy(
            asyncpg.exceptions.AdminShutdownError("terminating connection"), sqlalchemy.exc.DBAPIError
        ),
        wrapped_by_sqlalchemy(asyncpg.exceptions.InterfaceError("connection is closed"), sqlalchemy.exc.InterfaceError),
        wrapped_by_sqlalchemy(asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients")),
        raised(asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")),
        raised(sqlalchemy.exc.TimeoutError("QueuePool limit reached, connection timed out")),
    ],
    ids=[
        "sqlite-locked",
        "pg-refused",
        "pg-dropped",
        "pg-starting",
        "pg-shutdown",
        "pg-closed",
        "pg-full",
        "asyncpg",
        "pool-timeout",
    ],
)
def test_a_database_that_is_away_is_retried_later(exc):
    assert faults.unavailable(exc) == faults.DATABASE


@pytest.mark.parametrize(
    "exc",
    [
        wrapped_by_sqlalchemy(sqlite3.IntegrityError("UNIQUE constraint failed"), sqlalchemy.exc.IntegrityError),
        wrapped_by_sqlalchemy(asyncpg.exceptions.UniqueViolationError("duplicate key"), sqlalchemy.exc.IntegrityError),
        wrapped_by_sqlalchemy(asyncpg.exceptions.UndefinedColumnError("no column"), sqlalchemy.exc.ProgrammingError),
        wrapped_by_sqlalchemy(sqlite3.OperationalError("no such table: turns")),
        wrapped_by_sqlalchemy(
            asyncpg.exceptions.InterfaceError("the server expects 2 arguments"), sqlalchemy.exc.InterfaceError
        ),
    ],
    ids=["sqlite-unique", "pg-unique", "pg-column", "sqlite-no-table", "pg-arguments"],
)
def test_a_statement_the_database_refuses_is_the_messages_fault(exc):
    assert faults.unavailable(exc) is None


def test_the_broker_away_is_retried_and_a_record_too_large_is_not():
    assert faults.unavailable(raised(KafkaConnectionError("no broker"))) == faults.KAFKA
    assert faults.unavailable(raised(KafkaTimeoutError())) == faults.KAFKA
    assert faults.unavailable(raised(MessageSizeTooLargeError())) is None


def test_an_http_backend_that_is_away_or_overloaded_is_retried_and_its_refusals_are_not():
    assert faults.unavailable(raised(httpx.ConnectError("refused", request=REQUEST))) == faults.HTTP
    assert faults.unavailable(raised(httpx.ReadTimeout("slow", request=REQUEST))) == faults.HTTP
    assert faults.unavailable(raised(httpx.RemoteProtocolError("closed", request=REQUEST))) == faults.HTTP
    for status, expected in ((503, faults.HTTP), (502, faults.HTTP), (429, faults.HTTP), (404, None), (400, None)):
        response = httpx.Response(status, request=REQUEST)
        exc = raised(httpx.HTTPStatusError(str(status), request=REQUEST, response=response))
        assert faults.unavailable(exc) == expected, status


def test_the_messages_api_unreachable_or_overloaded_is_retried_and_a_bad_request_is_not():
    assert faults.unavailable(raised(anthropic.APIConnectionError(request=REQUEST))) == faults.MODEL
    assert faults.unavailable(raised(anthropic.APITimeoutError(request=REQUEST))) == faults.MODEL
    for status, expected in ((500, faults.MODEL), (529, faults.MODEL), (429, faults.MODEL), (400, None), (401, None)):
        response = httpx.Response(status, request=REQUEST, json={"type": "error", "error": {"type": "x"}})
        exc = raised(anthropic.APIStatusError(str(status), response=response, body=None))
        assert faults.unavailable(exc) == expected, status


def test_a_transport_failure_under_an_mcp_session_or_a_socket_is_retried():
    import anyio

    assert faults.unavailable(raised(anyio.ClosedResourceError())) == faults.NETWORK
    assert faults.unavailable(raised(ConnectionResetError(104, "reset by peer"))) == faults.NETWORK
    assert faults.unavailable(raised(TimeoutError())) is None  # a handler's own wait_for: not a dependency's
    # a handler's own error raised *because of* an outage (a lookup that could not reach the shop) is the outage's
    lookup = raised(RuntimeError("could not verify order o1"), httpx.ConnectError("refused", request=REQUEST))
    assert faults.unavailable(lookup) == faults.HTTP


def test_an_exception_group_is_unavailable_only_when_every_leaf_is():
    refused = httpx.ConnectError("refused", request=REQUEST)
    assert faults.unavailable(BaseExceptionGroup("tg", [refused, asyncio.CancelledError()])) == faults.HTTP
    assert faults.unavailable(ExceptionGroup("tg", [refused, ValueError("bad input")])) is None


@pytest.mark.parametrize(
    "exc", [ValueError("bad"), KeyError("k"), RecursionError(), validation_error(), TypeError("bug")]
)
def test_what_the_message_itself_causes_is_dead_lettered(exc):
    assert faults.unavailable(raised(exc)) is None


def test_a_cycle_of_contexts_or_an_undescribable_error_never_hangs_nor_raises():
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert faults.unavailable(a) is None
    assert faults.unavailable(Unprintable()) is None
    assert faults.unavailable(faults.RetryLater(faults.DATABASE, "x", backend=False)) == faults.DATABASE


class OneRecordKafka:
    """Hands out one record, then nothing; remembers whether its partitions are paused."""

    def __init__(self) -> None:
        self.paused = False
        self.given = False
        self.commits: list[dict] = []

    def assignment(self):
        return {TP}

    async def commit(self, offsets):
        self.commits.append(dict(offsets))

    def pause(self, *parts):
        self.paused = True

    def resume(self, *parts):
        self.paused = False

    async def getmany(self, timeout_ms=0, max_records=None):
        # a fake poll's wait: the consumer loop yields as on a real broker
        await asyncio.sleep(min(timeout_ms, 20) / 1000)
        if self.paused or self.given:
            return {}
        self.given = True
        return {TP: [SimpleNamespace(topic="t", partition=0, offset=0, key=b"c1", value=b"{}")]}


def gauge(consumer: str) -> float | None:
    return REGISTRY.get_sample_value(
        "roundtrip_dependency_unavailable", {"consumer": consumer, "dependency": faults.DATABASE}
    )


async def test_a_retry_later_pauses_the_consumer_once_retries_the_record_and_resumes_when_it_goes_through(caplog):
    outage = {"on": True}
    done: list = []

    async def process(record):
        if outage["on"]:
            raise faults.RetryLater(faults.DATABASE, "ConnectionRefusedError: [Errno 111]", backend=False)
        done.append(record.offset)

    consumer = key_ordered(process=process, name="unitretry", idle_wait_ms=50)
    await consumer.on_partitions_assigned([TP])
    kafka = OneRecordKafka()
    caplog.set_level(logging.INFO, "roundtrip.consumer")
    task = asyncio.create_task(consumer.run(kafka))
    await asyncio.sleep(1.5)  # several retries (0.25, 0.5, 1 s)
    assert kafka.paused and consumer.outages.waiting == (faults.DATABASE,) and not done
    assert gauge("unitretry") == 1
    retried = REGISTRY.get_sample_value(
        "roundtrip_retried_messages_total", {"consumer": "unitretry", "dependency": faults.DATABASE}
    )
    assert retried is not None and retried >= 2
    outage["on"] = False
    await asyncio.sleep(2.5)  # the next retry after the outage ends (at most 1 s apart), with slack
    assert done == [0] and not consumer.outages and not kafka.paused and gauge("unitretry") == 0
    lines = [r.getMessage() for r in caplog.records if "unitretry" in r.getMessage()]
    assert sum("unavailable" in line for line in lines) == 1, lines  # once per outage, not once per try
    assert sum("answers again" in line for line in lines) == 1, lines
    assert consumer.committed() == {TP: 1} and kafka.commits == [{TP: 1}]  # committed once it went through
    await consumer.drain()
    await asyncio.wait_for(task, 2)


async def test_a_record_retried_later_is_not_committed_when_its_partition_is_given_up(monkeypatch):
    monkeypatch.setattr(consumer_module, "DRAIN_TIMEOUT_S", 8)

    async def process(record):
        raise faults.RetryLater(faults.DATABASE, "down", backend=False)

    consumer = key_ordered(process=process, name="unitgiveup", idle_wait_ms=50)
    await consumer.on_partitions_assigned([TP])
    kafka = OneRecordKafka()
    task = asyncio.create_task(consumer.run(kafka))
    await asyncio.sleep(0.5)  # the first retries of the record
    await consumer.drain()  # the retry loop gives the record up: not finished, so its offset stays uncommitted
    await asyncio.wait_for(task, 2)
    # committed at the record itself (the first unfinished one): the next owner reads it again; no outage is left
    assert consumer.committed() == {TP: 0} and consumer.processed == 0 and not consumer.outages
    assert gauge("unitgiveup") == 0
