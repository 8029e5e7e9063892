"""A tiny OIDC provider for the tests, built from joserfc (authlib's JOSE library, not the PyJWT the console verifies
with), run as its own process: `python -m tests.oidc_issuer PORT`. Its issuer is http://127.0.0.1:PORT.

It publishes what a real issuer publishes to the console: its discovery document
(`/.well-known/openid-configuration`) and its keys (`/jwks`, RSA, key id `k1`). In place of a sign-in it mints, for
the tests, the token an identity-aware proxy would forward: `POST /mint` with the claims as JSON answers the signed
token (`iss`, `iat` and `exp` in 300 s added unless the claims name them, and `email_verified: true` with an `email`:
an address the issuer checked); `POST /mint?kid=none` signs it without a key id in its header (OIDC Core 10.1 allows
that while the issuer publishes one key). `POST /rotate` adds a new key (and signs with it from then on), as an
issuer rotating its keys does; `POST /outage` with `{"down": true}` makes its discovery document and keys answer 503
until `{"down": false}`; `GET /hits` counts the requests for them (`discovery`, `jwks`), answered or not.

Tokens signed by another key are made by the test itself with `another_key()` and `sign()`.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from roundtrip._broker.embedded import die_with_parent_preexec, free_port

LIFETIME_S = 300


def another_key(kid: str = "k1") -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid})


def sign(claims: dict[str, Any], key: RSAKey, kid: bool = True) -> str:
    return jwt.encode({"alg": "RS256", "typ": "JWT"} | ({"kid": key.kid} if kid else {}), claims, key)


def build(port: int) -> ThreadingHTTPServer:
    issuer = f"http://127.0.0.1:{port}"
    keys = [another_key("k1")]
    hits = {"discovery": 0, "jwks": 0}
    outage = {"down": False}

    class Handler(BaseHTTPRequestHandler):
        def _json(self, body: Any, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # http.server's name
            if self.path in ("/.well-known/openid-configuration", "/jwks"):
                hits["discovery" if self.path.startswith("/.well-known") else "jwks"] += 1
                if outage["down"]:
                    self._json({"error": "temporarily unavailable"}, 503)
                    return
            if self.path == "/.well-known/openid-configuration":
                self._json(
                    {
                        "issuer": issuer,
                        "jwks_uri": f"{issuer}/jwks",
                        "authorization_endpoint": f"{issuer}/authorize",  # required by the spec; not served
                        "token_endpoint": f"{issuer}/token",
                        "response_types_supported": ["code"],
                        "subject_types_supported": ["public"],
                        "id_token_signing_alg_values_supported": ["RS256"],
                    }
                )
            elif self.path == "/jwks":
                self._json(KeySet(list(keys)).as_dict(private=False))
            elif self.path == "/hits":
                self._json(hits)
            else:
                self._json({"error": "not found"}, 404)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path in ("/mint", "/mint?kid=none"):
                now = int(time.time())
                claims = {"iss": issuer, "iat": now, "exp": now + LIFETIME_S, **json.loads(body or b"{}")}
                if "email" in claims:
                    claims.setdefault("email_verified", True)
                self._json({"token": sign(claims, keys[-1], kid=self.path == "/mint")})
            elif self.path == "/outage":
                outage["down"] = bool(json.loads(body)["down"])
                self._json(outage)
            elif self.path == "/rotate":
                keys.append(another_key(f"k{len(keys) + 1}"))
                self._json({"kid": keys[-1].kid})
            else:
                self._json({"error": "not found"}, 404)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


class Running:
    """The issuer's process, as the tests ask it."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def mint(self, **claims: Any) -> str:
        return httpx.post(f"{self.url}/mint", json=claims, timeout=10).json()["token"]

    def mint_without_kid(self, **claims: Any) -> str:
        return httpx.post(f"{self.url}/mint?kid=none", json=claims, timeout=10).json()["token"]

    def outage(self, down: bool) -> None:
        httpx.post(f"{self.url}/outage", json={"down": down}, timeout=10).raise_for_status()

    def fetches(self) -> dict[str, int]:
        return httpx.get(f"{self.url}/hits", timeout=10).json()

    def rotate(self) -> str:
        return httpx.post(f"{self.url}/rotate", timeout=10).json()["kid"]

    def jwks_fetches(self) -> int:
        return httpx.get(f"{self.url}/hits", timeout=10).json()["jwks"]


@contextlib.contextmanager
def running() -> Iterator[Running]:
    """The issuer as its own process, up (its discovery document answers) until the block ends."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_issuer", str(port)], preexec_fn=die_with_parent_preexec(signal.SIGTERM)
    )
    try:
        issuer = Running(port)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{issuer.url}/.well-known/openid-configuration", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the test OIDC issuer did not start (exit {process.poll()})") from None
                time.sleep(0.1)  # poll interval: the issuer process binding its port
        yield issuer
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    build(int(sys.argv[1])).serve_forever()
