"""An OAuth 2.1 authorization server for the tests, built from authlib (its Flask integration), run as its own process:
`python -m tests.oauth_server PORT CLIENTS`, where CLIENTS is a JSON file {client_id: secret}. Its issuer is
http://127.0.0.1:PORT.

It grants client credentials only (RFC 6749 4.4, authlib's ClientCredentialsGrant: the client authenticated with
HTTP Basic or in the form), issues opaque tokens valid 300 s, publishes its RFC 8414 metadata, and answers RFC 7662
introspection (`POST /introspect`, for the test MCP server). `POST /revoke-client/<client_id>` revokes a client: its
secret is no longer accepted and every token it holds is inactive from then on.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, grants
from flask import Flask, jsonify, request

LIFETIME_S = 300


class Client(ClientMixin):
    def __init__(self, client_id: str, secret: str) -> None:
        self.client_id, self.secret, self.revoked = client_id, secret, False

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return None

    def get_allowed_scope(self, scope: str) -> str:
        return scope or ""

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return False

    def check_client_secret(self, client_secret: str) -> bool:
        return not self.revoked and client_secret == self.secret

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return False

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "client_credentials"


def build(port: int, clients: dict[str, str]) -> Flask:
    issuer = f"http://127.0.0.1:{port}"
    app = Flask("oauth")
    app.config["OAUTH2_TOKEN_EXPIRES_IN"] = {"client_credentials": LIFETIME_S}
    known = {client_id: Client(client_id, secret) for client_id, secret in clients.items()}
    tokens: dict[str, dict[str, Any]] = {}

    def save_token(token: dict[str, Any], req: Any) -> None:
        tokens[token["access_token"]] = {
            "client_id": req.client.client_id,
            "scope": token.get("scope", ""),
            "exp": int(time.time()) + int(token["expires_in"]),
        }

    server = AuthorizationServer(app, query_client=known.get, save_token=save_token)
    server.register_grant(grants.ClientCredentialsGrant)

    @app.get("/.well-known/oauth-authorization-server")
    def metadata() -> Any:
        return jsonify(
            {
                "issuer": issuer,
                "authorization_endpoint": f"{issuer}/authorize",  # RFC 8414 requires it; no code grant is served
                "token_endpoint": f"{issuer}/token",
                "introspection_endpoint": f"{issuer}/introspect",
                "grant_types_supported": ["client_credentials"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
                "response_types_supported": ["token"],
            }
        )

    @app.post("/token")
    def token() -> Any:
        return server.create_token_response()

    @app.post("/introspect")
    def introspect() -> Any:
        held = tokens.get(request.form.get("token", ""))
        if held is None or held["exp"] < time.time() or known[held["client_id"]].revoked:
            return jsonify({"active": False})
        return jsonify({"active": True, "iss": issuer, **held})

    @app.post("/revoke-client/<client_id>")
    def revoke(client_id: str) -> Any:
        known[client_id].revoked = True
        return jsonify({"revoked": client_id})

    return app


if __name__ == "__main__":
    from werkzeug.serving import run_simple

    port = int(sys.argv[1])
    run_simple("127.0.0.1", port, build(port, json.loads(Path(sys.argv[2]).read_text())), threaded=True)
