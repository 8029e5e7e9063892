"""The HTTP side of the simulator: routes, persona choice, latency and faults.

Rate limits and 529 bursts apply to /v1/messages, whose every response carries the anthropic-ratelimit-* headers of
the limits set. A caller steers a request with x-roundtrip-* headers (persona, fault, latency); the routes and headers
are listed in docs/decisions/simulator.md.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from roundtrip._kernel.clock import SYSTEM

from . import controls, personas, platforms, streaming
from .batches import Batches
from .engine import respond
from .errors import ApiError, authenticate, error_response, header_number, invalid, new_request_id
from .overload import Overload
from .platforms import Platform
from .ratelimits import RateLimits
from .scripted import Scripts
from .usage import PromptCache, estimate_tokens, prompt_of
from .validation import validate_count_tokens, validate_create

VERTEX_MODELS = "/v1/projects/{project}/locations/{region}/publishers/anthropic/models"
PERSONA_HEADER = "x-roundtrip-persona"
FAULT_HEADER = "x-roundtrip-fault"
FAULT_ATTEMPTS_HEADER = "x-roundtrip-fault-attempts"
FAULT_DELAY_HEADER = "x-roundtrip-fault-delay"
LATENCY_HEADER = "x-roundtrip-latency-ms"
RETRY_AFTER_HEADER = "x-roundtrip-retry-after-ms"

FAULTS: dict[str, tuple[int, str]] = {
    "429": (429, "Number of request tokens has exceeded your per-minute rate limit (simulated fault)."),
    "500": (500, "Internal server error (simulated fault)."),
    "502": (502, "Bad gateway (simulated fault)."),
    "503": (503, "Service unavailable (simulated fault)."),
    "504": (504, "Gateway timeout (simulated fault)."),
    "529": (529, "Overloaded (simulated fault)."),
}
DEFAULT_TIMEOUT_FAULT_S = 30.0


@dataclass
class _State:
    """The simulator's one state (its counters, its prompt cache, its seeded RNG) and its routes."""

    default_persona: str
    latency_ms: float
    fault_rate: float
    retry_after_ms: float
    rng: random.Random
    limits: RateLimits
    overload: Overload
    cache: PromptCache = field(default_factory=lambda: PromptCache(SYSTEM))
    served: int = 0
    streamed: int = 0
    parallel_disabled: int = 0  # requests that sent tool_choice.disable_parallel_tool_use: true
    by_platform: dict[str, int] = field(default_factory=dict)
    latency_jitter: float = 0.0
    scripts: Scripts = field(default_factory=Scripts)

    async def messages(self, request: Request) -> Response:
        response = await self._message(request)
        response.headers.update(self.limits.headers())
        return response

    def on(self, platform: Platform) -> Callable[[Request], Awaitable[Response]]:
        """The Messages API in `platform`'s shape (platforms.py): no anthropic-ratelimit-* header on any answer."""

        async def messages(request: Request) -> Response:
            return await self._message(request, platform)

        return messages

    async def _message(self, request: Request, platform: Platform | None = None) -> Response:
        request_id = new_request_id()
        try:
            platform.authenticate(request) if platform else authenticate(request)
            body = await _json_body(request)
            if platform:
                body = platform.body(request, body)
            validate_create(body)
            wanted = request.headers.get(PERSONA_HEADER, "").strip()
            scripted = self.scripts.reply_for(wanted, body)
            persona = wanted if scripted else _persona(wanted, body, self)
            self.scripts.record(persona, body)
            self.overload.check()
            streamed = bool(body.get("stream"))
            with self.limits.admit(body, self.cache) as call:
                latency_s = _latency_s(request, self)
                if not streamed:  # a stream spends its latency as it goes
                    await asyncio.sleep(latency_s)
                fault = await _fault(request, self, streamed)
                message = respond(body, persona, self.cache, scripted)
                call.produced(message["usage"]["output_tokens"])
        except ApiError as error:
            return (platform.error if platform else error_response)(error, request_id)
        self.served += 1
        if platform:
            self.by_platform[platform.name] = self.by_platform.get(platform.name, 0) + 1
        self.parallel_disabled += bool((body.get("tool_choice") or {}).get("disable_parallel_tool_use"))
        headers = {"request-id": request_id, "x-roundtrip-persona": persona}
        if streamed:
            self.streamed += 1
            if platform and platform.event_stream:
                events = streaming.body(message, latency_s, fault, request_id, frame=platforms.event_frame)
                return StreamingResponse(events, media_type="application/vnd.amazon.eventstream", headers=headers)
            events = streaming.body(message, latency_s, fault, request_id)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        return JSONResponse(message, headers=headers)

    def answer(self, wanted: str, body: dict[str, Any]) -> dict[str, Any]:
        """The message one request of a batch gets: as a plain call's, without its latency, limits or faults."""
        validate_create(body)
        if body.get("stream"):
            raise invalid("stream: a batch's requests cannot be streamed")
        scripted = self.scripts.reply_for(wanted, body)
        persona = wanted if scripted else _persona(wanted, body, self)
        self.scripts.record(persona, body)
        self.served += 1
        return respond(body, persona, self.cache, scripted)

    async def count_tokens(self, request: Request) -> Response:
        request_id = new_request_id()
        try:
            authenticate(request)
            body = await _json_body(request)
            validate_count_tokens(body)
        except ApiError as error:
            return error_response(error, request_id)
        return JSONResponse({"input_tokens": estimate_tokens(prompt_of(body))}, headers={"request-id": request_id})

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "default_persona": self.default_persona,
                "personas": list(personas.NAMES),
                "served": self.served,
                "streamed": self.streamed,
                "parallel_disabled": self.parallel_disabled,
                "platforms": self.by_platform,
                "rate_limited": self.limits.refused,
                "in_flight": self.limits.in_flight,
                "overloaded": self.overload.answered,
            }
        )


