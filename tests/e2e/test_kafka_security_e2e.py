"""The fleet on a secured Kafka (issue 20): SASL_SSL + SCRAM-SHA-512 from outside with `roundtrip up`, a wrong
password refused at start in one line, then mTLS, SASL_PLAINTEXT + SCRAM-SHA-256 and OAUTHBEARER (unsigned JWS
tokens against Kafka's unsecured validator, a token expiring mid-run) with the same request and reply.

The user's app is a plain aiokafka client configured by hand (not the fleet's KafkaClients).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.helpers import create_ssl_context

from roundtrip._broker.embedded import free_port
from roundtrip._broker.secured import ADMIN_USER, BROKER_PRINCIPAL, Listener, client_security, make_tls, secured_kafka
from roundtrip._broker.unsecured_token import UnsecuredTokenProvider
from roundtrip._fleet.launcher import Fleet
from roundtrip._kernel.settings import Settings
from roundtrip._kernel.wire import topics
from roundtrip._kernel.wire.events import SupportReply
from tests.databases import migrated
from tests.e2e.conftest import fleet_env
from tests.e2e.up_process import roundtrip_up
from tests.waiting import until

APP_USER, APP_PASSWORD = "app", "app-secret-pw"
NOBODY = "nobody"  # a SCRAM user without any ACL
TOKEN_LIFETIME_S = 8  # the OAUTHBEARER sessions end this often: every connection is closed and made again


async def ask_and_wait(bootstrap: str, prefix: str, security: dict, timeout: float = 90.0) -> SupportReply:
    """What a user's app does: publish a support request, read support.replies (read committed) until its reply."""
    request_id = f"req_{uuid.uuid4().hex[:10]}"
    request = {
        "request_id": request_id,
        "conversation_id": f"conv_{request_id}",
        "customer_id": "cus_1001",
        "text": "where is my order?",
        "persona": "careful",
    }
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **security)
    consumer = AIOKafkaConsumer(
        prefix + topics.SUPPORT_REPLIES,
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **security,
    )
    await producer.start()
    await consumer.start()
    try:
        await producer.send_and_wait(
            prefix + topics.SUPPORT_REQUESTS, json.dumps(request).encode(), key=request["conversation_id"].encode()
        )
        async with asyncio.timeout(timeout):
            async for record in consumer:
                reply = SupportReply.model_validate_json(record.value)
                if reply.request_id == request_id:
                    return reply
    finally:
        await consumer.stop()
        await producer.stop()
    raise AssertionError("unreachable")


def by_hand(listener: Listener, tls, password: str = APP_PASSWORD) -> dict:
    """aiokafka's own arguments for a listener, as an application would write them."""
    security = {"security_protocol": listener.protocol}
    if listener.protocol.endswith("SSL"):
        security["ssl_context"] = create_ssl_context(
            cafile=str(tls.ca),
            certfile=str(tls.client_cert) if listener.client_auth else None,
            keyfile=str(tls.client_key) if listener.client_auth else None,
        )
    if listener.mechanisms == ("OAUTHBEARER",):
        security.update(
            sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=UnsecuredTokenProvider("app", TOKEN_LIFETIME_S)
        )
    elif listener.mechanisms:
        security.update(
            sasl_mechanism=listener.mechanisms[0], sasl_plain_username=APP_USER, sasl_plain_password=password
        )
    return security


