"""Endpoints that steer the simulator mid-run, not part of the API: its limits (/v1/_limits) and bursts of overload
(/v1/_overload)."""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .errors import ApiError, invalid
from .overload import MESSAGES, Overload
from .ratelimits import KINDS, RateLimits


def routes(limits: RateLimits, overload: Overload) -> list[Route]:
    async def get_limits(request: Request) -> Response:
        return JSONResponse(limits.snapshot())

    async def set_limits(request: Request) -> Response:
        try:
            limits.configure(_limits(await _object(request)))
        except ApiError as error:
            return JSONResponse(error.body("req_sim_control"), status_code=error.status)
        return JSONResponse(limits.snapshot())

    async def start_overload(request: Request) -> Response:
        try:
            body = await _object(request)
            seconds, status = body.get("seconds"), body.get("status", 529)
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
                raise invalid(f"seconds: expected a number of seconds (0 ends the burst), got {seconds!r}")
            if status not in MESSAGES or isinstance(status, bool):
                raise invalid(f"status: expected one of {', '.join(map(str, MESSAGES))}, got {status!r}")
        except ApiError as error:
            return JSONResponse(error.body("req_sim_control"), status_code=error.status)
        overload.start(float(seconds), status)
        return JSONResponse({"overloaded": overload.answered})

    return [
        Route("/v1/_limits", get_limits, methods=["GET"]),
        Route("/v1/_limits", set_limits, methods=["POST"]),
        Route("/v1/_overload", start_overload, methods=["POST"]),
    ]


async def _object(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        raise invalid(f"expected a JSON object: {exc}") from None
    if not isinstance(body, dict):
        raise invalid("expected a JSON object")
    return body


def _limits(body: dict[str, Any]) -> dict[str, float | None]:
    unknown = sorted(set(body) - set(KINDS) - {"burst_s"})
    if unknown:
        raise invalid(f"unknown limit {unknown[0]!r}; expected {', '.join(KINDS)} or burst_s")
    burst = body.get("burst_s")
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int | float) or not 0 < burst <= 60):
        raise invalid(f"burst_s: expected seconds over which the limits are enforced (0-60] or null, got {burst!r}")
    for name, value in body.items():
        if name == "burst_s":
            continue
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise invalid(f"{name}: expected a positive whole number per minute or null, got {value!r}")
    return body
