"""The credentials an agent gives an MCP server: `McpServer(name, ..., auth=BearerToken(...) | ClientCredentials(...))`.

A secret is read when a connection needs it (a rotated secret file is taken without a restart). The objects hold
where a secret is, never the secret: their repr, the logs and spans can only name its `source` ("env BILLING_TOKEN").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import SecretStr

if TYPE_CHECKING:
    import httpx2

RENEW_MARGIN_S = 60.0  # a token is renewed this long (at most a tenth of its life) before it expires


class CredentialError(Exception):
    """A credential cannot be read (one line naming where it should be, never a value)."""


def _where(env: str | None, file: str | Path | None, setting: str | None) -> str:
    return f"env {env}" if env else f"setting {setting}" if setting else f"file {file}"


def _place_problems(what: str, env: str | None, file: str | Path | None, setting: str | None) -> list[str]:
    if sum(map(bool, (env, file, setting))) != 1:
        return [
            f"{what}: give exactly one of env= (an environment variable), file= (a mounted secret file) or "
            "setting= (a field of the agent's own settings)"
        ]
    for name, value in (("env", env), ("setting", setting)):
        if value is not None and not isinstance(value, str):
            return [f"{what}: {name} must be a name, not {type(value).__name__}"]
    return []


def _read(env: str | None, file: str | Path | None, setting: str | None, own_settings: Any) -> str:
    if env:
        value = os.environ.get(env, "").strip()
        if not value:
            raise CredentialError(f"environment variable {env} is not set")
        return value
    if setting:
        held: Any = getattr(own_settings, setting, None)
        value = (held.get_secret_value() if isinstance(held, SecretStr) else str(held or "")).strip()
        if not value:
            raise CredentialError(f"the agent's setting {setting} is not set")
        return value
    try:
        value = Path(file or "").read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CredentialError(f"secret file {file} cannot be read ({exc.strerror or type(exc).__name__})") from None
    if not value:
        raise CredentialError(f"secret file {file} is empty")
    return value


@dataclass(frozen=True)
class BearerToken:
    """A token sent on every request: from `env`, a mounted secret `file` (read at each connection) or a `setting`
    of the agent's own settings (best a SecretStr). `header`: Authorization (`Bearer <token>`), or another header
    that carries the value as it is (e.g. an API key)."""

    env: str | None = None
    file: str | Path | None = None
    header: str = "Authorization"
    setting: str | None = None

    @property
    def kind(self) -> str:
        return "bearer token" if self.header.lower() == "authorization" else f"{self.header} header"

    @property
    def source(self) -> str:
        return _where(self.env, self.file, self.setting)

    @property
    def setting_name(self) -> str | None:
        return self.setting

    def problems(self) -> list[str]:
        found = _place_problems("BearerToken", self.env, self.file, self.setting)
        if not isinstance(self.header, str) or not self.header.replace("-", "").isalnum():
            found.append(f"BearerToken: header must be an HTTP header name, not {self.header!r}")
        return found

    def headers(self, own_settings: Any = None) -> dict[str, str]:
        value = _read(self.env, self.file, self.setting, own_settings)
        return {self.header: f"Bearer {value}" if self.header.lower() == "authorization" else value}


@dataclass(frozen=True)
class ClientCredentials:
    """OAuth 2.1 client credentials: the client's id and secret (`client_secret_env`, `_file` or `_setting`)
    exchanged for a token at the authorization server whose issuer URL is `issuer`, and only there."""

    issuer: str
    client_id: str
    client_secret_env: str | None = None
    client_secret_file: str | Path | None = None
    scopes: Sequence[str] = ()
    auth_method: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"
    client_secret_setting: str | None = None

    kind = "OAuth client credentials"

    @property
    def source(self) -> str:
        secret = _where(self.client_secret_env, self.client_secret_file, self.client_secret_setting)
        return f"client {self.client_id} at {self.issuer}, secret from {secret}"

    @property
    def setting_name(self) -> str | None:
        return self.client_secret_setting

    def problems(self) -> list[str]:
        found = _place_problems(
            "ClientCredentials' secret", self.client_secret_env, self.client_secret_file, self.client_secret_setting
        )
        if not isinstance(self.issuer, str) or not self.issuer.startswith(("https://", "http://")):
            found.append(
                f"ClientCredentials: issuer must be the authorization server's issuer URL, not {self.issuer!r}"
            )
        if not isinstance(self.client_id, str) or not self.client_id:
            found.append("ClientCredentials: client_id is empty")
        if isinstance(self.scopes, str):
            found.append(f"ClientCredentials: scopes must be a list of scopes, not the string {self.scopes!r}")
        if self.auth_method not in ("client_secret_basic", "client_secret_post"):
            found.append(f"ClientCredentials: auth_method {self.auth_method!r} is not client_secret_basic or _post")
        return found

    def provider(self, url: str, own_settings: Any) -> httpx2.Auth:
        secret = _read(self.client_secret_env, self.client_secret_file, self.client_secret_setting, own_settings)
        return _provider(self, url, secret)


McpAuth = BearerToken | ClientCredentials


class _SaidOnce(logging.Filter):
    """Drops the SDK's traceback of a failed token exchange: the mount says it in one line naming the server."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "OAuth flow error"


def _provider(credentials: ClientCredentials, url: str, secret: str) -> httpx2.Auth:
    from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider

    sdk_log = logging.getLogger("mcp.client.auth.oauth2")
    if not any(isinstance(f, _SaidOnce) for f in sdk_log.filters):
        sdk_log.addFilter(_SaidOnce())

    class RenewingEarly(ClientCredentialsOAuthProvider):
        """The SDK's provider, taking a token as expired RENEW_MARGIN_S early: its own check has no margin, and a
        token valid when sent could expire on the way."""

        async def _handle_token_response(self, response: Any) -> None:
            await super()._handle_token_response(response)
            tokens, expiry = self.context.current_tokens, self.context.token_expiry_time
            if tokens is not None and tokens.expires_in and expiry is not None:
                self.context.token_expiry_time = expiry - min(RENEW_MARGIN_S, int(tokens.expires_in) / 10)

    return RenewingEarly(
        server_url=url,
        storage=_InMemory(),
        client_id=credentials.client_id,
        client_secret=secret,
        token_endpoint_auth_method=credentials.auth_method,
        scope=" ".join(credentials.scopes) or None,
        issuer=credentials.issuer,
    )


class _InMemory:
    def __init__(self) -> None:
        self.tokens: Any = None
        self.client_info: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client_info

    async def set_client_info(self, client_info: Any) -> None:
        self.client_info = client_info
