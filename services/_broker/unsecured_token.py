"""An OAUTHBEARER token provider for a broker with Kafka's default unsecured validator: unsigned JWS tokens.

For the secured embedded broker on a laptop; never for a real cluster, whose validator checks signatures. A fresh
token is made once less than half its lifetime is left, so a connection made after the old one expired (aiokafka does
not re-authenticate a session, KIP-368: the broker closes it) authenticates with a valid token. Each new token is
logged by its expiry, never the token.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from typing import Any

from aiokafka.abc import AbstractTokenProvider

log = logging.getLogger("roundtrip.kafka")


def _part(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode().rstrip("=")


def unsigned_jws(subject: str, lifetime_s: float, now: float) -> str:
    """header.payload. with alg none: what Kafka's OAuthBearerUnsecuredValidatorCallbackHandler accepts."""
    claims = {"sub": subject, "iat": int(now), "exp": int(now + lifetime_s)}
    return f"{_part({'alg': 'none'})}.{_part(claims)}."


class UnsecuredTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka ships no types
    def __init__(self, subject: str | None = None, lifetime_s: float | None = None) -> None:
        self.subject = subject or os.environ.get("ROUNDTRIP_UNSECURED_TOKEN_SUBJECT", "admin")
        self.lifetime_s = lifetime_s or float(os.environ.get("ROUNDTRIP_UNSECURED_TOKEN_LIFETIME_S", "3600"))
        self._token, self._refresh_at, self.issued = "", 0.0, 0

    async def token(self) -> str:
        now = time.time()
        if now >= self._refresh_at:
            self._token, self._refresh_at = unsigned_jws(self.subject, self.lifetime_s, now), now + self.lifetime_s / 2
            self.issued += 1
            log.info("OAUTHBEARER token %d for %s issued, valid %.0f s", self.issued, self.subject, self.lifetime_s)
        return self._token