def test_roundtrip_up_on_sasl_ssl_scram_512_serves_a_plain_client_and_a_wrong_password_stops_at_start(tmp_path):
    started = time.monotonic()
    secured = {
        "ROUNDTRIP_ENV": "development",
        "ROUNDTRIP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "ROUNDTRIP_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "ROUNDTRIP_KAFKA_SASL_USERNAME": APP_USER,
        "ROUNDTRIP_KAFKA_SASL_PASSWORD": APP_PASSWORD,
    }
    (tmp_path / "first").mkdir()
    with roundtrip_up(tmp_path / "first", env=secured) as (_, env, output):
        ready_s = time.monotonic() - started
        bootstrap, prefix = f"127.0.0.1:{env['ROUNDTRIP_KAFKA_PORT']}", ""
        properties = (tmp_path / "first" / "state" / "kafka-secured" / "server.properties").read_text()
        assert (
            f"listeners=SASLSSL://{bootstrap},CONTROLLER://127.0.0.1:" in properties
        )  # SASL_SSL is its only client listener
        ca = tmp_path / "first" / "state" / "kafka-secured" / "tls" / "ca.pem"
        assert f"export ROUNDTRIP_KAFKA_SSL_CAFILE={ca}" in output.read_text()
        listener = Listener("SASLSSL", "SASL_SSL", int(env["ROUNDTRIP_KAFKA_PORT"]), ("SCRAM-SHA-512",))
        reply = asyncio.run(ask_and_wait(bootstrap, prefix, by_hand(listener, make_tls(ca.parent))))
        assert reply.outcome == "end_turn" and reply.text
        logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "first" / "state" / "logs").glob("*.log"))
        assert APP_PASSWORD not in logs and APP_PASSWORD not in output.read_text()

        # the same fleet, another folder, pointed at that broker with a wrong password: refused at start, one line
        refused_env = {
            **env,
            **secured,
            "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "ROUNDTRIP_KAFKA_SSL_CAFILE": str(ca),
            "ROUNDTRIP_KAFKA_SASL_PASSWORD": "not-the-password",
            "ROUNDTRIP_STATE_DIR": str(tmp_path / "second"),
            "ROUNDTRIP_SIMULATOR_PORT": str(free_port()),
            "ROUNDTRIP_CONSOLE_PORT": str(free_port()),
            "ROUNDTRIP_SHOP_PORT": str(free_port()),
        }
        at = time.monotonic()
        wrong = subprocess.run(
            [sys.executable, "-m", "roundtrip._cli.main", "up"],
            env=refused_env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        refused_s = time.monotonic() - at
        service = subprocess.run(
            [sys.executable, "-m", "roundtrip._cli.main", "run", "gateway"],
            env=refused_env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )  # a service started alone (a pod) says the same
    errors = [line for line in wrong.stderr.splitlines() if line.strip()]
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    assert len(errors) == 1 and "Traceback" not in wrong.stderr, wrong.stderr
    assert "refused the connection: authentication failed (SASL SCRAM-SHA-512 as 'app')" in errors[0], errors[0]
    assert "not-the-password" not in wrong.stdout + wrong.stderr
    said = [
        line
        for line in service.stderr.splitlines()
        if "ERROR" in line or line.startswith("error:") or "Traceback" in line
    ]
    assert (
        service.returncode == 2
        and len(said) == 1
        and said[0].startswith("error:")
        and "authentication failed" in said[0]
    ), service.stderr
    print(f"\nSASL_SSL up ready in {ready_s:.1f}s; wrong password refused in {refused_s:.1f}s")


LISTENERS = {
    "mtls": Listener("MTLS", "SSL", 0, client_auth=True),
    "scram256": Listener("SCRAM256", "SASL_PLAINTEXT", 0, ("SCRAM-SHA-256",)),
    "oauthbearer": Listener("OAUTH", "SASL_PLAINTEXT", 0, ("OAUTHBEARER",)),
}


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory):
    """One broker, a listener for each way in (SCRAM-SHA-256, mTLS, OAUTHBEARER sessions that end with their token)."""
    folder = tmp_path_factory.mktemp("secured-kafka")
    tls = make_tls(folder / "tls")
    listeners = {
        name: Listener(lst.name, lst.protocol, free_port(), lst.mechanisms, lst.client_auth)
        for name, lst in LISTENERS.items()
    }
    kafka = secured_kafka(
        folder / "kafka",
        list(listeners.values()),
        tls,
        {APP_USER: APP_PASSWORD, NOBODY: APP_PASSWORD},
        controller_port=free_port(),
        die_with_parent=True,
        properties={
            # a session lasts as long as its token: aiokafka does not re-authenticate (KIP-368), so
            # the broker closes the connection at the first request after the token expired
            "listener.name.oauth.oauthbearer.connections.max.reauth.ms": 3_600_000,
            # ACLs: the fleet's principals may do anything, NOBODY nothing
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{ADMIN_USER};{BROKER_PRINCIPAL};User:ANONYMOUS;User:{APP_USER};User:CN=client",
        },
    )
    with kafka:
        kafka.wait_ready(120)
        yield listeners, tls


