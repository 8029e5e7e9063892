"""The whole fleet as processes against the session's Kafka broker, driven like a user's app."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import uuid
from collections import defaultdict
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from aiokafka.partitioner import murmur2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from roundtrip._broker.embedded import free_port
from roundtrip._fleet.children import of_service
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import SupportReply
from tests import settling
from tests.agents import ShopFleetSettings
from tests.e2e import crashes
from tests.processes import restart
from tests.readers import stop_reader
from tests.signing import key_settings


def fleet_env(**values) -> dict[str, str]:
    return {f"ROUNDTRIP_{k.upper()}": str(v) for k, v in values.items()}


def conversations_covering(partitions: int, stem: str = "conv_") -> list[str]:
    """One conversation id per partition, in partition order (Kafka's default partitioner: murmur2 of the key)."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < partitions:
        conversation = f"{stem}{i}"
        found.setdefault((murmur2(conversation.encode()) & 0x7FFFFFFF) % partitions, conversation)
        i += 1
    return [found[p] for p in range(partitions)]


class FleetClient:
    """Publishes support requests and records every message of the turn's topics."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.seen: dict[str, list[dict]] = defaultdict(list)  # logical topic (DEAD_LETTERS: all services') -> messages
        self.replies: dict[str, list[SupportReply]] = defaultdict(list)
        self._arrived = asyncio.Event()
        self._read_to: dict[tuple[str, int], int] = {}  # (topic, partition) -> the offset after its last record read

    def topic(self, name: str) -> str:
        return self.settings.topic_prefix + name

    async def start(self) -> None:
        watched = [self.topic(n) for n in topology.topic_names()]
        kafka = kafka_clients(self.settings)  # as the settings connect: PLAINTEXT, or TLS and SASL
        self.admin = kafka.admin()
        await self.admin.start()
        self.producer = kafka.producer()
        # No consumer group: nothing to rebalance or time out while a test blocks, and every record is seen once.
        self.consumer = kafka.consumer(enable_auto_commit=False, isolation_level="read_committed")
        await self.producer.start()
        await self.consumer.start()
        partitions = await partitions_of(self.consumer, watched)
        assert len({tp.topic for tp in partitions}) == len(watched), "the fleet's topics should exist"
        self.consumer.assign(partitions)
        self._partitions = partitions
        await self.consumer.seek_to_beginning(*partitions)
        self._task = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        prefix = self.settings.topic_prefix
        async for record in self.consumer:
            self._read_to[record.topic, record.partition] = record.offset + 1
            name = record.topic[len(prefix) :]
            if topics.dead_letters_service(name):  # every service's dead letters, in one list
                name = topics.DEAD_LETTERS
            if name == topics.SUPPORT_REQUESTS:  # read for `settled` only: what the fleet was asked is the test's own
                continue
            try:
                data = json.loads(record.value)
            except ValueError:
                continue
            self.seen[name].append(data)
            if name == topics.SUPPORT_REPLIES:
                reply = SupportReply.model_validate(data)
                self.replies[reply.request_id].append(reply)
            self._arrived.set()

    async def stop(self) -> None:
        await stop_reader(self._task, self.consumer)
        await self.producer.stop()
        await self.admin.close()

    async def publish_raw(self, value: bytes, key: bytes | None = b"raw") -> None:
        await self.producer.send_and_wait(self.topic(topics.SUPPORT_REQUESTS), value, key=key)

    async def ask(
        self,
        text: str,
        customer: str,
        persona: str | None = None,
        request_id: str | None = None,
        conversation_id: str | None = None,
    ) -> str:
        request_id = request_id or f"req_{uuid.uuid4().hex[:10]}"
        body = {
            "request_id": request_id,
            "conversation_id": conversation_id or f"conv_{request_id}",
            "customer_id": customer,
            "text": text,
        }
        if persona:
            body["persona"] = persona
        await self.publish_raw(json.dumps(body).encode(), key=body["conversation_id"].encode())
        return request_id

    async def letters_keyed(self, prefix: str, names: set[str], timeout: float = 60.0) -> dict[str, dict]:
        """The dead letters of records sent keyed `prefix:name`, by name, once one has come for each of `names`."""

        def found() -> dict[str, dict] | None:
            letters = {
                letter["key"].split(":", 1)[1]: letter
                for letter in self.seen[topics.DEAD_LETTERS]
                if (letter.get("key") or "").startswith(f"{prefix}:")
            }
            return letters if names <= set(letters) else None

        return await self.wait_for(found, timeout=timeout)

    async def wait_for(self, predicate, timeout: float = 60.0):
        async def loop():
            while True:
                result = predicate()
                if result:
                    return result
                self._arrived.clear()
                await self._arrived.wait()

        return await asyncio.wait_for(loop(), timeout)

    async def settled(self, timeout: float = 60.0) -> None:
        """Wait until the fleet has done all it will do with what is on its topics (tests/settling.py): then "nothing
        more happened" is a positive signal, not a window. TimeoutError when the fleet is still busy."""
        await settling.settled(
            self.consumer, self.admin, self._partitions, self._read_to, self.settings.topic_prefix, timeout
        )

    async def read_to_end(self) -> None:
        """Until every record on the fleet's topics now is read (and in `seen`): what a process SIGKILLed had sent."""
        await settling.read_to_end(self.consumer, self._partitions)

    async def reply(self, request_id: str, timeout: float = 60.0) -> SupportReply:
        return (await self.wait_for(lambda: self.replies.get(request_id), timeout))[0]

    def of_turn(self, name: str, request_id: str) -> list[dict]:
        return [m for m in self.seen[name] if m.get("turn", {}).get("request_id") == request_id]


class OtlpReceiver:
    """A minimal OTLP/HTTP trace receiver (what Jaeger listens on at :4318), decoding the protobuf requests."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource_spans in request.resource_spans:
                    attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                    for scope in resource_spans.scope_spans:
                        for span in scope.spans:
                            receiver.spans.append(
                                {
                                    "trace_id": span.trace_id.hex(),
                                    "name": span.name,
                                    "service": attrs.get("service.name"),
                                }
                            )
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(ExportTraceServiceResponse().SerializeToString())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="session")
def otlp_receiver():
    receiver = OtlpReceiver()
    yield receiver
    receiver.server.shutdown()


@pytest.fixture(scope="session")
def fleet_settings(kafka_bootstrap, tmp_path_factory, otlp_receiver) -> tuple[Settings, dict[str, str]]:
    state = tmp_path_factory.mktemp("fleet")
    values = dict(
        otlp_endpoint=otlp_receiver.endpoint,  # spans go both to an OTLP receiver and to the local span file
        span_file=state / "spans.jsonl",
        kafka_bootstrap_servers=kafka_bootstrap,
        kafka_allow_plaintext=True,  # the test broker listens in the clear; the fleet is not development
        topic_prefix=f"e2e{uuid.uuid4().hex[:6]}.",
        state_dir=state,
        simulator_port=free_port(),
        console_port=free_port(),
        shop_port=free_port(),
        partitions=4,
        max_steps=10,
        log_level="INFO",
        # not the embedded broker, so not "development": the published development key would be refused
        **key_settings("e2e1"),  # fresh pairs, never the published development keys
    )
    return ShopFleetSettings(**values), fleet_env(**values)


class AsyncFleet:
    """The session's Fleet, with its blocking controls run off the event loop."""

    def __init__(self, fleet: Fleet) -> None:
        self.sync = fleet
        self.restarted: set[int] = set()  # pids a restart ended: on purpose, never a crash (tests/e2e/crashes.py)

    async def restart(self, name: str, env: dict[str, str] | None = None) -> None:
        self.restarted |= {c.process.pid for c in of_service(self.sync.children, name) if c.process.poll() is None}
        await asyncio.to_thread(restart, self.sync, name, env)

    async def respawn(self, name: str, env: dict[str, str] | None = None) -> None:
        if env:
            self.sync.env = {**self.sync.env, **env}
        await asyncio.to_thread(self.sync.respawn, name)

    async def kill(self, name: str) -> None:
        await asyncio.to_thread(self.sync.kill, name)

    @asynccontextmanager
    async def reconfigured(self, services: tuple[str, ...], **values):
        """Restart `services` with changed settings; afterwards restart them with the session's settings again."""
        for name in services:
            await self.restart(name, fleet_env(**values))
        try:
            yield
        finally:
            originals = {
                key: getattr(self.sync.settings, key, None) for key in values
            }  # None: not a fleet setting (an agent's)
            for key in [k for k, v in originals.items() if v is None]:  # unset again (not the string "None")
                self.sync.env.pop(f"ROUNDTRIP_{key.upper()}", None)
            original = fleet_env(**{k: v for k, v in originals.items() if v is not None})
            await asyncio.to_thread(self.sync.respawn_exited)  # killed by the test, which then failed
            for name in services:
                await self.restart(name, original)


@pytest.fixture(scope="session")
def fleet(fleet_settings):
    settings, env = fleet_settings
    with Fleet(settings, env=env, executor_replicas=2) as running:  # executors scale on their own
        yield AsyncFleet(running)


@pytest.fixture(autouse=True)
def _fleet_whole_after_each_test(request):
    """A process of the session's fleet that exited during a test fails it (named, with the last lines of its log),
    unless the test ended it on purpose (a restart, or the marker `kills_services`: tests/e2e/crashes.py); either
    way the fleet is whole again for the next test, which would otherwise fail on the missing service too."""
    if "fleet" not in request.fixturenames:
        yield
        return
    fleet = request.getfixturevalue("fleet")
    watch = crashes.Watch.of(fleet.sync)
    yield
    failure = crashes.after_test(
        fleet.sync, watch, fleet.restarted, request.node.get_closest_marker(crashes.ON_PURPOSE) is not None
    )
    if failure:
        pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="session")
async def client(fleet, fleet_settings):
    c = FleetClient(fleet_settings[0])
    await c.start()
    yield c
    await c.stop()


@pytest.fixture
def shop_orders(fleet_settings):
    """Snapshot of every order in the shop's database: order_id -> (customer_id, status)."""
    settings = fleet_settings[0]

    def snapshot() -> dict[str, tuple[str, str]]:
        orders = httpx.get(f"{settings.shop_base_url}/admin/orders", timeout=5).json()["orders"]
        return {o["order_id"]: (o["customer_id"], o["status"]) for o in orders}

    return snapshot


def span_file(settings: Settings) -> Path:
    return settings.effective_span_file
