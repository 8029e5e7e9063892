"""The secured embedded broker's configuration (services/_broker/secured.py), without starting it: the listeners,
the SCRAM users formatted in, the throwaway CA the clients trust."""

from __future__ import annotations

import shutil
import ssl

import pytest

from roundtrip._broker.secured import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    Listener,
    client_security,
    make_tls,
    scram_arguments,
    secured_properties,
)
from roundtrip._broker.unsecured_token import UnsecuredTokenProvider, unsigned_jws
from roundtrip._kernel.kafka.security import client_options
from roundtrip._kernel.settings import KafkaSecurity

LISTENERS = [
    Listener("SCRAM", "SASL_SSL", 9101, ("SCRAM-SHA-512",)),
    Listener("MTLS", "SSL", 9102, client_auth=True),
    Listener("OAUTH", "SASL_PLAINTEXT", 9103, ("OAUTHBEARER",)),
    Listener("PLAIN", "SASL_PLAINTEXT", 9104, ("PLAIN",)),
]


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    return make_tls(tmp_path_factory.mktemp("tls"))


def test_only_the_secured_listeners_face_clients_and_the_controller_stays_plaintext_on_loopback(tls):
    props = secured_properties("127.0.0.1", 9100, LISTENERS, tls, {"app": "pw"})
    assert props["listeners"] == (
        "SCRAM://127.0.0.1:9101,MTLS://127.0.0.1:9102,OAUTH://127.0.0.1:9103,PLAIN://127.0.0.1:9104,"
        "CONTROLLER://127.0.0.1:9100"
    )
    assert (
        props["listener.security.protocol.map"]
        == "SCRAM:SASL_SSL,MTLS:SSL,OAUTH:SASL_PLAINTEXT,PLAIN:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
    )
    assert "CONTROLLER" not in props["advertised.listeners"]
    assert (props["inter.broker.listener.name"], props["sasl.mechanism.inter.broker.protocol"]) == (
        "SCRAM",
        "SCRAM-SHA-512",
    )
    assert (
        props["listener.name.mtls.ssl.client.auth"] == "required"
        and props["listener.name.scram.ssl.client.auth"] == "none"
    )
    assert "unsecuredLoginStringClaim_sub" in props["listener.name.oauth.oauthbearer.sasl.jaas.config"]
    assert 'user_app="pw"' in props["listener.name.plain.plain.sasl.jaas.config"]  # PLAIN users live in the JAAS config
    assert "\n" not in props["listener.name.scram.ssl.keystore.key"]  # one properties line


def test_the_scram_users_and_the_brokers_own_are_formatted_in():
    args = scram_arguments({"app": "pw"}, LISTENERS)
    assert args == [
        "--add-scram",
        f"SCRAM-SHA-512=[name={ADMIN_USER},password=admin-secret]",
        "--add-scram",
        "SCRAM-SHA-512=[name=app,password=pw]",
    ]


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext) -> str:
    """A TLS handshake in memory (client to 127.0.0.1); the common name of the client certificate the server got."""
    pipes = [(ssl.MemoryBIO(), ssl.MemoryBIO()) for _ in range(2)]
    ends = [client.wrap_bio(*pipes[0], server_hostname="127.0.0.1"), server.wrap_bio(*pipes[1], server_side=True)]
    done = [False, False]
    for _ in range(20):
        for i, end in enumerate(ends):
            try:
                end.do_handshake()
                done[i] = True
            except ssl.SSLWantReadError:
                pass
        pipes[1][0].write(pipes[0][1].read())  # client's output to the server's input
        pipes[0][0].write(pipes[1][1].read())
        if all(done):
            break
    return dict(item[0] for item in ends[1].getpeercert()["subject"])["commonName"]


def test_the_throwaway_ca_signs_a_broker_certificate_for_loopback_and_a_client_certificate(tls):
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls.broker_cert, tls.broker_key)
    server.load_verify_locations(tls.ca)
    server.verify_mode = ssl.CERT_REQUIRED  # mTLS: the client's certificate is checked too
    client = ssl.create_default_context(cafile=str(tls.ca))
    client.load_cert_chain(tls.client_cert, tls.client_key)
    assert (
        _handshake(client, server) == "client"
    )  # the server saw the client's certificate, the client checked 127.0.0.1
    assert make_tls(tls.folder).ca == tls.ca  # kept when already made
    admin = client_security(LISTENERS[1], tls, ADMIN_USER, ADMIN_PASSWORD)
    mtls = client_options(KafkaSecurity(_env_file=None, **admin))
    assert mtls["security_protocol"] == "SSL" and mtls["ssl_context"].verify_mode == ssl.CERT_REQUIRED


async def test_unsigned_tokens_say_who_and_until_when_and_a_fresh_one_comes_after_half_their_life():
    _header, _claims, signature = unsigned_jws("app", 60, now=1000).split(".")
    assert signature == ""
    provider = UnsecuredTokenProvider("app", lifetime_s=3600)
    first = await provider.token()
    assert await provider.token() == first and provider.issued == 1
    provider._refresh_at = 0  # half its life has passed
    await provider.token()
    assert provider.issued == 2
