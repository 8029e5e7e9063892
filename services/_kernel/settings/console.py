"""The console's concern: its port, how people sign in (a trusted proxy's headers, or the development user), their
roles, and the session and CSRF keys."""

from __future__ import annotations

from pydantic import (
    Field,
    SecretStr,
    field_validator,
)

from roundtrip._kernel.settings.base import SECRET, Concern


class ConsoleSettings(Concern):
    heading = "the console: the web page where people decide held calls and watch turns"

    console_port: int = Field(8803, ge=1, le=65535, description="Port of the console's web page (on listen_host)")
    console_oidc_issuer: str | None = Field(
        None,
        description=(
            "The signed mode: the OIDC issuer (`https://login.example.com/realms/staff`) whose signed token the "
            "sign-on proxy forwards with every request; its keys come from the issuer's discovery document. Set, "
            "only a token it signed is believed (issuer, audience, expiry, signature)"
        ),
    )
    console_oidc_audience: str | None = Field(
        None, description="The audience (`aud`) the forwarded token must name: the sign-on proxy's client id"
    )
    console_oidc_jwks_url: str | None = Field(
        None,
        description=(
            "Where the issuer's keys are, when it publishes no discovery document (Google IAP: "
            "`https://www.gstatic.com/iap/verify/public_key-jwk`); unset: the discovery document's `jwks_uri`"
        ),
    )
    console_oidc_token_headers: str = Field(
        "authorization,x-forwarded-access-token",
        description=(
            "Comma-separated request headers the token is read from, the first present wins (`authorization`: "
            "`Bearer <token>`; oauth2-proxy: `x-forwarded-access-token`; Google IAP: `x-goog-iap-jwt-assertion`)"
        ),
    )
    console_oidc_name_claims: str = Field(
        "email,preferred_username,sub", description="The token's claims that name the person, the first present wins"
    )
    console_oidc_groups_claim: str = Field(
        "groups", description="The token's claim holding the person's groups (a list, or a comma-separated string)"
    )
    console_trusted_proxies: str = Field(
        "",
        description=(
            "Development only (refused elsewhere: use the signed mode): comma-separated addresses or networks of a "
            "proxy whose X-Forwarded-User / -Email / -Groups headers are believed on its word alone"
        ),
    )
    console_approver_groups: str = Field(
        "roundtrip-approvers",
        description="Comma-separated groups (the token's group claim) whose members may approve, deny and cancel",
    )
    console_viewer_groups: str = Field(
        "roundtrip-viewers", description="Comma-separated groups whose members may look (the inbox, the turns) only"
    )
    console_local_user: str | None = Field(
        None,
        description=(
            "Development only: who a request no proxy signed in is (an approver); unset in development: "
            "`<login>@<host>` of the console's process; outside development it is refused"
        ),
    )
    console_session_key: SecretStr | None = Field(
        None,
        json_schema_extra=SECRET,
        description=(
            "Secret the console's CSRF tokens are signed with; several replicas need the same one; unset: a random "
            "one per process; outside development a placeholder (`CHANGE-ME`) or one shorter than 32 bytes is refused"
        ),
    )
    console_secure_cookies: bool = Field(
        True,
        description=(
            "The console's cookie is Secure (HTTPS only; browsers accept it on http://localhost too); `false` is "
            "refused outside development"
        ),
    )
    console_jaeger_url: str | None = Field(
        None, description="Jaeger's UI the console links a turn's trace to; unset: the Jaeger query URL, if any"
    )
    console_trace_url: str | None = Field(
        None,
        description=(
            "Where the console links a turn's trace: a URL with {trace_id} in it (any tracing UI); unset: "
            "Jaeger's page of the trace at the console's Jaeger URL"
        ),
    )

    @field_validator("console_trace_url")
    @classmethod
    def _trace_template(cls, value: str | None) -> str | None:
        if value and ("{trace_id}" not in value or not value.startswith(("http://", "https://"))):
            raise ValueError(
                "an http(s) URL with {trace_id} where the trace id goes, e.g. https://jaeger/trace/{trace_id}"
            )
        return value or None
