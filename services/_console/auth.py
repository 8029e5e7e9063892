"""Who is asking, and what they may do: the console's sign-in, its roles and its CSRF tokens.

**Identity.** The company's single sign-on sits in front of the console as a reverse proxy (oauth2-proxy, or any proxy
that sets the same headers): it authenticates the person and passes `X-Forwarded-User`, `X-Forwarded-Email` and
`X-Forwarded-Groups`. Those headers are believed only when ROUNDTRIP_CONSOLE_TRUSTED_PROXIES is set and only on a
connection from one of its addresses; from anywhere else they are ignored (anyone can type a header). In the
development fleet, a request no proxy vouched for is the local user (ROUNDTRIP_CONSOLE_LOCAL_USER, else
`<login>@<host>`), an approver. Nobody else is served a page.

**Roles.** `approver` (may approve, deny and cancel) and `viewer` (may look), from the groups the proxy names
(ROUNDTRIP_CONSOLE_APPROVER_GROUPS, ROUNDTRIP_CONSOLE_VIEWER_GROUPS). A signed-in person in neither is refused.

**CSRF.** Every page sets a cookie `roundtrip_csrf` (HttpOnly, Secure, SameSite=Strict) holding a token signed for the
signed-in identity; every POST must carry the same token in its form (`csrf`). Another site can neither read the cookie
nor make a token that verifies for this person, so a forged or replayed post from elsewhere is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

from starlette.requests import Request

from roundtrip._kernel.settings import Settings

APPROVER, VIEWER = "approver", "viewer"
CSRF_COOKIE, CSRF_FIELD = "roundtrip_csrf", "csrf"
USER_HEADER, EMAIL_HEADER, GROUPS_HEADER = "x-forwarded-user", "x-forwarded-email", "x-forwarded-groups"


@dataclass(frozen=True)
class Identity:
    name: str  # what `decided_by` records: the e-mail the proxy names, else its user
    role: str | None  # APPROVER, VIEWER, or None (signed in, but in no console group)
    via: str  # "proxy" or "local"

    @property
    def may_decide(self) -> bool:
        return self.role == APPROVER


class NotSignedIn(Exception):
    """No identity the console believes: `message` says why (shown on the 401 page)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _names(spec: str) -> set[str]:
    return {part.strip() for part in spec.split(",") if part.strip()}


def _networks(spec: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    try:
        return [ipaddress.ip_network(part, strict=False) for part in _names(spec)]
    except ValueError as exc:
        raise ValueError(f"ROUNDTRIP_CONSOLE_TRUSTED_PROXIES: {exc}") from None


class Gatekeeper:
    """The console's sign-in as the settings configure it."""

    def __init__(self, settings: Settings) -> None:
        self.proxies = _networks(settings.console_trusted_proxies)
        self.approvers = _names(settings.console_approver_groups)
        self.viewers = _names(settings.console_viewer_groups)
        self.local = settings.console_local_identity
        key = settings.console_session_key
        self._key = key.get_secret_value().encode() if key else secrets.token_bytes(32)

    def from_proxy(self, request: Request) -> bool:
        host = request.client.host if request.client else ""
        try:
            peer = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(peer in network for network in self.proxies)

    def identify(self, request: Request) -> Identity:
        """The signed-in person, or NotSignedIn."""
        headers = request.headers
        user = (headers.get(EMAIL_HEADER) or headers.get(USER_HEADER) or "").strip()
        if self.proxies and user and self.from_proxy(request):
            groups = _names(headers.get(GROUPS_HEADER, ""))
            role = APPROVER if groups & self.approvers else VIEWER if groups & self.viewers else None
            return Identity(user[:200], role, "proxy")
        if self.local:
            return Identity(self.local, APPROVER, "local")
        if not self.proxies:
            raise NotSignedIn(
                "no sign-in is configured: put the company's sign-on proxy in front of the console and name its "
                "addresses in ROUNDTRIP_CONSOLE_TRUSTED_PROXIES"
            )
        raise NotSignedIn("not signed in: open the console through the company's sign-on")

    # -- CSRF -------------------------------------------------------------------------------
    def _mac(self, nonce: str, identity: Identity) -> str:
        return hmac.new(self._key, f"{nonce}\x00{identity.name}".encode(), hashlib.sha256).hexdigest()

    def token(self, identity: Identity, current: str | None) -> str:
        """The CSRF token for `identity`: the one its cookie holds when that verifies, else a new one."""
        if current and self.verifies(identity, current):
            return current
        nonce = secrets.token_urlsafe(16)
        return f"{nonce}.{self._mac(nonce, identity)}"

    def verifies(self, identity: Identity, token: str) -> bool:
        nonce, _, mac = token.partition(".")
        return bool(nonce and mac) and hmac.compare_digest(self._mac(nonce, identity), mac)

    def check_post(self, identity: Identity, request: Request, submitted: str) -> bool:
        """A POST is genuine when its form's token equals its cookie's and verifies for this person."""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        return bool(submitted) and hmac.compare_digest(submitted, cookie) and self.verifies(identity, submitted)
