"""A consumer's view of its dependencies' outages: when one began, said once, counted, shown. The fleet's own
dependency pauses the whole consumer (and fails /readyz: nothing else could go through); an agent's backend holds
only the record's key (docs/faults.md, "What an outage holds").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from roundtrip._kernel.kafka.faults import RetryLater
from roundtrip._kernel.observability import metrics

log = logging.getLogger("roundtrip.consumer")

RETRY_FIRST_S, RETRY_MAX_S = 0.25, 5.0
_KEY_ONLY = "\x00key"  # no dependency's name can be it


def _waits_for(failed: RetryLater, key: Hashable) -> str:
    return _KEY_ONLY if failed.backend and key is not None else failed.dependency


def next_try(delay: float, until: float | None) -> float:
    """The backoff, cut short at `until` (epoch seconds) while that is still ahead."""
    if until is not None:
        left = until - time.time()
        if 0 < left < delay:
            return left + 0.01  # just past it: the handler sees the deadline gone
    return delay


class Outages:
    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self._since: dict[str, float] = {}
        self._retrying: dict[str, int] = {}
        self._held: set[Hashable] = set()

    @property
    def waiting(self) -> tuple[str, ...]:
        return tuple(self._since)

    def __bool__(self) -> bool:
        return bool(self._since)

    @property
    def held_keys(self) -> int:
        return len(self._held)

    async def retry(
        self,
        attempt: Callable[[], Awaitable[None]],
        failed: RetryLater,
        given_up: Callable[[], bool],
        rescue: Callable[[BaseException], Awaitable[bool]],
        key: Hashable,
        label: str,
    ) -> bool:
        """Try `attempt` again until it goes through (True), `given_up()` (False), or fails for what the message is
        (`rescue(exc)`'s answer). A try that fails the other way moves the record from one wait to the other."""
        delay, answered = RETRY_FIRST_S, False
        waiting = self._begin(failed, key, label)
        try:
            while not given_up():
                await asyncio.sleep(next_try(delay, failed.until))
                if given_up():
                    break
                delay = min(delay * 2, RETRY_MAX_S)
                try:
                    await attempt()
                except asyncio.CancelledError:
                    raise
                except RetryLater as exc:
                    if _waits_for(exc, key) == waiting == _KEY_ONLY:
                        metrics.retried_messages.labels(self.consumer, exc.dependency).inc()
                    elif _waits_for(exc, key) == waiting:
                        self.failed(waiting, exc.reason)
                    else:
                        self._end(waiting, key, answered=False)
                        waiting = self._begin(exc, key, label)
                    failed = exc
                    continue
                except BaseException as exc:  # noqa: BLE001 - the dependency answered; the message itself failed
                    answered = True
                    return await rescue(exc)
                answered = True
                return True
            return False
        finally:
            self._end(waiting, key, answered)

    def _begin(self, failed: RetryLater, key: Hashable, label: str) -> str:
        waiting = _waits_for(failed, key)
        if waiting != _KEY_ONLY:
            self.waits(waiting, failed.reason)
            return waiting
        metrics.retried_messages.labels(self.consumer, failed.dependency).inc()
        if key not in self._held:
            self._held.add(key)
            metrics.held_keys.labels(self.consumer).set(len(self._held))
            log.warning(
                "%s: key %s held: a backend (%s) is unavailable (%s); its records are retried, the other keys go on",
                self.consumer,
                label or "?",
                failed.dependency,
                failed.reason[:300],
            )
        return _KEY_ONLY

    def _end(self, waiting: str, key: Hashable, answered: bool) -> None:
        if waiting != _KEY_ONLY:
            self.stops_waiting(waiting, answered)
            return
        if key in self._held:
            self._held.discard(key)
            metrics.held_keys.labels(self.consumer).set(len(self._held))

    def waits(self, dependency: str, reason: str) -> None:
        self._retrying[dependency] = self._retrying.get(dependency, 0) + 1
        self.failed(dependency, reason)

    def failed(self, dependency: str, reason: str) -> None:
        metrics.retried_messages.labels(self.consumer, dependency).inc()
        if dependency in self._since:
            return
        self._since[dependency] = time.monotonic()
        metrics.dependency_unavailable.labels(self.consumer, dependency).set(1)
        log.warning(
            "%s: the %s is unavailable (%s); paused fetching, its messages are retried until it answers",
            self.consumer,
            dependency,
            reason[:300],
        )

    def stops_waiting(self, dependency: str, answered: bool) -> None:
        """A waiting record went through (`answered`: the outage is over) or was given up: when the last one is,
        the consumer stops waiting and the next record finds out afresh."""
        left = self._retrying.get(dependency, 1) - 1
        if left > 0:
            self._retrying[dependency] = left
        else:
            self._retrying.pop(dependency, None)
        since = self._since.get(dependency)
        if since is None or (not answered and left > 0):
            return
        del self._since[dependency]
        metrics.dependency_unavailable.labels(self.consumer, dependency).set(0)
        if answered:
            log.warning(
                "%s: the %s answers again after %.1f s; resumed fetching",
                self.consumer,
                dependency,
                time.monotonic() - since,
            )


async def rescue_until_done(
    consumer: str,
    rescue: Callable[[Any, BaseException], Awaitable[None]] | None,
    record: Any,
    failure: BaseException,
    given_up: Callable[[], bool],
) -> bool:
    """Dead-letter a record whose processing failed past its own dead-letter path: `rescue` until it succeeds (True)
    or `given_up()` (False), while its key waits."""
    delay = 0.25
    while True:
        try:
            if rescue is None:
                raise failure
            await rescue(record, failure)
            return True
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001
            log.error(
                "%s: %s[%d]@%d could not be handled nor dead-lettered (%s: %s); retrying in %.1f s",
                consumer,
                record.topic,
                record.partition,
                record.offset,
                type(exc).__name__,
                shortened(exc),
                delay,
            )
            if given_up():
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)


SHORTENED = 300  # characters of an error a log line keeps


def shortened(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - even str() of an exception can fail
        text = "<unprintable>"
    return text if len(text) <= SHORTENED else text[:SHORTENED] + "…"
