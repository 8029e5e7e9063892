"""The fleet deployed the way its users deploy it, once from deploy/k8s and once from docker-compose.yml,
and talked to like their app: turns get replies, and an executor scaled to three replicas all get work. deploy/k8s
runs agent version v2 beside the default version (model-v2.yaml, gate-v2.yaml, executor-v2.yaml, each its own Kafka
user): ramped to v2, a new conversation's turn runs on them.

Each workload runs as local processes with the command and the environment its manifest gives it (k8s:
envFrom the ConfigMap and the Secret, env with secretKeyRef / configMapKeyRef; compose: resolved by the
real Compose v2; both over the image's ENV), init containers and one-shot jobs first, so an init step
added to the manifests later runs here too. Every replica has its own folder, state dir, HOSTNAME and
ports: nothing is shared but Kafka and PostgreSQL, as between pods or containers with their own disks.

The k8s manifests connect as shipped, SASL_SSL with SCRAM-SHA-512 and the CA their pods mount, each service as its
own Kafka user: they run against a broker of this module secured that way (services/_broker/secured.py: a throwaway
CA, a SCRAM user per service, the operator's, and the StandardAuthorizer, which denies whatever no ACL allows), and
the test fills the Kafka Secrets the operator fills (each user's password, the admin's user, the CA's PEM). The
setup Job the manifests ship applies the ACLs of `roundtrip acls` and makes the topics, as it would on the cluster;
the test's client is the operator's user. Compose, a development fleet on its own Kafka, runs on the session's
PLAINTEXT broker.

Only addresses are replaced (tests/e2e/local_deployment.py has the list): Kafka -> the session's broker,
database URLs -> databases of the session's PostgreSQL in the manifest's URL form, service URLs, ports
and the listen host -> the local processes, the OTLP endpoint -> a local receiver, and the topics get a
prefix of the run's own because the broker is shared with other tests. One substitution is not an
address: the topics' replication factor and min.insync.replicas (3 and 2 in the ConfigMap) become 1,
because the session's broker is a single node. And the k8s Secrets' key placeholders (CHANGE-ME) are filled with
freshly made pairs, as the operator must before applying them (tests/manifests.py: with_keys_filled), and the
console's OIDC issuer and audience with those of a real test issuer process (tests/oidc_issuer.py), which compose
gets as its operator gives them (ROUNDTRIP_CONSOLE_OIDC_ISSUER and _AUDIENCE in the environment): both consoles run in
the signed mode and serve a page only to a token that issuer signed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from roundtrip._broker.embedded import free_port
from roundtrip._broker.secured import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    AUTHORIZER,
    Listener,
    Tls,
    client_security,
    make_tls,
    secured_kafka,
)
from roundtrip._kernel.kafka import acls
from roundtrip._kernel.kafka.aiokafka_seam import partitions_of
from roundtrip._kernel.kafka.clients import kafka_clients
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.ledger_reads import TurnReads
from roundtrip._kernel.storage.versions import Versions
from roundtrip._kernel.wire import topics, topology
from roundtrip._kernel.wire.events import SupportReply
from tests import oidc_issuer
from tests.e2e import forgeries
from tests.e2e.conftest import FleetClient, conversations_covering
from tests.e2e.local_deployment import LocalDeployment, LocalWorld
from tests.e2e.manifest_workloads import compose_manifest, k8s_manifest
from tests.manifests import compose_config, k8s_documents, kinds, with_keys_filled

EXECUTORS = 3
VERSIONS = ("v2",)  # the agent versions the k8s manifests run beside the default (model-v2.yaml, ...)
OF_VERSIONS = tuple(f"{name}-{v}" for v in VERSIONS for name in topology.versioned())  # their Deployments
# the SCRAM users the operator makes on the brokers (as `roundtrip acls` names the principals) and their passwords
KAFKA_USERS = {
    acl.principal.removeprefix("User:"): f"{name}-{uuid.uuid4().hex}"
    for name, granted in acls.derive("", acls.DEFAULT_PRINCIPAL, None, VERSIONS).items()
    for acl in granted[:1]
}
OPERATOR = acls.for_operator("", acls.DEFAULT_PRINCIPAL, VERSIONS)[0].principal.removeprefix("User:")
CUSTOMER = "cus_1001"
START_TIMEOUT_S = 150  # every replica ready (2 busy cores, ~18 processes a shape)
REPLY_TIMEOUT_S = 60  # the turns together; a turn with the simulator takes well under a second
AUDIENCE = "roundtrip-console"


@pytest.fixture(scope="module")
def issuer() -> Iterator[oidc_issuer.Running]:
    """The company's OIDC provider the shipped consoles are configured with."""
    with oidc_issuer.running() as running:
        yield running


