"""The embedded broker, secured: a throwaway CA and certificates, SCRAM users, SASL and TLS listeners.

Each listener speaks one protocol with its own SASL mechanisms: SCRAM (users formatted into the metadata log), PLAIN
(users in the listener's JAAS config), OAUTHBEARER (Kafka's unsecured validator), or SSL with a client certificate
required. The KRaft controller listener stays PLAINTEXT on loopback (SCRAM is not allowed there); the first listener
is the inter-broker one. Readiness is a real client of the first listener, since a secured port does not answer the
plain metadata probe. The keys are unencrypted PEM files with a two-day lifetime, for a laptop only.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roundtrip._broker.embedded import BrokerSetupError, EmbeddedKafka
from roundtrip._kernel.kafka.security import sasl_password

ADMIN_USER, ADMIN_PASSWORD = "admin", "admin-secret"  # the broker's own principal (inter-broker), a superuser
BROKER_PRINCIPAL = "User:CN=broker"  # the same over an mTLS inter-broker listener (its certificate's subject)
# with it (properties={"authorizer.class.name": AUTHORIZER}) the broker denies whatever no ACL allows
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
_LOGIN = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}


@dataclass(frozen=True)
class Listener:
    name: str  # the listener's name in server.properties (upper case)
    protocol: str
    port: int
    mechanisms: tuple[str, ...] = ()
    client_auth: bool = False  # SSL: a client certificate signed by the CA is required (mTLS)


class Tls:
    """The PEM files in one folder: the CA clients trust, the broker's key and certificate, a client's (mTLS)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.ca, self.broker_key, self.broker_cert = (
            self.folder / "ca.pem",
            self.folder / "broker.key",
            self.folder / "broker.pem",
        )
        self.client_key, self.client_cert = self.folder / "client.key", self.folder / "client.pem"


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if not openssl:
        raise BrokerSetupError(
            "`openssl` not found: the secured embedded broker makes its throwaway CA with it (install openssl)"
        )
    done = subprocess.run([openssl, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise BrokerSetupError(f"openssl {args[0]} failed: {done.stderr.strip()}")


TLS_HOSTS = ("127.0.0.1", "localhost")  # the names the broker's certificate is for


def make_tls(folder: Path) -> Tls:
    """A CA and two certificates it signs (the broker's for TLS_HOSTS, a client's CN=client); kept when made already."""
    tls = Tls(Path(folder))
    if tls.client_cert.is_file():
        return tls
    tls.folder.mkdir(parents=True, exist_ok=True)
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *key,
        "-keyout",
        str(tls.folder / "ca.key"),
        "-out",
        str(tls.ca),
        "-days",
        "2",
        "-subj",
        "/CN=roundtrip throwaway CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    names = ",".join(f"IP:{h}" if h[0].isdigit() else f"DNS:{h}" for h in TLS_HOSTS)
    for who, cert, private, extension in (
        ("broker", tls.broker_cert, tls.broker_key, f"subjectAltName={names}"),
        ("client", tls.client_cert, tls.client_key, "extendedKeyUsage=clientAuth"),
    ):
        request = tls.folder / f"{who}.csr"
        _openssl("req", *key, "-keyout", str(private), "-out", str(request), "-subj", f"/CN={who}")
        (tls.folder / f"{who}.ext").write_text(extension + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            str(request),
            "-CA",
            str(tls.ca),
            "-CAkey",
            str(tls.folder / "ca.key"),
            "-CAcreateserial",
            "-out",
            str(cert),
            "-days",
            "2",
            "-extfile",
            str(tls.folder / f"{who}.ext"),
        )
    return tls


def _inline(pem: Path) -> str:
    return pem.read_text().strip().replace("\n", "\\n")  # one properties line; Java reads \n back as a newline


def _jaas(mechanism: str, users: Mapping[str, str]) -> str:
    if mechanism == "OAUTHBEARER":
        return f'{_LOGIN[mechanism]} required unsecuredLoginStringClaim_sub="{ADMIN_USER}";'
    plain_users = (
        "".join(f' user_{name}="{password}"' for name, password in users.items()) if mechanism == "PLAIN" else ""
    )
    return f'{_LOGIN[mechanism]} required username="{ADMIN_USER}" password="{ADMIN_PASSWORD}"{plain_users};'


def secured_properties(
    host: str, controller_port: int, listeners: Sequence[Listener], tls: Tls | None, users: Mapping[str, str]
) -> dict[str, object]:
    """server.properties entries for these listeners (over the embedded broker's own)."""
    first = listeners[0]
    props: dict[str, object] = {
        "listeners": ",".join(
            [*(f"{lst.name}://{host}:{lst.port}" for lst in listeners), f"CONTROLLER://{host}:{controller_port}"]
        ),
        "advertised.listeners": ",".join(f"{lst.name}://{host}:{lst.port}" for lst in listeners),
        "listener.security.protocol.map": ",".join(
            [*(f"{lst.name}:{lst.protocol}" for lst in listeners), "CONTROLLER:PLAINTEXT"]
        ),
        "inter.broker.listener.name": first.name,
        # for an authorizer: the broker itself (it checks transactions with itself on the inter-broker listener) and
        # the loopback controller listener's ANONYMOUS; no client listener is ANONYMOUS, SSL ones require a certificate
        "super.users": f"User:{ADMIN_USER};{BROKER_PRINCIPAL};User:ANONYMOUS",
    }
    if first.mechanisms:
        props["sasl.mechanism.inter.broker.protocol"] = first.mechanisms[0]
    users = {ADMIN_USER: ADMIN_PASSWORD, **users}
    for lst in listeners:
        prefix = f"listener.name.{lst.name.lower()}."
        if lst.mechanisms:
            props[prefix + "sasl.enabled.mechanisms"] = ",".join(lst.mechanisms)
            for mechanism in lst.mechanisms:
                props[f"{prefix}{mechanism.lower()}.sasl.jaas.config"] = _jaas(mechanism, users)
        if lst.protocol.endswith("SSL"):
            assert tls is not None, f"listener {lst.name} ({lst.protocol}) needs the TLS files"
            props.update(
                {
                    prefix + "ssl.keystore.type": "PEM",
                    prefix + "ssl.keystore.key": _inline(tls.broker_key),
                    prefix + "ssl.keystore.certificate.chain": _inline(tls.broker_cert),
                    prefix + "ssl.truststore.type": "PEM",
                    prefix + "ssl.truststore.location": str(tls.ca),
                    prefix + "ssl.client.auth": "required" if lst.client_auth else "none",
                }
            )
    return props


def scram_arguments(users: Mapping[str, str], listeners: Sequence[Listener]) -> list[str]:
    """`StorageTool format` arguments that put the SCRAM users (and the broker's own) into the metadata log."""
    mechanisms = sorted({m for lst in listeners for m in lst.mechanisms if m.startswith("SCRAM-")})
    users = {ADMIN_USER: ADMIN_PASSWORD, **users}
    return [
        arg
        for m in mechanisms
        for name, password in users.items()
        for arg in ("--add-scram", f"{m}=[name={name},password={password}]")
    ]


def client_security(listener: Listener, tls: Tls | None, user: str, password: str) -> dict[str, Any]:
    """The ROUNDTRIP_KAFKA_* settings a client of this listener uses (as Settings keyword arguments)."""
    values: dict[str, Any] = {"kafka_security_protocol": listener.protocol}
    if listener.protocol.endswith("SSL") and tls is not None:
        values["kafka_ssl_cafile"] = tls.ca
        if listener.client_auth:
            values.update(kafka_ssl_certfile=tls.client_cert, kafka_ssl_keyfile=tls.client_key)
    if listener.mechanisms:
        mechanism = listener.mechanisms[0]
        values["kafka_sasl_mechanism"] = mechanism
        if mechanism == "OAUTHBEARER":
            values["kafka_sasl_oauth_token_provider"] = "roundtrip._broker.unsecured_token:UnsecuredTokenProvider"
        else:
            values.update(kafka_sasl_username=user, kafka_sasl_password=password)
    return values


def ready_probe(host: str, listener: Listener, tls: Tls | None) -> Callable[[], bool]:
    """True once a client authenticated on `listener` sees a live broker (its own event loop, from any thread)."""
    from roundtrip._kernel.kafka.clients import KafkaClients
    from roundtrip._kernel.kafka.security import client_options
    from roundtrip._kernel.settings import KafkaSecurity

    admin = client_security(listener, tls, ADMIN_USER, ADMIN_PASSWORD)
    kafka = KafkaClients(f"{host}:{listener.port}", client_options(KafkaSecurity(_env_file=None, **admin)))

    async def probe() -> bool:
        admin = kafka.admin(client_id="roundtrip-probe", request_timeout_ms=3000)
        try:
            await admin.start()
            return bool((await admin.describe_cluster()).get("brokers"))
        finally:
            await admin.close()

    def ready() -> bool:
        socket.create_connection((host, listener.port), timeout=2.0).close()
        try:
            return asyncio.run(probe())
        except Exception as exc:  # noqa: BLE001 - not ready yet: the caller retries and reports the last one
            raise OSError(f"{type(exc).__name__}: {exc}") from None

    return ready


def secured_kafka(
    data_dir: Path,
    listeners: Sequence[Listener],
    tls: Tls | None,
    users: Mapping[str, str],
    **options: Any,
) -> EmbeddedKafka:
    """An EmbeddedKafka (not started) listening on `listeners` only (and its controller), with these users."""
    users = dict(users)
    host, controller_port = options.get("host", "127.0.0.1"), options.get("controller_port", 9093)
    properties = {**secured_properties(host, controller_port, listeners, tls, users), **options.pop("properties", {})}
    return EmbeddedKafka(
        data_dir,
        listeners[0].port,
        properties=properties,
        format_args=scram_arguments(users, listeners),
        probe=ready_probe(host, listeners[0], tls),
        **options,
    )


def embedded_as_configured(settings: Any, data_dir: Path, **options: Any) -> tuple[EmbeddedKafka, dict[str, Any]]:
    """The embedded broker secured as a fleet's settings say: one listener of their protocol and mechanism on
    kafka_port, with their user; also the TLS settings its clients need where the settings leave them unset. The users
    are formatted in at the first start: delete `data_dir` to change them."""
    protocol, mechanism = settings.kafka_security_protocol, settings.kafka_sasl_mechanism
    listener = Listener(
        protocol.replace("_", ""),
        protocol,
        settings.kafka_port,
        (mechanism,) if mechanism else (),
        client_auth=protocol == "SSL",
    )
    tls = make_tls(data_dir / "tls") if protocol.endswith("SSL") else None
    # a user has a password: the settings' checks refuse SASL without both
    users = {settings.kafka_sasl_username: sasl_password(settings) or ""} if settings.kafka_sasl_username else {}
    admin = client_security(listener, tls, ADMIN_USER, ADMIN_PASSWORD)
    wanted = {key: value for key, value in admin.items() if key.startswith("kafka_ssl_")}
    tls_settings = {key: value for key, value in wanted.items() if getattr(settings, key) is None}
    kafka = secured_kafka(
        data_dir,
        [listener],
        tls,
        users,
        controller_port=settings.kafka_controller_port,
        version=settings.kafka_version,
        java_opts=settings.kafka_java_opts or None,
        log_level=settings.kafka_log_level,
        cache=settings.kafka_cache,
        **options,
    )
    return kafka, tls_settings
