"""One model call, tried until the API answers it, the turn's deadline comes, or an error says trying again is useless.

How each refusal is taken (the SDK retries nothing: services/_model/client.py):
* **Capacity** (a 429 with `retry-after`, any 529): "later", never "fail". The process's limiter
  (services/_model/capacity.py) hears it, holds every call of the process, and this one waits again for
  its slot, for as long as the turn's deadline allows (less MARGIN_S, so the turn ends with its own
  answer rather than the sweeper's). The turn is marked waiting in the ledger (`on_wait`), where the
  stuck rule leaves it alone and `roundtrip turns` shows it. Past the deadline the call is `busy`.
* **Transient** (a timeout, a lost connection, 408, 409, another 5xx): tried again up to `retries` times
  (ROUNDTRIP_MODEL_MAX_RETRIES), after an exponential pause with jitter.
* **Anything else** (400, 401, 403, 404, 413, a 429 with no `retry-after`, which is how a spend limit answers):
  the error, at once.
With `wait_for_capacity` off, a capacity refusal is the error too, at once: a plain loop that leaves the retries
to the SDK (the rate-limit benchmark's, tests/benchmarks/inprocess.py).
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
OVERLOADED_PAUSE_S = 1.0  # a 529 without retry-after holds this long

Mark = Callable[[], Awaitable[bool]]  # marks the turn waiting for capacity; False when the turn may not act any more


@dataclass
class Tried:
    """How the call ended: the message and its headers, or an error (`busy`: for capacity, until the deadline)."""

    message: Any = None
    headers: Mapping[str, str] | None = None
    error: str | None = None
    busy: bool = False
    gone: bool = False  # the turn ended while its call waited: nothing to answer
    waited_s: float = 0.0  # for capacity (the limiter's slots and holds)
    refusals: int = 0  # 429s and 529s
    attempts: int = 0


def retry_after(exc: anthropic.APIStatusError) -> float | None:
    """Seconds the answer asks to wait (`retry-after-ms`, else `retry-after` in seconds); None when it does not say."""
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


STREAM_ERRORS = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500}  # an error event's status


def _status(exc: anthropic.APIError) -> int | None:
    """The HTTP status of a refusal; for an `error` event in a stream (its response was a 200), the status its error
    type stands for (an overloaded_error mid-stream is a 529)."""
    status = getattr(exc, "status_code", None)
    if status == 200 and isinstance(body := getattr(exc, "body", None), dict):
        return STREAM_ERRORS.get(str((body.get("error") or {}).get("type")), status)
    return status


def _capacity_wait(exc: anthropic.APIError) -> float | None:
    """The pause a capacity refusal asks for; None when `exc` is not about capacity."""
    status = _status(exc)
    after = retry_after(exc) if isinstance(exc, anthropic.APIStatusError) else None
    if status == 429:
        return after  # no retry-after: a spend limit, not a rate
    if status == 529:
        return after or OVERLOADED_PAUSE_S
    return None


def _transient(exc: anthropic.APIError) -> bool:
    status = _status(exc)
    return (
        isinstance(exc, anthropic.APIConnectionError) or status in (408, 409) or (status is not None and status >= 500)
    )


async def attempt(
    call: Callable[[int], Awaitable[tuple[Any, Mapping[str, str]]]],
    capacity: Capacity,
    deadline_at: float,
    retries: int,
    on_wait: Mark,
    wait_for_capacity: bool = True,
) -> Tried:
    """Run `call(attempt_number)` through the limiter until it is answered (see the module's docstring).
    `deadline_at`: Unix time the turn may act until."""
    out, marked, transient, last = Tried(), False, 0, "waiting for its slot"
    give_up = time.monotonic() + (deadline_at - MARGIN_S - time.time())
    while True:
        if not marked and (out.refusals or capacity.delay() > MARK_AFTER_S):
            marked = True
            if not await on_wait():
                out.gone = True
                return out
        try:
            waited = await capacity.acquire(give_up)
        except Busy as exc:
            out.error, out.busy = f"rate limited until the turn's deadline ({last}): {exc}", True
            return out
        out.waited_s += waited
        started, out.attempts = time.monotonic(), out.attempts + 1
        try:
            out.message, out.headers = await call(out.attempts - 1)
        except anthropic.APIError as exc:
            if wait_for_capacity and (pause := _capacity_wait(exc)) is not None:
                out.refusals, last = out.refusals + 1, describe(exc)
                capacity.refused(pause, started)  # the window shrinks before this call's place is given on
                capacity.ended()
                continue
            capacity.ended()
            if _transient(exc) and transient < retries:
                pause = min(MAX_BACKOFF_S, BACKOFF_S * 2**transient) * random.uniform(0.75, 1.0)
                transient += 1
                log.info("model call tried again in %.1f s after %s", pause, describe(exc))
                if time.monotonic() + pause < give_up:
                    await asyncio.sleep(pause)
                    continue
            out.error = describe(exc)
            return out
        except BaseException:
            capacity.ended()
            raise
        capacity.answered(out.headers, started_at=started, waited=waited > 0, **_counted(out.message))
        capacity.ended()  # after the answer grew the window
        return out


def _counted(message: Any) -> dict[str, int]:
    """The tokens a call counts against the limits: input and cache writes (cache reads do not count), and output."""
    usage = message.usage
    return {
        "input_tokens": (usage.input_tokens or 0) + (usage.cache_creation_input_tokens or 0),
        "output_tokens": usage.output_tokens or 0,
    }
