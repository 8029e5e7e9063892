"""What a deployment manifest runs, read from deploy/k8s or docker-compose.yml: workloads, containers, addresses.

    k8s_manifest(docs, replicas={"executor": 3})          docs: tests.manifests.k8s_documents()
    compose_manifest(resolved, scale={"executor": 3})     resolved: tests.manifests.compose_config()

A Workload (a k8s Deployment or Job, a compose service) has replicas; each replica runs its init containers
to completion, in order (k8s initContainers), then its main container. A k8s Job, and a compose service that
others wait for with `service_completed_successfully`, is a one-shot workload, and `after` says what a compose
service waits for. `Manifest.addresses` maps every (host, port) at which one workload reaches another
(a k8s Service and its DNS names, a compose service name) to (that workload, the port its process
listens on as the manifest numbers it). Every container starts from the image's ENV (the Dockerfile's
last stage), as a container runtime does, and has the files its Secret and ConfigMap volumes mount (k8s).

Nothing is guessed: a kind of workload, a container layout or a compose service the test cannot run
raises ManifestError, so a manifest that grows one fails the test instead of being half run.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.manifests import DOCKERFILE, container_env, full_command, kinds, mounted_files

# compose services that are not the roundtrip image: the test session provides each (its broker, its PostgreSQL,
# an OTLP receiver) and the addresses that name them are replaced by the session's
STAND_INS = {"apache/kafka": "kafka", "postgres": "postgres", "jaegertracing/jaeger": "otlp"}


class ManifestError(RuntimeError):
    pass


@dataclass
class Container:
    argv: list[str]
    env: dict[str, str]  # as the manifest gives it, over the image's ENV
    ready: tuple[str, int] | None = None  # readiness: GET path on a port the process listens on (manifest numbering)
    files: dict[str, str] = field(default_factory=dict)  # k8s: path -> text of what its Secret/ConfigMap volumes mount


@dataclass
class Workload:
    name: str
    replicas: int
    main: Container
    init: list[Container] = field(default_factory=list)
    after: dict[str, str] = field(default_factory=dict)  # compose depends_on: workload -> condition
    one_shot: bool = False  # a k8s Job; compose: a job the others wait to complete


@dataclass
class Manifest:
    shape: str  # "k8s" or "compose"
    workloads: dict[str, Workload]
    addresses: dict[tuple[str, int], tuple[str, int]]
    stand_ins: set[str] = field(default_factory=set)  # compose services the session stands in for

    def identity(self, workload: str, replica: int) -> dict[str, str]:
        """What the platform tells a replica about itself: its pod name (k8s) or container id (compose)."""
        if self.shape == "k8s":
            template = hashlib.sha1(workload.encode()).hexdigest()[:9]
            # the kubelet's own variables (the API server's address is never dialled by the fleet)
            return {
                "HOSTNAME": f"{workload}-{template}-{uuid.uuid4().hex[:5]}",
                "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                "KUBERNETES_SERVICE_PORT": "443",
            }
        return {"HOSTNAME": uuid.uuid4().hex[:12]}


def image_env(dockerfile: str | None = None) -> dict[str, str]:
    """The ENV of the Dockerfile's last stage (`ENV K=V K2=V2`, continued lines joined)."""
    text = dockerfile if dockerfile is not None else DOCKERFILE.read_text(encoding="utf-8")
    last_stage = re.split(r"(?im)^FROM\s", text)[-1]
    env: dict[str, str] = {}
    for line in re.sub(r"\\\n", " ", last_stage).splitlines():
        if re.match(r"(?i)^ENV\s", line):
            for item in shlex.split(line.split(None, 1)[1], comments=True):
                name, eq, value = item.partition("=")
                if not eq:
                    raise ManifestError(f"Dockerfile: only the ENV K=V form is understood: {line!r}")
                env[name] = value
    return env


# -- deploy/k8s ------------------------------------------------------------------------------------


