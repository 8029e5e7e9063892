"""A deliberately broken executor: the fleet's own, with both of its checks against running a batch again removed
(the in-memory memory of batches handled, `SeenIds`, and the turn fence's claim, `Fence.claim_batch`), so a batch
delivered again runs its calls again. The shop answers such a run from its idempotency record and changes nothing,
which is why the chaos audit counts runs (the shop's execution log), not stored answers.

It exists for one test, `test_chaos.py::test_a_broken_executor_that_runs_batches_again_fails_the_audit`, which runs
it in place of the fleet's executors (`ChaosFleet.replaced`) and shows the audit flag it. Nothing imports it: it
is started as a file, `python tests/chaos/broken_executor.py`, with the fleet's environment.
"""

from __future__ import annotations

import sys

from roundtrip._kernel.kafka.dedupe import SeenIds
from roundtrip._kernel.storage.turnstore import Fence


async def _always_claimed(self: Fence, *args: object, **kwargs: object) -> bool:
    return True


def _never_seen(self: SeenIds, key: str) -> bool:
    return False


def main() -> None:
    Fence.claim_batch = _always_claimed  # type: ignore[method-assign]
    SeenIds.__contains__ = _never_seen  # type: ignore[method-assign]
    from roundtrip._cli.main import main as roundtrip

    sys.argv = ["roundtrip", "run", "executor"]
    roundtrip()


if __name__ == "__main__":
    main()