@dataclass(frozen=True)
class SecuredKafka:
    bootstrap: str
    listener: Listener
    tls: Tls

    @property
    def client(self) -> dict:
        """Settings keyword arguments for a client of it as the operator's user (the `roundtrip` commands: it reads
        every topic and publishes requests, as the user's app would)."""
        return client_security(self.listener, self.tls, OPERATOR, KAFKA_USERS[OPERATOR])


@pytest.fixture(scope="module")
def secured_kafka_broker(tmp_path_factory) -> Iterator[SecuredKafka]:
    """A one-node Kafka whose only client listener is SASL_SSL + SCRAM-SHA-512 (what the k8s manifests ship), a user
    per service and the operator's, that denies whatever no ACL allows (its admin a super user)."""
    folder = tmp_path_factory.mktemp("shipped-kafka")
    tls = make_tls(folder / "tls")
    listener = Listener("SASLSSL", "SASL_SSL", free_port(), ("SCRAM-SHA-512",))
    kafka = secured_kafka(
        folder / "kafka",
        [listener],
        tls,
        KAFKA_USERS,
        controller_port=free_port(),
        die_with_parent=True,
        properties={"authorizer.class.name": AUTHORIZER},
    )
    with kafka:
        kafka.wait_ready(120)
        yield SecuredKafka(f"127.0.0.1:{listener.port}", listener, tls)


def filled_k8s_documents(kafka: SecuredKafka, issuer: str, docs: list[dict] | None = None) -> list[dict]:
    """deploy/k8s with the Kafka Secrets filled as its operator does (the CA; each user's password, the user as
    shipped; the setup Job's admin), the key Secrets' placeholders with fresh pairs made as `roundtrip keys` makes
    them and the console's issuer (the rest of its template as shipped)."""
    docs = with_keys_filled(docs if docs is not None else k8s_documents(), issuer, AUDIENCE)
    secrets = {name: s["stringData"] for name, s in kinds(docs, "Secret").items()}
    assert "CHANGE-ME" in secrets["roundtrip-kafka"]["ca"], "the shipped Secret should be a template to fill"
    secrets["roundtrip-kafka"]["ca"] = kafka.tls.ca.read_text()
    for name in (*topology.names(), *OF_VERSIONS, "operator", "admin"):
        user = secrets[f"roundtrip-kafka-{name}"]
        assert "CHANGE-ME" in user["ROUNDTRIP_KAFKA_SASL_PASSWORD"], f"roundtrip-kafka-{name} should be a template"
        if name == "admin":  # one the cluster lets create ACLs: here the broker's super user
            user |= {"ROUNDTRIP_KAFKA_SASL_USERNAME": ADMIN_USER, "ROUNDTRIP_KAFKA_SASL_PASSWORD": ADMIN_PASSWORD}
        else:  # the user as shipped must be one the operator made on the brokers
            user["ROUNDTRIP_KAFKA_SASL_PASSWORD"] = KAFKA_USERS[user["ROUNDTRIP_KAFKA_SASL_USERNAME"]]
    return docs


def manifest_of(shape: str, kafka: SecuredKafka, issuer: str):
    if shape == "k8s":
        return k8s_manifest(filled_k8s_documents(kafka, issuer), replicas={"executor": EXECUTORS})
    sign_on = {"ROUNDTRIP_CONSOLE_OIDC_ISSUER": issuer, "ROUNDTRIP_CONSOLE_OIDC_AUDIENCE": AUDIENCE}  # its .env
    return compose_manifest(compose_config(**sign_on), scale={"executor": EXECUTORS})  # `--scale executor=3`


def tool_runs(metrics: str) -> float:
    """The tool calls a process ran, from its /metrics (roundtrip_tool_executions_total, every tool and result)."""
    return sum(float(v) for v in re.findall(r"(?m)^roundtrip_tool_executions_total\{[^}]*\} (\S+)$", metrics))


