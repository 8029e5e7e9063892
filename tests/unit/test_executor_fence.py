"""The executor's core against the real turn fence on a SQLite ledger: a batch the fence refuses runs nothing, a batch
delivered again once its step has gone on runs nothing the second time, and a batch retried because what follows its
calls failed (the database away, the broker refusing the next command) hands their results on without running them
again. The chaos suite shows the same
under load (tests/chaos); this is the fast, exact version."""

from __future__ import annotations

import time

import pytest

from roundtrip._executor.core import ExecutorCore
from roundtrip._guard.ledger import Ledger
from roundtrip._kernel.storage.turnstore import Fence, TurnRefused
from roundtrip._kernel.wire.events import CallModel, CheckedCall, ExecuteToolBatch, Turn
from tests.agents import SHOP, shop_deps, shop_registry, tool_runner
from tests.databases import migrated
from tests.ledger_steps import advance
from tests.signing import pair

KEYS = pair("k1")
TURN = Turn(
    turn_id="turn_f",
    request_id="req_f",
    conversation_id="conv_f",
    customer_id="cus_1001",
    trace_id="0" * 32,
    deadline_at=9e9,  # the turn's deadline far off: only the fence's other conditions refuse
)
MESSAGES = [
    {"role": "user", "content": "cancel my order"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_c", "name": "cancel_order", "input": {}}]},
]


class Counting:
    """The shop's tools, each run counted: what a backend's execution log would show."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def registry(self):
        def handler(name: str):
            async def run(args, ctx):
                self.runs.append(ctx.idempotency_key)
                return {"tool": name}

            return run

        return shop_registry(handlers={name: handler(name) for name in SHOP.registry.names})


@pytest.fixture
async def ledger_and_fence(tmp_path):
    """A turn recorded at step 1 (its model asked for a tool), and the fence the executor claims on."""
    url = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    ledger, fence = await Ledger.open(url), await Fence.open(url)
    assert await ledger.start(TURN.model_dump(), pending="")
    assert await advance(ledger, TURN, 1, {}, 0.0, pending="", now=time.time())
    yield ledger, fence
    await fence.close()
    await ledger.close()


def batch(turn: Turn = TURN, step: int = 1) -> ExecuteToolBatch:
    call = CheckedCall(id="toolu_c", name="cancel_order", input={}, approved=True)
    return KEYS.signer.sign(ExecuteToolBatch(turn=turn, step=step, messages=MESSAGES, calls=[call]))


def core(counting: Counting, fence) -> ExecutorCore:
    runner = tool_runner(counting.registry(), shop_deps(None))
    return ExecutorCore(runner, KEYS.verifier, fence, max_transcript_bytes=4_000_000)


async def kept(command) -> None:
    """The publisher of these tests: the command is what `handle` returns."""


async def run(counting: Counting, fence: Fence, signed: ExecuteToolBatch):
    return await core(counting, fence).handle(signed, kept)


class AwayOnce:
    """The fence whose database is away the first time the batch's side effects are recorded."""

    def __init__(self, fence: Fence) -> None:
        self.fence, self.failed = fence, False

    async def claim_batch(self, *args):
        return await self.fence.claim_batch(*args)

    async def record_acted(self, *args):
        if not self.failed:
            self.failed = True
            raise ConnectionRefusedError("the ledger's database is away")
        await self.fence.record_acted(*args)


async def test_a_batch_runs_once_under_the_fences_claim(ledger_and_fence):
    _, fence = ledger_and_fence
    counting = Counting()
    command = await run(counting, fence, batch())
    assert isinstance(command, CallModel) and command.step == 1
    assert counting.runs == ["turn_f:toolu_c"]


@pytest.mark.parametrize("why", ["ended", "moved on", "behind"])
async def test_a_batch_the_fence_refuses_runs_nothing(ledger_and_fence, why):
    ledger, fence = ledger_and_fence
    step = 1
    if why == "ended":
        assert await ledger.end(TURN.turn_id, "cancelled", "cancelled by an operator")
    elif why == "moved on":
        assert await advance(ledger, TURN, 2, {}, 0.0, pending="", now=time.time())
    else:
        step = 2  # a batch of a step the turn has not reached
    counting = Counting()
    assert await run(counting, fence, batch(step=step)) is None
    assert counting.runs == []


async def test_a_batch_naming_another_customer_is_refused_and_runs_nothing(ledger_and_fence):
    _, fence = ledger_and_fence
    counting = Counting()
    with pytest.raises(TurnRefused):
        await run(counting, fence, batch(TURN.model_copy(update={"customer_id": "cus_other"})))
    assert counting.runs == []


async def test_a_batch_delivered_again_after_its_step_went_on_runs_once(ledger_and_fence):
    """The same signed batch twice: the first runs its call; by the copy's delivery the model has taken the step's
    call and the guard recorded the next iteration, so the fence refuses it and the call has run once."""
    ledger, fence = ledger_and_fence
    counting = Counting()
    signed = batch()
    await run(counting, fence, signed)
    assert await fence.claim_model_call(TURN, 1, now=time.time())
    assert await advance(ledger, TURN, 2, {}, 0.0, pending="", now=time.time())
    assert await run(counting, fence, signed) is None  # a new executor: no memory of the first, the fence refuses
    assert counting.runs == ["turn_f:toolu_c"]


async def test_a_batch_retried_after_its_side_effects_could_not_be_recorded_runs_its_calls_once(ledger_and_fence):
    ledger, fence = ledger_and_fence
    counting = Counting()
    executor = core(counting, AwayOnce(fence))
    with pytest.raises(ConnectionRefusedError):
        await executor.handle(batch(), kept)  # the call ran; recording it failed, so the message is retried
    command = await executor.handle(batch(), kept)
    assert isinstance(command, CallModel) and command.step == 1
    assert counting.runs == ["turn_f:toolu_c"]  # ran once, its result handed on by the retry
    assert "cancel_order" in (await ledger.get(TURN.turn_id)).acted  # and recorded, by the retry


async def test_a_batch_whose_next_command_could_not_be_published_is_retried_without_running_again(ledger_and_fence):
    """The broker refuses the next model call once: the batch is not taken as seen (its retry would otherwise be
    dropped as a duplicate and the turn wait for its deadline); the retry publishes the same command; one run."""
    _, fence = ledger_and_fence
    counting = Counting()
    executor = core(counting, fence)
    published: list[CallModel] = []
    refusals = [ConnectionError("the broker is away")]

    async def refused_once(command) -> None:
        if refusals:
            raise refusals.pop()
        published.append(command)

    with pytest.raises(ConnectionError):
        await executor.handle(batch(), refused_once)
    command = await executor.handle(batch(), refused_once)
    assert isinstance(command, CallModel) and published == [command]
    assert counting.runs == ["turn_f:toolu_c"]
    assert await executor.handle(batch(), refused_once) is None  # now a duplicate: dropped, nothing published
    assert published == [command] and counting.runs == ["turn_f:toolu_c"]
