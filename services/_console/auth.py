"""Who is asking, and what they may do: the console's sign-in, its roles and its CSRF tokens (docs/console.md).

In the signed mode an identity-aware proxy passes the person's OIDC token, believed only when PyJWT verifies its
signature with one of the issuer's published keys, its issuer, audience and expiry; where a request comes from proves
nothing, so it is not asked. The development modes (trusted proxy headers, the local user) are refused outside
development. Every POST must carry the CSRF token of its cookie, signed for the signed-in identity and its time:
another site can neither read the cookie nor make a token that verifies for this person, nor use an old one.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import secrets
import time
from dataclasses import dataclass
from typing import Any, Protocol, cast

import httpx
import jwt
from pydantic import SecretStr
from starlette.requests import Request

from roundtrip._kernel.clock import SYSTEM, Clock

APPROVER, VIEWER = "approver", "viewer"
CSRF_COOKIE, CSRF_FIELD = "roundtrip_csrf", "csrf"
USER_HEADER, EMAIL_HEADER, GROUPS_HEADER = "x-forwarded-user", "x-forwarded-email", "x-forwarded-groups"
# Asymmetric algorithms only: a token "signed" with a shared secret or none at all is never believed.
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
LEEWAY_S = 30  # clocks of the issuer and the console disagree a little
JWKS_LIFESPAN_S = 300
# A token with a key id the cached keys lack fetches them again at most this often: forged key ids cannot make the
# console hammer the issuer, and a key the issuer rotated in is believed within this long.
JWKS_REFRESH_COOLDOWN_S = 30.0
REFUSAL_WINDOW_S = 60.0
# A CSRF token (of a cookie, and of the forms of the pages it was sent with) is refused once this old: one that leaked
# (a proxy's log, a shared screen) is of use for a working day at most.
CSRF_LIFETIME_S = 8 * 3600
security = logging.getLogger("roundtrip.security")


@dataclass(frozen=True)
class Identity:
    name: str  # what `decided_by` records: the e-mail the proxy names, else its user
    role: str | None  # APPROVER, VIEWER, or None (signed in, but in no console group)
    via: str  # "token" (signed), "proxy" (development headers) or "local"

    @property
    def may_decide(self) -> bool:
        return self.role == APPROVER


class NotSignedIn(Exception):
    """No identity the console believes: `message` says why (shown on the 401 page)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.message, self.status = message, status


class Refusals:
    """The log of refused sign-ins, at most one line per (address, reason) a window, with the count not written."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def refused(self, reason: str, address: str, claimed: str | None, detail: str = "") -> None:
        now = self.clock.monotonic()
        key = (address, reason)
        last, unwritten = self._seen.get(key, (-REFUSAL_WINDOW_S, 0))
        if now - last < REFUSAL_WINDOW_S:
            self._seen[key] = (last, unwritten + 1)
            return
        if len(self._seen) > 10_000:  # a flood from many addresses: forget the old windows, never grow without end
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < REFUSAL_WINDOW_S}
        self._seen[key] = (now, 0)
        security.warning(
            "refused sign-in: reason=%s from=%r claimed=%r%s%s",
            reason,
            address,
            claimed,
            f" detail={detail!r}" if detail else "",
            f" (and {unwritten} more from this address for this reason since the last line)" if unwritten else "",
        )


def _names(spec: str) -> set[str]:
    return {part.strip() for part in spec.split(",") if part.strip()}


def _ordered(spec: str) -> list[str]:
    """A comma-separated list whose order matters (the first present wins)."""
    return [part.strip() for part in spec.split(",") if part.strip()]


def _networks(spec: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    try:
        return [ipaddress.ip_network(part, strict=False) for part in _names(spec)]
    except ValueError as exc:
        raise ValueError(f"ROUNDTRIP_CONSOLE_TRUSTED_PROXIES: {exc}") from None


def _claimed(token: str) -> str | None:
    """Who a token says it is, unverified: for the refusal's log line only."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    for claim in ("email", "preferred_username", "sub"):
        if isinstance(claims.get(claim), str):
            return cast(str, claims[claim][:200])
    return None


def _names_person(claims: dict[str, Any], claim: str) -> bool:
    """A non-empty text claim; `email` only when the issuer says it verified it: an address anyone may type into
    their profile at the issuer would otherwise name them as whoever owns it."""
    if claim == "email" and claims.get("email_verified") not in (True, "true"):
        return False
    return isinstance(claims.get(claim), str) and bool(claims[claim])


class IssuerAway(Exception):
    """The issuer's discovery document or keys could not be read; asked again in `retry_s`."""

    def __init__(self, message: str, retry_s: float) -> None:
        super().__init__(message)
        self.retry_s = retry_s


