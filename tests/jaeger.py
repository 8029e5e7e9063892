"""A real Jaeger v2 for tests: the binary `bash scripts/jaeger.sh build` caches, started on free ports.

    from tests.jaeger import Jaeger, jaeger_binary
    with Jaeger() as jaeger:                      # raises JaegerError when the binary is not built
        settings = Settings(otlp_endpoint=jaeger.otlp_http_endpoint, ...)
        ...
        jaeger.traces("roundtrip-gateway")        # GET /api/traces?service=... of the query API

Storage is in memory (deploy/jaeger/config.yaml), so every instance starts empty.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from roundtrip._broker.embedded import die_with_parent_preexec, free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "deploy" / "jaeger" / "config.yaml"
DEFAULT_VERSION = "v1.76.0"  # Go module version of Jaeger v2 (2.13.0); keep in step with scripts/jaeger.sh


class JaegerError(RuntimeError):
    pass


def jaeger_binary(version: str | None = None) -> Path | None:
    """The cached binary scripts/jaeger.sh builds (same cache rules), or None when it is not built."""
    version = version or os.environ.get("ROUNDTRIP_JAEGER_VERSION", DEFAULT_VERSION)
    cache = os.environ.get("ROUNDTRIP_JAEGER_CACHE") or str(Path.home() / ".cache" / "roundtrip" / f"jaeger-{version}")
    binary = Path(cache) / "jaeger"
    return binary if os.access(binary, os.X_OK) else None


class Jaeger:
    """One Jaeger v2 process with in-memory storage on free ports of 127.0.0.1."""

    def __init__(self, log_file: Path | None = None, binary: Path | None = None) -> None:
        self.binary = binary or jaeger_binary()
        if self.binary is None:
            raise JaegerError("the Jaeger v2 binary is not built; run: bash scripts/jaeger.sh build")
        self.ports = {
            "JAEGER_OTLP_GRPC_PORT": free_port(),
            "JAEGER_OTLP_HTTP_PORT": free_port(),
            "JAEGER_QUERY_PORT": free_port(),
            "JAEGER_QUERY_GRPC_PORT": free_port(),
            "JAEGER_HEALTH_PORT": free_port(),
        }
        self.log_file = log_file
        self.process: subprocess.Popen | None = None

    @property
    def otlp_http_endpoint(self) -> str:
        """What ROUNDTRIP_OTLP_ENDPOINT is set to (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self.ports['JAEGER_OTLP_HTTP_PORT']}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['JAEGER_QUERY_PORT']}"

    def start(self, timeout: float = 30.0) -> Jaeger:
        env = {**os.environ, "JAEGER_HOST": "127.0.0.1", **{k: str(v) for k, v in self.ports.items()}}
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
        try:
            self.process = subprocess.Popen(
                [str(self.binary), "--config", f"file:{CONFIG}"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent_preexec(signal.SIGTERM),
            )
        finally:
            if self.log_file:
                out.close()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Ready when the health check says so, the query API answers and the OTLP/HTTP port accepts."""
        deadline = time.monotonic() + timeout
        health = f"http://127.0.0.1:{self.ports['JAEGER_HEALTH_PORT']}/status"
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise JaegerError(
                    f"jaeger exited with code {self.process.returncode} during start-up" + self._log_tail()
                )
            try:
                if (
                    httpx.get(health, timeout=1).status_code == 200
                    and httpx.get(f"{self.query_url}/api/services", timeout=1).status_code == 200
                ):
                    with socket.create_connection(("127.0.0.1", self.ports["JAEGER_OTLP_HTTP_PORT"]), timeout=1):
                        return
            except (httpx.HTTPError, OSError):
                pass
            if time.monotonic() > deadline:
                raise JaegerError(f"jaeger was not ready within {timeout:g} s" + self._log_tail())
            time.sleep(0.1)  # poll interval: Jaeger answering its readiness probe

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> Jaeger:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the query API ---------------------------------------------------------------------------
    def services(self) -> list[str]:
        return httpx.get(f"{self.query_url}/api/services", timeout=5).json()["data"] or []

    def traces(self, service: str, **params: Any) -> list[dict[str, Any]]:
        """GET /api/traces?service=...: the traces (with their spans and processes) of one service."""
        response = httpx.get(f"{self.query_url}/api/traces", params={"service": service, **params}, timeout=10)
        response.raise_for_status()
        return response.json()["data"] or []

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        response = httpx.get(f"{self.query_url}/api/traces/{trace_id}", timeout=10)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        data = response.json()["data"]
        return data[0] if data else None

    def _log_tail(self) -> str:
        if not self.log_file or not self.log_file.exists():
            return ""
        return "; last lines of its log:\n" + "\n".join(self.log_file.read_text(errors="replace").splitlines()[-20:])
