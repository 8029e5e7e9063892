"""The demo shop's HTTP API (Starlette). JSON everywhere.

The principal is the `X-Customer-Id` header, required on every customer endpoint (401
without it). An order of another customer answers exactly like a missing one (404).
Writes need an `Idempotency-Key` header; a replay returns the first response.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from roundtrip._shop import db
from roundtrip._shop.help_articles import search as search_articles

ORDER_ID = re.compile(r"ord_[0-9a-f]{8}")
URGENCIES = ("low", "normal", "high")


def _error(status: int, error: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": error, "message": message, **extra}, status_code=status)


def _not_found() -> JSONResponse:
    return JSONResponse(dict(db.NOT_FOUND_BODY), status_code=404)


def _principal(request: Request) -> str:
    customer_id = request.headers.get("x-customer-id", "").strip()
    if not customer_id:
        raise HTTPException(401, "X-Customer-Id header is required")
    return customer_id


def _idempotency_key(request: Request) -> str:
    key = request.headers.get("idempotency-key", "").strip()
    if not key or len(key) > 255:
        raise HTTPException(400, "Idempotency-Key header (1..255 characters) is required")
    return key


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise HTTPException(400, "body must be a JSON object") from None
    if not isinstance(body, dict):
        raise HTTPException(400, "body must be a JSON object")
    return body


def _engine(request: Request) -> Any:
    return request.app.state.engine


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


async def list_orders(request: Request) -> JSONResponse:
    customer_id = _principal(request)
    status = request.query_params.get("status") or None
    if status is not None and status not in db.STATUSES:
        return _error(400, "bad_request", f"status must be one of {', '.join(db.STATUSES)}")
    raw_limit = request.query_params.get("limit") or str(db.DEFAULT_LIMIT)
    try:
        limit = int(raw_limit)
    except ValueError:
        return _error(400, "bad_request", "limit must be an integer")
    if not 1 <= limit <= db.MAX_LIMIT:
        return _error(400, "bad_request", f"limit must be between 1 and {db.MAX_LIMIT}")
    orders = await db.list_orders(_engine(request), customer_id, status=status, limit=limit)
    return JSONResponse({"orders": orders})


async def get_order(request: Request) -> JSONResponse:
    customer_id = _principal(request)
    order_id = request.path_params["order_id"]
    order = await db.get_order(_engine(request), customer_id, order_id) if ORDER_ID.fullmatch(order_id) else None
    return JSONResponse(order) if order is not None else _not_found()


async def cancel_order(request: Request) -> JSONResponse:
    customer_id = _principal(request)
    key = _idempotency_key(request)
    order_id = request.path_params["order_id"]
    body = await _json_body(request)
    reason = body.get("reason")
    if not isinstance(reason, str) or not 1 <= len(reason) <= 500:
        return _error(400, "bad_request", "reason must be a string of 1..500 characters")
    if not ORDER_ID.fullmatch(order_id):
        return _not_found()
    outcome = await db.cancel_order(_engine(request), customer_id, order_id, reason, key)
    headers = {"Idempotent-Replayed": "true"} if outcome.replayed else None
    return JSONResponse(outcome.body, status_code=outcome.status_code, headers=headers)


async def shipping(request: Request) -> JSONResponse:
    customer_id = _principal(request)
    order_id = request.path_params["order_id"]
    info = await db.shipping_status(_engine(request), customer_id, order_id) if ORDER_ID.fullmatch(order_id) else None
    return JSONResponse(info) if info is not None else _not_found()


async def help_search(request: Request) -> JSONResponse:
    query = request.query_params.get("q", "").strip()
    if not query:
        return _error(400, "bad_request", "q is required")
    return JSONResponse({"articles": search_articles(query[:200])})


async def escalate(request: Request) -> JSONResponse:
    customer_id = _principal(request)
    key = _idempotency_key(request)
    body = await _json_body(request)
    summary, urgency = body.get("summary"), body.get("urgency", "normal")
    if not isinstance(summary, str) or not 1 <= len(summary) <= 2000:
        return _error(400, "bad_request", "summary must be a string of 1..2000 characters")
    if urgency not in URGENCIES:
        return _error(400, "bad_request", f"urgency must be one of {', '.join(URGENCIES)}")
    outcome = await db.create_escalation(_engine(request), customer_id, summary, urgency, key)
    headers = {"Idempotent-Replayed": "true"} if outcome.replayed else None
    return JSONResponse(outcome.body, status_code=outcome.status_code, headers=headers)


async def admin_orders(request: Request) -> JSONResponse:
    return JSONResponse({"orders": await db.admin_orders(_engine(request))})


async def admin_reset(request: Request) -> JSONResponse:
    await db.reset_demo_data(_engine(request))
    return JSONResponse({"ok": True})


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    codes = {400: "bad_request", 401: "unauthenticated", 404: "not_found", 405: "method_not_allowed"}
    return _error(exc.status_code, codes.get(exc.status_code, "error"), exc.detail)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    return _error(500, "internal_error", "the shop failed to process the request")


def create_app(database_url: str, seed: bool = True) -> Starlette:
    """The shop app; its lifespan creates the schema and (by default) seeds the demo data (httpx.ASGITransport runs
    no lifespan: use `app.router.lifespan_context(app)` in process)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine = db.make_engine(database_url)
        app.state.engine = engine
        try:
            await db.create_schema(engine)
            if seed:
                await db.seed_demo_data(engine)
            yield
        finally:
            await db.dispose(engine)

    routes = [
        Route("/health", health),
        Route("/orders", list_orders),
        Route("/orders/{order_id}", get_order),
        Route("/orders/{order_id}/cancel", cancel_order, methods=["POST"]),
        Route("/orders/{order_id}/shipping", shipping),
        Route("/help/search", help_search),
        Route("/escalations", escalate, methods=["POST"]),
        Route("/admin/orders", admin_orders),
        Route("/admin/reset", admin_reset, methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, 500: _server_error},
    )


async def serve(database_url: str, port: int, host: str = "127.0.0.1", seed: bool = True) -> None:
    import uvicorn

    config = uvicorn.Config(create_app(database_url, seed=seed), host=host, port=port, log_level="warning")
    await uvicorn.Server(config).serve()


def main(argv: list[str] | None = None) -> None:
    """`python -m roundtrip._shop [--port N] [--database-url URL] [--no-seed]`."""
    import argparse
    import asyncio

    from roundtrip._kernel.settings import get_settings
    from roundtrip._shop.agent.settings import ShopAgentSettings

    settings, own = get_settings(), ShopAgentSettings()
    parser = argparse.ArgumentParser(prog="python -m roundtrip._shop", description="Serve the demo shop API")
    parser.add_argument("--host", default=settings.listen_host)
    parser.add_argument("--port", type=int, default=own.shop_port)
    parser.add_argument("--database-url", default=own.shop_db_url(settings.state_dir))
    parser.add_argument("--no-seed", action="store_true", help="do not insert the demo data")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.database_url, args.port, host=args.host, seed=not args.no_seed))