async def a_turn_runs_on_version_v2(deployment: LocalDeployment, manifest, client: FleetClient) -> None:
    """The operator sends v2 every new conversation (what `roundtrip versions ramp v2 100%` writes; the setup Job made
    v2's topics and ACLs): a new conversation's turn runs on v2's model, gate and executor, as the ledger and v2's
    executor say, and gets one reply."""
    guard = deployment.replicas["guard"][0].envs[id(manifest.workloads["guard"].main)]
    url = guard["ROUNDTRIP_LEDGER_DATABASE_URL"]
    store = await Versions.open(url)
    try:
        await store.ramp(VERSIONS[0], 100.0)
    finally:
        await store.close()
    await asyncio.sleep(1.5)  # the guard reads the ramp again within a second (services/_guard/versions.py)
    asked = await client.ask("where is my order?", CUSTOMER, conversation_id="conv_k8s_v2")
    reply = await deployment.while_running(client.reply(asked, timeout=REPLY_TIMEOUT_S))
    assert reply.outcome == "end_turn" and reply.steps >= 2 and len(client.replies[asked]) == 1, reply
    reads = await TurnReads.open(url, read_only=True)
    try:
        row = await reads.get(reply.turn_id)
    finally:
        await reads.close()
    assert row is not None and row.agent_version == VERSIONS[0], row
    (executor,) = deployment.replicas[f"executor-{VERSIONS[0]}"]
    health = executor.workload.main.ready[1]  # the port of its probes serves /metrics too
    async with httpx.AsyncClient() as http:
        assert tool_runs((await http.get(executor.url("/metrics", health), timeout=5)).text) > 0


async def the_executors_login_rewrites_no_turn(deployment: LocalDeployment, manifest) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.ext.asyncio import create_async_engine

    env = deployment.replicas["executor"][0].envs[id(manifest.workloads["executor"].main)]
    engine = create_async_engine(env["ROUNDTRIP_LEDGER_DATABASE_URL"])
    try:
        for attempt in (
            "INSERT INTO turns (turn_id, request_id, conversation_id, customer_id, status, step, started_at, "
            "last_progress_at, turn_json) VALUES ('t_forged', 'r', 'c', 'cus_other', 'running', 0, 0, 0, '{}')",
            "UPDATE turns SET customer_id = 'cus_other', turn_json = '{}'",
            "UPDATE turns SET status = 'ended'",
            "DELETE FROM turns",
        ):
            with pytest.raises(DBAPIError, match="permission denied"):
                async with engine.begin() as conn:
                    await conn.execute(text(attempt))
        async with engine.connect() as conn:
            customers = set((await conn.execute(text("SELECT customer_id FROM turns"))).scalars())
        assert customers == {CUSTOMER}, customers
    finally:
        await engine.dispose()


def settings_of(env: dict[str, str]) -> Settings:
    """The settings a process with this environment reads (its ROUNDTRIP_* variables, none of this test's)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("ROUNDTRIP_")]:
            patch.delenv(name)
        for name, value in env.items():
            if name.startswith("ROUNDTRIP_"):
                patch.setenv(name, value)
        return Settings()


async def the_executors_kafka_user_speaks_for_no_one(
    deployment: LocalDeployment, manifest, prefix: str, genuine: SupportReply
) -> dict[str, type[BaseException] | None]:
    """The forgeries of tests/e2e/forgeries.py, sent with the executor's Kafka credentials as its pod has them."""
    env = deployment.replicas["executor"][0].envs[id(manifest.workloads["executor"].main)]
    return await forgeries.sent(kafka_clients(settings_of(env)).producer, prefix, genuine)