@pytest.mark.parametrize("way", list(LISTENERS))
def test_the_fleet_serves_a_plain_client_over_each_secured_listener(way, secured_broker, tmp_path):
    listeners, tls = secured_broker
    listener = listeners[way]
    bootstrap, state = f"127.0.0.1:{listener.port}", tmp_path / "state"
    values = dict(
        kafka_bootstrap_servers=bootstrap,
        topic_prefix=f"sec{way}.",
        state_dir=state,
        env="development",
        simulator_port=free_port(),
        console_port=free_port(),
        shop_port=free_port(),
        partitions=2,
        log_level="INFO",
        **client_security(listener, tls, APP_USER, APP_PASSWORD),
    )
    env = fleet_env(**values) | {
        "ROUNDTRIP_UNSECURED_TOKEN_LIFETIME_S": str(TOKEN_LIFETIME_S),
        "ROUNDTRIP_UNSECURED_TOKEN_SUBJECT": "app",
    }
    started = time.monotonic()
    with Fleet(Settings(_env_file=None, **values), env=env):
        ready_s = time.monotonic() - started
        first = asyncio.run(ask_and_wait(bootstrap, values["topic_prefix"], by_hand(listener, tls)))
        assert first.outcome == "end_turn" and first.text
        if way == "oauthbearer":  # every session of the fleet has outlived its token by now: the turns still complete
            # until every session, all opened before the first reply, has outlived its token (a slow start included)
            time.sleep(2.5 * TOKEN_LIFETIME_S)  # the wait is the test: sessions past their token's end
            later = [
                asyncio.run(ask_and_wait(bootstrap, values["topic_prefix"], by_hand(listener, tls))) for _ in range(2)
            ]
            assert all(reply.outcome == "end_turn" for reply in later)
            log_file, closed = state / "logs" / "gateway.log", f"Connection at {bootstrap} closed"
            asyncio.run(until(lambda: closed in log_file.read_text(), 30, "the broker to end an expired session"))
            gateway = log_file.read_text()  # the broker ended a session whose token had expired
            assert gateway.count("OAUTHBEARER token") >= 2, gateway  # and the connection made again got a fresh token
    print(f"\n{way}: fleet ready in {ready_s:.1f}s, done in {time.monotonic() - started:.1f}s")


def test_an_untrusted_certificate_or_a_missing_client_certificate_is_one_line(secured_broker, tmp_path):
    listeners, tls = secured_broker
    bootstrap = f"127.0.0.1:{listeners['mtls'].port}"
    base = {
        "ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "ROUNDTRIP_KAFKA_SECURITY_PROTOCOL": "SSL",
        "ROUNDTRIP_STATE_DIR": str(tmp_path),
        "ROUNDTRIP_TOPIC_PREFIX": "untrusted.",
    }
    untrusted = {
        **base,
        "ROUNDTRIP_KAFKA_SSL_CERTFILE": str(tls.client_cert),
        "ROUNDTRIP_KAFKA_SSL_KEYFILE": str(tls.client_key),
    }
    without_cert = {**base, "ROUNDTRIP_KAFKA_SSL_CAFILE": str(tls.ca)}
    for env, cause in (
        (untrusted, "the broker's TLS certificate is not trusted (unable to get local issuer certificate)"),
        (without_cert, "the broker refused this client's certificate or its absence"),
    ):
        environ = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | env
        done = subprocess.run(
            [sys.executable, "-m", "roundtrip._cli.main", "topics", "create"],
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and cause in lines[0], done.stderr


def test_a_principal_without_the_acls_it_needs_stops_at_start_in_one_line(secured_broker, tmp_path):
    listeners, tls = secured_broker
    listener = listeners["scram256"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDTRIP_")} | fleet_env(
        kafka_bootstrap_servers=f"127.0.0.1:{listener.port}",
        topic_prefix="noacl.",
        state_dir=tmp_path,
        env="development",
        **client_security(listener, tls, NOBODY, APP_PASSWORD),
    )
    # the gateway opens the ledger it checks every end against before its consumers start: it is there
    asyncio.run(migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"))
    for argv, refused in (
        (["topics", "create"], "TopicAuthorizationFailedError"),
        (["run", "gateway"], "AuthorizationFailed"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "roundtrip._cli.main", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        said = [
            line
            for line in done.stderr.splitlines()
            if "ERROR" in line or line.startswith("error:") or "Traceback" in line
        ]
        assert done.returncode == 2 and len(said) == 1 and refused in said[0] and "lacks an ACL" in said[0], done.stderr