def create_app(
    default_persona: str = "careful",
    latency_ms: float = 0.0,
    fault_rate: float = 0.0,
    seed: int = 0,
    retry_after_ms: float = 20.0,
    latency_jitter: float = 0.0,
    limits: RateLimits | None = None,
    overload: Overload | None = None,
    scripts: Scripts | None = None,
    batch_delay_ms: float = 0.0,
) -> Starlette:
    """The simulator as an ASGI app. fault_rate: share of requests answered 529 (seeded RNG);
    limits / overload: its rate limits and 529 bursts (default: none); batch_delay_ms: how long a Message Batch
    stays in progress."""
    if default_persona not in personas.NAMES:
        raise ValueError(f"unknown persona {default_persona!r}; expected one of {', '.join(personas.NAMES)}")
    if not 0.0 <= fault_rate <= 1.0:
        raise ValueError("fault_rate must be between 0 and 1")
    if not 0.0 <= latency_jitter <= 1.0:
        raise ValueError("latency_jitter must be between 0 and 1")
    state = _State(
        default_persona,
        latency_ms,
        fault_rate,
        retry_after_ms,
        random.Random(seed),
        latency_jitter=latency_jitter,
        limits=limits or RateLimits(SYSTEM),
        overload=overload or Overload(SYSTEM),
        scripts=scripts or Scripts(),
    )
    batches = Batches(state.answer, batch_delay_ms)
    return Starlette(
        routes=[
            *batches.routes(),
            Route("/v1/messages", state.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", state.count_tokens, methods=["POST"]),
            Route("/model/{model:path}/invoke", state.on(platforms.BEDROCK), methods=["POST"]),
            Route("/model/{model:path}/invoke-with-response-stream", state.on(platforms.BEDROCK), methods=["POST"]),
            Route(f"{VERTEX_MODELS}/{{model}}:rawPredict", state.on(platforms.VERTEX), methods=["POST"]),
            Route(f"{VERTEX_MODELS}/{{model}}:streamRawPredict", state.on(platforms.VERTEX), methods=["POST"]),
            Route("/anthropic/v1/messages", state.on(platforms.FOUNDRY), methods=["POST"]),
            Route("/health", state.health, methods=["GET"]),
            *controls.routes(state.limits, state.overload),
            Route("/v1/_scripts/{name}", state.scripts.put, methods=["PUT"]),
            Route("/v1/_scripts", state.scripts.names, methods=["GET"]),
            Route("/v1/_received", state.scripts.list_received, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = "Not found" if status == 404 else str(getattr(exc, "detail", "")) or "error"
    return error_response(ApiError(status, message), new_request_id())


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        return cast("dict[str, Any]", json.loads(raw))
    except ValueError as exc:
        raise invalid(f"There was an error parsing the body of your request: {exc}") from None


def _persona(wanted: str, body: dict[str, Any], state: _State) -> str:
    wanted = (wanted or state.default_persona).strip().lower()
    first = body["messages"][0]["content"]
    first_text = (
        first if isinstance(first, str) else "\n".join(b.get("text", "") for b in first if b.get("type") == "text")
    )
    try:
        return personas.resolve(wanted, first_text)
    except KeyError:
        raise invalid(
            f"{PERSONA_HEADER}: unknown simulator persona {wanted!r}; expected one of {', '.join(personas.NAMES)}"
        ) from None


def _latency_s(request: Request, state: _State) -> float:
    latency = header_number(request, LATENCY_HEADER, state.latency_ms)
    if latency > 0 and state.latency_jitter:
        latency *= state.rng.uniform(1 - state.latency_jitter, 1 + state.latency_jitter)
    return max(0.0, latency / 1000)


async def _fault(request: Request, state: _State, streamed: bool) -> str:
    """Raise the forced (or randomly injected) fault of this request, or sleep for `timeout`; the fault a stream
    raises as it goes (`529-midstream`) is returned."""
    fault = request.headers.get(FAULT_HEADER, "").strip().lower()
    if fault:
        attempt = header_number(request, "x-stainless-retry-count", 0)  # 0 on the first try, 1 on the first retry...
        if attempt >= header_number(request, FAULT_ATTEMPTS_HEADER, math.inf):
            fault = ""
    elif state.fault_rate and state.rng.random() < state.fault_rate:
        fault = "529"
    if not fault:
        return ""
    if fault == "timeout":
        await _sleep_unless_disconnected(request, header_number(request, FAULT_DELAY_HEADER, DEFAULT_TIMEOUT_FAULT_S))
        return ""
    if fault == streaming.MIDSTREAM_FAULT:
        if streamed:
            return fault
        fault = "529"
    if fault not in FAULTS:
        known = ", ".join([*FAULTS, "timeout", streaming.MIDSTREAM_FAULT])
        raise invalid(f"{FAULT_HEADER}: unknown fault {fault!r}; expected one of {known}")
    status, message = FAULTS[fault]
    retry_after_ms = header_number(request, RETRY_AFTER_HEADER, state.retry_after_ms)
    headers = {"retry-after-ms": f"{retry_after_ms:g}", "retry-after": str(max(1, math.ceil(retry_after_ms / 1000)))}
    raise ApiError(status, message, headers=headers)


async def _sleep_unless_disconnected(request: Request, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(0.1, remaining))
        if await request.is_disconnected():
            return