@pytest.mark.parametrize("shape", ["k8s", "compose"])
async def test_the_shipped_manifests_answer_turns_and_every_executor_works(
    shape, kafka_bootstrap, secured_kafka_broker, issuer, postgres_url, otlp_receiver, tmp_path
):
    manifest = manifest_of(shape, secured_kafka_broker, issuer.url)
    assert manifest.workloads["executor"].replicas == EXECUTORS
    # k8s: its secured Kafka; compose: its own (plaintext) Kafka, for which the session's broker stands in
    bootstrap, security = (
        (secured_kafka_broker.bootstrap, secured_kafka_broker.client) if shape == "k8s" else (kafka_bootstrap, {})
    )
    world = LocalWorld(bootstrap, postgres_url, otlp_receiver.endpoint, tag=f"ship_{shape}_{uuid.uuid4().hex[:8]}")
    deployment = LocalDeployment(manifest, world, tmp_path)
    try:
        await deployment.start(timeout=START_TIMEOUT_S)
        shop = deployment.replicas["executor"][0].envs[id(manifest.workloads["executor"].main)]["ROUNDTRIP_SHOP_URL"]
        before = httpx.get(f"{shop}/admin/orders", timeout=5).json()["orders"]

        client = FleetClient(Settings(kafka_bootstrap_servers=bootstrap, topic_prefix=world.topic_prefix, **security))
        await client.start()
        try:
            batches = await partitions_of(client.consumer, [world.topic_prefix + topics.TOOL_BATCHES])
            # one turn per partition of turn.tool_batches (keyed by conversation): whichever partitions an executor
            # holds, it gets a turn
            conversations = conversations_covering(len(batches), f"conv_{shape}_")
            asked = {}
            for i, conversation in enumerate(conversations):
                text = "cancel my last order" if i == 0 else "where is my order?"
                asked[await client.ask(text, CUSTOMER, conversation_id=conversation)] = text
            replies = {}
            for request_id, text in asked.items():
                try:
                    replies[request_id] = await deployment.while_running(
                        client.reply(request_id, timeout=REPLY_TIMEOUT_S)
                    )
                except TimeoutError:
                    pytest.fail(
                        f"no reply to {text!r} ({request_id}) within {REPLY_TIMEOUT_S} s; "
                        f"{sum(map(bool, client.replies.values()))} of {len(asked)} turns answered",
                        pytrace=False,
                    )
            if shape == "k8s":  # the executor's Kafka user as shipped: the broker refuses it every write of another's
                genuine = next(iter(replies.values()))
                refused = await the_executors_kafka_user_speaks_for_no_one(
                    deployment, manifest, world.topic_prefix, genuine
                )
                assert refused == dict.fromkeys(refused, TopicAuthorizationFailedError), refused
                texts = [r.text for rs in client.replies.values() for r in rs]
                assert forgeries.FORGED not in texts and len(texts) == len(asked), texts
                await a_turn_runs_on_version_v2(deployment, manifest, client)  # after the replies counted above
        finally:
            await client.stop()

        for request_id, reply in replies.items():
            assert reply.outcome == "end_turn", (asked[request_id], reply)
            assert reply.steps >= 2, (asked[request_id], reply)  # a tool ran before the answer
            assert len(client.replies[request_id]) == 1, client.replies[request_id]
        # the cancel happened, once: one open order of the customer's, and nothing else, is now cancelled
        after = {o["order_id"]: o["status"] for o in httpx.get(f"{shop}/admin/orders", timeout=5).json()["orders"]}
        changed = [
            (o["customer_id"], o["status"], after[o["order_id"]]) for o in before if after[o["order_id"]] != o["status"]
        ]
        assert len(changed) == 1 and changed[0][0] == CUSTOMER and changed[0][2] == "cancelled", changed
        assert changed[0][1] in ("pending", "processing"), changed

        if shape == "k8s":  # the executor's login as shipped: the database refuses it any other turn row
            await the_executors_login_rewrites_no_turn(deployment, manifest)

        runs = {}
        async with httpx.AsyncClient() as http:
            for replica in deployment.replicas["executor"]:
                health = replica.workload.main.ready[1]  # the port of its probes serves /metrics too
                runs[replica.label] = tool_runs((await http.get(replica.url("/metrics", health), timeout=5)).text)
        assert len(runs) == EXECUTORS and all(n > 0 for n in runs.values()), f"tool calls run per executor: {runs}"
        logs = "".join(p.log.read_text(errors="replace") for r in deployment.all() for p in r.processes)
        assert not [user for user, password in KAFKA_USERS.items() if password in logs]  # no password is said

        # the console runs too, in the signed mode: a page for a token the issuer signed, nobody else's
        (console,) = deployment.replicas["console"]
        page = console.url("/approvals", 8803)  # its manifest's ROUNDTRIP_CONSOLE_PORT
        anonymous = httpx.get(page, headers={"X-Forwarded-Email": "mallory@example.com"}, timeout=5)
        assert anonymous.status_code == 401 and "not signed in" in anonymous.text, anonymous.text
        token = issuer.mint(email="alice@example.com", aud=AUDIENCE, groups=["roundtrip-approvers"])
        signed_in = httpx.get(page, headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert signed_in.status_code == 200 and "Waiting for a person" in signed_in.text, signed_in.text
        assert "alice@example.com (approver)" in signed_in.text
        log = "".join(p.log.read_text(errors="replace") for p in console.processes)
        assert "refused sign-in: reason=no-token from='127.0.0.1'" in log
    except BaseException:
        print(f"deploy from {shape}: the last lines of every process's log\n{deployment.tails()}")
        raise
    finally:
        await deployment.stop()


async def test_the_k8s_manifests_run_a_users_agent_the_example_carrier(
    secured_kafka_broker, issuer, postgres_url, otlp_receiver, tmp_path
):
    """The manifests with a user's agent (issue 29, item 4): the example carrier agent (examples/telecom-agent,
    installed as its own distribution, as its image would have it: docs/operating/deploy.md) named by
    ROUNDTRIP_AGENT in the ConfigMap, with its own setting there (its lines' database, on a volume the gate's and the
    executor's pods share: here a path all the processes see), and the demo shop (and its agent's version 2) taken
    out, as its user would. One executor: the shop's run above scales them."""
    pytest.importorskip("telecom_agent", reason="the example agent is installed by scripts/setup.sh")
    script = tmp_path / "scripts.json"
    script.write_text(
        json.dumps(
            {
                "replan": [
                    [{"type": "tool_use", "name": "change_plan", "input": {"line_id": "ln_5550303", "plan": "basic"}}],
                    [{"type": "text", "text": "Your line ln_5550303 moves to basic."}],
                ]
            }
        )
    )
    shipped = k8s_documents()
    no_shop = [d for d in shipped if d["metadata"]["name"] != "shop" or d["kind"] not in ("Deployment", "Service")]
    docs = [d for d in no_shop if d["metadata"]["name"] not in OF_VERSIONS]  # the shop agent's version 2 too
    docs = filled_k8s_documents(secured_kafka_broker, issuer.url, docs)
    config = kinds(docs, "ConfigMap")["roundtrip-config"]["data"]
    del config["ROUNDTRIP_SHOP_URL"]  # no demo shop: this agent's backend is its own
    config |= {
        "ROUNDTRIP_AGENT": "telecom",
        "ROUNDTRIP_TELECOM_DATABASE": str(tmp_path / "lines.db"),
        "ROUNDTRIP_SIMULATOR_SCRIPT": str(script),
    }
    manifest = k8s_manifest(docs, replicas={"executor": 1})
    kafka = secured_kafka_broker
    world = LocalWorld(kafka.bootstrap, postgres_url, otlp_receiver.endpoint, tag=f"ship_tc_{uuid.uuid4().hex[:8]}")
    deployment = LocalDeployment(manifest, world, tmp_path / "pods")
    try:
        await deployment.start(timeout=START_TIMEOUT_S)
        client = FleetClient(
            Settings(kafka_bootstrap_servers=kafka.bootstrap, topic_prefix=world.topic_prefix, **kafka.client)
        )
        await client.start()
        try:
            asked = await client.ask("move my line to basic", "cus_2003", persona="script:replan")
            reply = await deployment.while_running(client.reply(asked, timeout=REPLY_TIMEOUT_S))
        finally:
            await client.stop()
        assert reply.outcome == "end_turn" and reply.text == "Your line ln_5550303 moves to basic.", reply
        with sqlite3.connect(tmp_path / "lines.db") as db:  # the executor's pod changed it; the gate's pod resolved it
            assert db.execute("SELECT plan FROM lines WHERE line_id = 'ln_5550303'").fetchone() == ("basic",)
    except BaseException:
        print(f"deploy of the carrier agent: the last lines of every process's log\n{deployment.tails()}")
        raise
    finally:
        await deployment.stop()