def _signing_key(keys: jwt.PyJWKClient, token: str) -> Any:
    if jwt.get_unverified_header(token).get("kid") is not None:
        return keys.get_signing_key_from_jwt(token).key
    # OIDC Core 10.1: a token need not name its key when the issuer publishes one; with several, which is unknowable
    signing = [k for k in keys.get_jwk_set().keys if k.public_key_use in ("sig", None)]
    if len(signing) != 1:
        raise jwt.PyJWKClientError(f"the token names no key id and the issuer publishes {len(signing)} signing keys")
    return signing[0].key


class Issuer:
    """The OIDC issuer's keys: its discovery document read once, its JWKS through PyJWKClient.

    A failed fetch (discovery or keys) is not tried again for JWKS_REFRESH_COOLDOWN_S: an issuer out of reach is asked
    once per cooldown, not once per request, and said once in the log; sign-ins meanwhile answer 503."""

    def __init__(self, issuer: str, jwks_url: str | None) -> None:
        self.issuer = issuer.rstrip("/")
        self._jwks_url = jwks_url
        self._client: jwt.PyJWKClient | None = None
        self._lock = asyncio.Lock()  # one fetch at a time: requests that waited on a failing one find its cooldown
        self._away_until, self._away = 0.0, ""

    async def _keys(self) -> jwt.PyJWKClient:
        if self._client is None:
            url = self._jwks_url
            if not url:
                try:
                    async with httpx.AsyncClient(timeout=10) as http:
                        found = await http.get(f"{self.issuer}/.well-known/openid-configuration")
                        found.raise_for_status()
                        url = str(found.json()["jwks_uri"])
                except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
                    raise IssuerAway(f"its discovery document: {type(exc).__name__}: {exc}"[:300], 0) from None
            self._client = jwt.PyJWKClient(  # the key set is cached, not each key: one the issuer withdrew
                url,  # is no longer believed once the set is fetched again
                cache_keys=False,
                lifespan=JWKS_LIFESPAN_S,
                timeout=10,
                cooldown_duration=JWKS_REFRESH_COOLDOWN_S,
            )
        return self._client

    async def key(self, token: str) -> Any:
        async with self._lock:
            if (wait := self._away_until - time.monotonic()) > 0:
                raise IssuerAway(self._away, wait)
            try:
                keys = await self._keys()
                return await asyncio.to_thread(_signing_key, keys, token)
            except (IssuerAway, jwt.PyJWKClientConnectionError, json.JSONDecodeError) as exc:
                cooldown = JWKS_REFRESH_COOLDOWN_S
                self._away_until, self._away = time.monotonic() + cooldown, str(exc)[:300]
                security.error(
                    "the console cannot fetch the issuer's keys (%s): sign-ins answer 503 and it asks again in %.0f s",
                    self._away,
                    cooldown,
                )
                raise IssuerAway(self._away, cooldown) from None


class SignIn(Protocol):
    """The settings the sign-in reads: of ConsoleSettings, and whom a development console signs in (Settings')."""

    console_oidc_issuer: str | None
    console_oidc_jwks_url: str | None
    console_oidc_audience: str | None
    console_oidc_token_headers: str
    console_oidc_name_claims: str
    console_oidc_groups_claim: str
    console_trusted_proxies: str
    console_approver_groups: str
    console_viewer_groups: str
    console_session_key: SecretStr | None

    @property
    def console_local_identity(self) -> str | None: ...


