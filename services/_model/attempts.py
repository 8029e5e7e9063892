"""One model call, tried until the API answers it, the turn's deadline comes, or an error says trying again is useless.

A capacity refusal (a 429 with retry-after, a 529, a platform's bare throttle) is "later", never "fail": the call
waits for the limiter inside the turn's deadline, the turn marked waiting in the ledger. A transient error is tried
again `retries` times with backoff; anything else (a spend limit's bare 429 on the Anthropic API) is the error at once.
With `wait_for_capacity` off a capacity refusal is the error too (a plain loop). See docs/decisions/model-capacity.md.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anthropic

from roundtrip._model.capacity import Busy, Capacity

log = logging.getLogger("roundtrip.model")
MARGIN_S = 2.0  # give up this long before the turn's deadline
MARK_AFTER_S = 1.0  # a wait for capacity longer than this marks the turn waiting in the ledger
BACKOFF_S, MAX_BACKOFF_S = 0.5, 8.0  # transient errors: the first pause, doubled per retry up to this
OVERLOADED_PAUSE_S = 1.0

Mark = Callable[[], Awaitable[bool]]  # marks the turn waiting for capacity; False when the turn may not act any more


@dataclass
class Tried:
    """How the call ended: the message and its headers, or an error (`busy`: refused until the deadline)."""

    message: Any = None
    headers: Mapping[str, str] | None = None
    error: str | None = None
    busy: bool = False
    gone: bool = False  # the turn ended while its call waited: nothing to answer
    waited_s: float = 0.0
    refusals: int = 0
    attempts: int = 0


def retry_after(exc: anthropic.APIStatusError) -> float | None:
    """Seconds the answer asks to wait (`retry-after-ms`, else `retry-after`); None when it does not say."""
    headers = exc.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return max(0.0, float(headers[name]) * scale)
        except (KeyError, TypeError, ValueError):
            continue
    return None


def describe(exc: anthropic.APIError) -> str:
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__}{f' ({status})' if status else ''}: {exc.message if hasattr(exc, 'message') else exc}"


STREAM_ERRORS = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500}


def _status(exc: anthropic.APIError) -> int | None:
    """The HTTP status of a refusal; for an `error` event in a 200's stream, the status its error type stands for."""
    status: int | None = getattr(exc, "status_code", None)
    if status == 200 and isinstance(body := getattr(exc, "body", None), dict):
        return STREAM_ERRORS.get(str((body.get("error") or {}).get("type")), status)
    return status


def _capacity_wait(exc: anthropic.APIError, bare_429_throttles: bool) -> tuple[bool, float | None]:
    status = _status(exc)
    after = retry_after(exc) if isinstance(exc, anthropic.APIStatusError) else None
    if status == 429:
        # no retry-after: a spend limit on the Anthropic API, the platform's throttle where no header tells the rate
        return after is not None or bare_429_throttles, after
    if status == 529:
        return True, after or OVERLOADED_PAUSE_S
    return False, None


def _transient(exc: anthropic.APIError) -> bool:
    status = _status(exc)
    return (
        isinstance(exc, anthropic.APIConnectionError) or status in (408, 409) or (status is not None and status >= 500)
    )


async def _paused_in_place(
    pause: float, capacity: Capacity, give_up: float, on_wait: Mark, marked: bool
) -> bool | None:
    try:
        kept = await _paused(pause, give_up, on_wait, marked)
    except BaseException:
        capacity.ended()
        raise
    if not kept:
        capacity.ended()
    return kept


async def _slot(capacity: Capacity, give_up: float, out: Tried, last: str) -> float:
    """Seconds waited for the call's place, or -1 (`out` says busy) when none comes before the deadline."""
    try:
        return await capacity.acquire(give_up)
    except Busy as exc:
        out.error, out.busy = f"rate limited until the turn's deadline ({last}): {exc}", True
        return -1.0


def _ended_paused(out: Tried, kept: bool | None, last: str) -> Tried:
    if kept is None:
        out.error, out.busy = f"rate limited until the turn's deadline ({last})", True
    else:
        out.gone = True
    return out


async def _backed_off(exc: anthropic.APIError, tried: int, give_up: float) -> bool:
    """Pause before the `tried`-th retry, unless it would pass the deadline; True to try again."""
    pause = min(MAX_BACKOFF_S, BACKOFF_S * 2**tried) * random.uniform(0.75, 1.0)
    log.info("model call tried again in %.1f s after %s", pause, describe(exc))
    if time.monotonic() + pause < give_up:
        await asyncio.sleep(pause)
        return True
    return False


async def attempt(
    call: Callable[[int], Awaitable[tuple[Any, Mapping[str, str]]]],
    capacity: Capacity,
    deadline_at: float,
    retries: int,
    on_wait: Mark,
    wait_for_capacity: bool = True,
) -> Tried:
    """Run `call(attempt_number)` through the limiter; `deadline_at` is the Unix time the turn may act until."""
    out, marked, transient, last = Tried(), False, 0, "waiting for its slot"
    in_a_row = 0
    kept: bool | None = False
    give_up = time.monotonic() + (deadline_at - MARGIN_S - time.time())
    while True:
        if not marked and (out.refusals or capacity.delay() > MARK_AFTER_S):
            marked = True
            if not await on_wait():
                out.gone = True
                return out
        if kept and capacity.delay() > 0:  # a retry-after came during the pause: the call waits for the hold as all do
            capacity.ended()
            kept = False
        if kept:
            waited, kept = 0.0, False
        elif (waited := await _slot(capacity, give_up, out, last)) < 0:
            return out
        out.waited_s += waited
        started, out.attempts = time.monotonic(), out.attempts + 1
        try:
            out.message, out.headers = await call(out.attempts - 1)
        except anthropic.APIError as exc:
            about_capacity, after = _capacity_wait(exc, capacity.signals.bare_429_throttles)
            if wait_for_capacity and about_capacity:
                out.refusals, last, in_a_row = out.refusals + 1, describe(exc), in_a_row + 1
                # the window shrinks before this call's place is given on (or kept through its pause)
                pause = capacity.refused(after, started, in_a_row, overloaded=_status(exc) == 529)
                if pause > 0:
                    kept = await _paused_in_place(pause, capacity, give_up, on_wait, marked)
                    if kept:
                        marked = True
                        continue
                    return _ended_paused(out, kept, last)
                capacity.ended()
                continue
            in_a_row = 0
            capacity.ended()
            if _transient(exc) and transient < retries:
                transient += 1
                if await _backed_off(exc, transient - 1, give_up):
                    continue
            out.error = describe(exc)
            return out
        except BaseException:
            capacity.ended()
            raise
        capacity.answered(out.headers, started_at=started, waited=waited > 0, **_counted(out.message))
        capacity.ended()  # after the answer grew the window
        return out


async def _paused(pause: float, give_up: float, on_wait: Mark, marked: bool) -> bool | None:
    """A throttled call's pause in its kept place (handing it on would meet the same empty bucket): True to try again,
    False when its turn ended meanwhile, None when the pause would pass the deadline."""
    if time.monotonic() + pause > give_up:
        return None
    if not marked and not await on_wait():
        return False
    await asyncio.sleep(pause)
    return True


def _counted(message: Any) -> dict[str, int]:
    """The tokens a call counts against the limits: cache reads do not count."""
    usage = message.usage
    return {
        "input_tokens": (usage.input_tokens or 0) + (usage.cache_creation_input_tokens or 0),
        "output_tokens": usage.output_tokens or 0,
    }