def k8s_manifest(docs: list[dict[str, Any]], replicas: dict[str, int] | None = None) -> Manifest:
    replicas = replicas or {}
    unsupported = {d["kind"] for d in docs} - {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Job",
        "Service",
        "ScaledObject",
        "TriggerAuthentication",
    }
    if unsupported:
        raise ManifestError(f"deploy/k8s has kinds this test does not run yet: {sorted(unsupported)}")
    base = image_env()
    workloads: dict[str, Workload] = {}
    ports_of: dict[str, dict[str, int]] = {}  # deployment -> container port name -> number
    jobs = kinds(docs, "Job")
    for name, deployment in {**kinds(docs, "Deployment"), **jobs}.items():
        pod = deployment["spec"]["template"]["spec"]
        if len(pod["containers"]) != 1:
            raise ManifestError(f"{name}: the test runs pods of one container (and init containers)")
        (main,) = pod["containers"]
        ports_of[name] = {p["name"]: p["containerPort"] for p in main.get("ports", []) if "name" in p}

        def container(c: dict[str, Any], ports: dict[str, int] = ports_of[name], pod: dict = pod) -> Container:
            probe = c.get("readinessProbe", {}).get("httpGet")
            ready = None
            if probe:
                port = probe["port"]
                ready = (probe.get("path", "/"), ports[port] if isinstance(port, str) else int(port))
            return Container(full_command(c), {**base, **container_env(docs, c)}, ready, mounted_files(docs, pod, c))

        if name in jobs and deployment["spec"].get("parallelism", 1) != 1:
            raise ManifestError(f"{name}: the test runs Jobs of one pod at a time")
        workloads[name] = Workload(
            name,
            1 if name in jobs else replicas.get(name, deployment["spec"].get("replicas", 1)),
            container(main),
            init=[container(c) for c in pod.get("initContainers", [])],
            one_shot=name in jobs,  # the Deployments do not wait for it: their init containers wait for what it makes
        )
    addresses: dict[tuple[str, int], tuple[str, int]] = {}
    for name, service in kinds(docs, "Service").items():
        selector = service["spec"]["selector"]
        (target,) = [
            d
            for d, dep in kinds(docs, "Deployment").items()
            if selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        ]
        namespace = service["metadata"].get("namespace", "default")
        hosts = (name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local")
        for port in service["spec"]["ports"]:
            target_port = port.get("targetPort", port["port"])
            listens = ports_of[target][target_port] if isinstance(target_port, str) else int(target_port)
            for host in hosts:
                addresses[(host, port["port"])] = (target, listens)
    return Manifest("k8s", workloads, addresses)


# -- docker-compose.yml ------------------------------------------------------------------------------


def _stand_in(service: dict[str, Any]) -> str | None:
    image = service.get("image", "").rsplit(":", 1)[0]
    return STAND_INS.get(image) if not service.get("build") else None


def _compose_ready(healthcheck: dict[str, Any] | None, env: dict[str, str]) -> tuple[str, int] | None:
    """The URL the service's healthcheck asks on its own loopback; on the health port, /readyz (its consumer
    groups joined: what a user's first request needs), which is stricter than the check's /healthz."""
    if not healthcheck:
        return None
    found = re.search(r"http://(?:127\.0\.0\.1|localhost):(\d+)(/[\w/]*)", " ".join(healthcheck.get("test", [])))
    if not found:
        raise ManifestError(f"a healthcheck this test cannot follow: {healthcheck.get('test')}")
    port, path = int(found.group(1)), found.group(2)
    return ("/readyz" if str(port) == env.get("ROUNDTRIP_HEALTH_PORT") else path), port


def compose_manifest(resolved: dict[str, Any], scale: dict[str, int] | None = None) -> Manifest:
    scale = scale or {}
    base = image_env()
    services = resolved["services"]
    stand_ins = {name for name, s in services.items() if _stand_in(s)}
    unknown = [name for name, s in services.items() if not s.get("build") and name not in stand_ins]
    if unknown:
        raise ManifestError(f"docker-compose.yml has services the test has no stand-in for: {unknown}")
    waited_for = {
        dep
        for s in services.values()
        for dep, how in (s.get("depends_on") or {}).items()
        if how["condition"] == "service_completed_successfully"
    }
    workloads: dict[str, Workload] = {}
    addresses: dict[tuple[str, int], tuple[str, int]] = {}
    for name, s in services.items():
        if name in stand_ins:
            continue
        if s.get("entrypoint"):
            raise ManifestError(f"{name}: an entrypoint; the test runs the image's (none) with the service's command")
        env = {**base, **{k: v for k, v in (s.get("environment") or {}).items() if v is not None}}
        replicas = scale.get(name, (s.get("deploy") or {}).get("replicas", 1))
        workloads[name] = Workload(
            name,
            replicas,
            Container(list(s["command"]), env, _compose_ready(s.get("healthcheck"), env)),
            after={dep: how["condition"] for dep, how in (s.get("depends_on") or {}).items()},
            one_shot=name in waited_for,
        )
        for variable, value in env.items():  # the container listens on its port settings, reached by service name
            if variable.endswith("_PORT") and value.isdigit():
                addresses[(name, int(value))] = (name, int(value))
    return Manifest("compose", workloads, addresses, stand_ins)