class Gatekeeper:
    """The console's sign-in as the settings configure it."""

    def __init__(self, settings: SignIn) -> None:
        self.issuer = (
            Issuer(settings.console_oidc_issuer, settings.console_oidc_jwks_url)
            if settings.console_oidc_issuer
            else None
        )
        self.audience = settings.console_oidc_audience or ""
        self.token_headers = _ordered(settings.console_oidc_token_headers.lower()) or ["authorization"]
        self.name_claims = _ordered(settings.console_oidc_name_claims)
        self.groups_claim = settings.console_oidc_groups_claim.strip()
        self.refusals = Refusals(SYSTEM)
        self.proxies = [] if self.issuer else _networks(settings.console_trusted_proxies)
        self.approvers = _names(settings.console_approver_groups)
        self.viewers = _names(settings.console_viewer_groups)
        self.local = settings.console_local_identity
        key = settings.console_session_key
        self._key = key.get_secret_value().encode() if key else secrets.token_bytes(32)
        self.clock = time.time  # the CSRF tokens' clock (wall time: every replica must agree on it)

    def from_proxy(self, request: Request) -> bool:
        host = request.client.host if request.client else ""
        try:
            peer = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(peer in network for network in self.proxies)

    def _role(self, groups: set[str]) -> str | None:
        return APPROVER if groups & self.approvers else VIEWER if groups & self.viewers else None

    def _token(self, request: Request) -> str | None:
        for name in self.token_headers:
            value = request.headers.get(name, "").strip()
            if name == "authorization":
                scheme, _, value = value.partition(" ")
                value = value.strip() if scheme.lower() == "bearer" else ""
            if value:
                return value
        return None

    def _refuse(self, request: Request, reason: str, token: str | None, detail: str = "") -> NotSignedIn:
        address = request.client.host if request.client else "?"
        self.refusals.refused(reason, address, _claimed(token) if token else None, detail)
        return NotSignedIn(f"not signed in: {reason.replace('-', ' ')}: open the console through the company's sign-on")

    async def _verified(self, request: Request) -> Identity:
        assert self.issuer is not None
        token = self._token(request)
        if token is None:
            raise self._refuse(request, "no-token", None)
        try:
            key = await self.issuer.key(token)
            claims = jwt.decode(
                token,
                key,
                algorithms=ALGORITHMS,
                audience=self.audience,
                issuer=self.issuer.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise self._refuse(request, "expired", token) from None
        except jwt.InvalidAudienceError:
            raise self._refuse(request, "wrong-audience", token) from None
        except jwt.InvalidIssuerError:
            raise self._refuse(request, "wrong-issuer", token) from None
        except jwt.InvalidSignatureError:
            raise self._refuse(request, "bad-signature", token) from None
        except (
            jwt.PyJWKClientError
        ) as exc:  # no key of the issuer has this token's key id (or it names none of several)
            raise self._refuse(request, "unknown-key", token, str(exc)[:200]) from None
        except IssuerAway as exc:  # said in the log by the Issuer, once per cooldown
            retry = f"try again in {math.ceil(exc.retry_s)} s"
            raise NotSignedIn(f"the console cannot reach the sign-on's keys: {retry}", 503) from None
        except jwt.PyJWTError as exc:  # malformed, not yet valid, a required claim missing, an algorithm refused
            raise self._refuse(request, "invalid-token", token, f"{type(exc).__name__}: {exc}"[:200]) from None
        name = next((claims[c] for c in self.name_claims if _names_person(claims, c)), None)
        if name is None:
            raise self._refuse(request, "no-name-claim", token)
        raw = claims.get(self.groups_claim, [])
        groups = _names(raw) if isinstance(raw, str) else {str(g) for g in raw} if isinstance(raw, list) else set()
        return Identity(name[:200], self._role(groups), "token")

    async def identify(self, request: Request) -> Identity:
        """The signed-in person, or NotSignedIn."""
        if self.issuer is not None:
            return await self._verified(request)
        headers = request.headers
        user = (headers.get(EMAIL_HEADER) or headers.get(USER_HEADER) or "").strip()
        if self.proxies and user and self.from_proxy(request):
            return Identity(user[:200], self._role(_names(headers.get(GROUPS_HEADER, ""))), "proxy")
        if self.local:
            return Identity(self.local, APPROVER, "local")
        if not self.proxies:
            raise NotSignedIn(
                "no sign-in is configured: put the company's sign-on proxy in front of the console and name its "
                "issuer in ROUNDTRIP_CONSOLE_OIDC_ISSUER (docs/console.md)"
            )
        raise NotSignedIn("not signed in: open the console through the company's sign-on")

    def _mac(self, nonce: str, issued: str, identity: Identity) -> str:
        message = f"{nonce}\x00{issued}\x00{identity.name}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def token(self, identity: Identity, current: str | None) -> str:
        """The CSRF token for `identity`: the one its cookie holds while it verifies and is in the first half of its
        life (a form on a page lives at least CSRF_LIFETIME_S / 2), else a new one."""
        if current and self.verifies(identity, current, CSRF_LIFETIME_S / 2):
            return current
        nonce, issued = secrets.token_urlsafe(16), str(int(self.clock()))
        return f"{nonce}.{issued}.{self._mac(nonce, issued, identity)}"

    def verifies(self, identity: Identity, token: str, lifetime_s: float = CSRF_LIFETIME_S) -> bool:
        """Signed for this person with this console's key, and issued less than `lifetime_s` ago."""
        nonce, issued, mac = [*token.split("."), "", ""][:3]
        if not (nonce and issued.isdigit() and mac) or not hmac.compare_digest(self._mac(nonce, issued, identity), mac):
            return False
        return -LEEWAY_S <= self.clock() - int(issued) < lifetime_s  # replicas' clocks disagree a little

    def check_post(self, identity: Identity, request: Request, submitted: str) -> bool:
        """A POST is genuine when its form's token equals its cookie's and verifies for this person."""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        return bool(submitted) and hmac.compare_digest(submitted, cookie) and self.verifies(identity, submitted)
