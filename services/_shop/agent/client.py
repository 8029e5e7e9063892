"""Async client of the demo shop's HTTP API, over one shared httpx.AsyncClient on aiohttp (httpx's own pool walks
every pooled connection on each request, which costs more than the call with many in flight:
docs/decisions/http-clients.md).

Every customer call sends the principal as `X-Customer-Id`. Lookups return None on 404 (missing and not-yours look
the same); other failures raise the errors below.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import quote

import httpx


def _seg(value: str) -> str:
    """One path segment, escaped (an id can never climb to another endpoint)."""
    return quote(value, safe="").replace(".", "%2E")


class ShopError(Exception):
    """The shop answered something unexpected (a 4xx the caller did not anticipate)."""

    def __init__(self, message: str, status_code: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class ShopUnavailable(ShopError):
    """The shop could not be reached, timed out, or failed (5xx). Retrying later may work."""


class OrderNotFound(ShopError):
    """No such order for this customer (it may exist for someone else: we cannot tell)."""


class OrderNotCancellable(ShopError):
    def __init__(self, order_id: str, status: str) -> None:
        super().__init__(f"order {order_id} is {status} and cannot be cancelled", 409)
        self.order_id = order_id
        self.status = status


class IdempotencyConflict(ShopError):
    """The idempotency key was already used for a different request."""


class ShopClient:
    def __init__(self, base_url: str, timeout: float, transport: httpx.AsyncBaseTransport) -> None:
        """`transport`: its HTTP connections (the agent's are aiohttp's)."""
        self.base_url = base_url
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ShopClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(
        self, method: str, path: str, customer_id: str | None, *, idempotency_key: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers: dict[str, str] = {}
        if customer_id is not None:
            if not customer_id:
                raise ValueError("customer_id must not be empty")
            headers["X-Customer-Id"] = customer_id
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        try:
            response = await self._http.request(method, path, headers=headers, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # (aiohttp's refused connection maps to the latter)
            raise ShopUnavailable(f"shop unreachable at {self.base_url}: {exc!r}") from exc
        except httpx.TimeoutException as exc:
            raise ShopUnavailable(f"shop timed out on {method} {path}") from exc
        except httpx.TransportError as exc:
            raise ShopUnavailable(f"shop unreachable at {self.base_url}: {exc!r}") from exc
        if response.status_code >= 500:
            raise ShopUnavailable(f"shop failed on {method} {path}: HTTP {response.status_code}", response.status_code)
        return response

    @staticmethod
    def _json(response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise ShopError(f"shop sent invalid JSON (HTTP {response.status_code})", response.status_code) from exc

    def _unexpected(self, response: httpx.Response, what: str) -> ShopError:
        try:
            body = response.json()
        except ValueError:
            body = response.text[:500]
        return ShopError(f"{what}: HTTP {response.status_code} {body}", response.status_code, body)

    async def health(self) -> bool:
        try:
            response = await self._request("GET", "/health", None)
        except ShopUnavailable:
            return False
        return response.status_code == 200

    async def list_orders(self, customer_id: str, status: str | None, limit: int | None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {}
        if status is not None:
            params["status"] = status
        if limit is not None:
            params["limit"] = limit
        response = await self._request("GET", "/orders", customer_id, params=params)
        if response.status_code != 200:
            raise self._unexpected(response, "list_orders")
        return cast("list[dict[str, Any]]", self._json(response)["orders"])

    async def get_order(self, customer_id: str, order_id: str) -> dict[str, Any] | None:
        response = await self._request("GET", f"/orders/{_seg(order_id)}", customer_id)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._unexpected(response, "get_order")
        return cast("dict[str, Any] | None", self._json(response))

    async def shipping_status(self, customer_id: str, order_id: str) -> dict[str, Any] | None:
        response = await self._request("GET", f"/orders/{_seg(order_id)}/shipping", customer_id)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._unexpected(response, "shipping_status")
        return cast("dict[str, Any] | None", self._json(response))

    async def cancel_order(self, customer_id: str, order_id: str, reason: str, idempotency_key: str) -> dict[str, Any]:
        """The cancelled order. Raises OrderNotFound, OrderNotCancellable, IdempotencyConflict."""
        response = await self._request(
            "POST",
            f"/orders/{_seg(order_id)}/cancel",
            customer_id,
            idempotency_key=idempotency_key,
            json={"reason": reason},
        )
        if response.status_code == 200:
            return cast("dict[str, Any]", self._json(response))
        if response.status_code == 404:
            raise OrderNotFound(f"order {order_id} not found", 404)
        if response.status_code == 409:
            body = self._json(response)
            raise OrderNotCancellable(order_id, str(body.get("status", "unknown")))
        if response.status_code == 422:
            raise IdempotencyConflict(self._json(response).get("message", "idempotency conflict"), 422)
        raise self._unexpected(response, "cancel_order")

    async def search_help(self, customer_id: str, query: str) -> list[dict[str, Any]]:
        response = await self._request("GET", "/help/search", customer_id, params={"q": query})
        if response.status_code != 200:
            raise self._unexpected(response, "search_help")
        return cast("list[dict[str, Any]]", self._json(response)["articles"])

    async def escalate(self, customer_id: str, summary: str, urgency: str, idempotency_key: str) -> dict[str, Any]:
        response = await self._request(
            "POST",
            "/escalations",
            customer_id,
            idempotency_key=idempotency_key,
            json={"summary": summary, "urgency": urgency},
        )
        if response.status_code in (200, 201):
            return cast("dict[str, Any]", self._json(response))
        if response.status_code == 422:
            raise IdempotencyConflict(self._json(response).get("message", "idempotency conflict"), 422)
        raise self._unexpected(response, "escalate")

    async def admin_orders(self) -> list[dict[str, Any]]:
        response = await self._request("GET", "/admin/orders", None)
        if response.status_code != 200:
            raise self._unexpected(response, "admin_orders")
        return cast("list[dict[str, Any]]", self._json(response)["orders"])
