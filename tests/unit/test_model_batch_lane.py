"""The model service's batch lane (services/_model/batches.py) with a fake Message Batches API and a clock the test
moves, on the real batch calls' table (SQLite): gathering by count and age, polling with backoff, answers published
from the stored calls only, retries, a create refused, and a takeover that never submits a call twice."""

from __future__ import annotations

import time
from types import SimpleNamespace

import anthropic
import httpx
import pytest
from sqlalchemy import insert

from roundtrip._kernel.settings import Settings
from roundtrip._kernel.storage.turnstore import ENDED, TurnStore, turns
from roundtrip._kernel.wire.events import CallModel, ModelResponded, Turn, Usage
from roundtrip._model.batch_api import Listed, Result
from roundtrip._model.batch_store import BatchCalls
from roundtrip._model.batches import CUSTOM_ID, BatchLane, BatchPorts, custom_id_of, lane_of
from roundtrip.testing._ports import OpenFence
from tests.databases import migrated

REQUEST = httpx.Request("POST", "https://api.anthropic.com/v1/messages/batches")
START = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Model:
    model = "claude-test"

    def request(self, messages, options):
        return {"model": self.model, "max_tokens": 100, "messages": messages}

    def persona_headers(self, persona):
        return {"x-roundtrip-persona": persona} if persona else {}


class Api:
    """The Message Batches API as the lane sees it: batches created, ended on the test's word, results set by it."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.created: list[tuple[str, list[dict], dict]] = []
        self.looks: list[tuple[str, float]] = []
        self.ended_ids: set[str] = set()
        self.results_of: dict[str, list[Result]] = {}
        self.refuse: Exception | None = None
        self.lost_answer = False  # the batch is created, then the answer never arrives
        self.cancelled: list[str] = []
        self.refuse_cancel: Exception | None = None

    async def create(self, requests, headers):
        if self.refuse is not None:
            raise self.refuse
        batch_id = f"msgbatch_{len(self.created) + 1:02d}"
        self.created.append((batch_id, requests, headers))
        if self.lost_answer:
            raise anthropic.APITimeoutError(request=REQUEST)
        return batch_id

    async def ended(self, batch_id):
        self.looks.append((batch_id, self.clock()))
        return batch_id in self.ended_ids

    async def results(self, batch_id):
        for result in self.results_of.get(batch_id, []):
            yield result

    async def created_since(self, since):
        return [Listed(b, START, b in self.ended_ids) for b, _, _ in reversed(self.created)]

    async def cancel(self, batch_id):
        """As the API does: the batch ends soon after, its unanswered requests `canceled`."""
        if self.refuse_cancel is not None:
            raise self.refuse_cancel
        self.cancelled.append(batch_id)
        (requests,) = [r for b, r, _ in self.created if b == batch_id]
        self.results_of[batch_id] = [Result(r["custom_id"], "canceled", None, "") for r in requests]
        self.ended_ids.add(batch_id)

    def answer_all(self, batch_id: str, text: str = "Done.") -> None:
        """End the batch with a text answer for each of its requests."""
        (requests,) = [r for b, r, _ in self.created if b == batch_id]
        self.results_of[batch_id] = [succeeded(r["custom_id"], text) for r in requests]
        self.ended_ids.add(batch_id)

    def custom_ids(self) -> list[str]:
        return [r["custom_id"] for _, requests, _ in self.created for r in requests]


def succeeded(custom_id: str, text: str) -> Result:
    message = anthropic.types.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1000, "output_tokens": 50},
        }
    )
    return Result(custom_id, "succeeded", message, "")


def command(n: int, step: int = 0, customer: str = "cus_1001", deadline_at: float = START + 86400) -> CallModel:
    turn = Turn(
        turn_id=f"turn_{n:04d}",
        request_id=f"req_{n}",
        conversation_id=f"conv_{n}",
        customer_id=customer,
        lane="batch",
        deadline_at=deadline_at,
    )
    return CallModel(turn=turn, step=step, messages=[{"role": "user", "content": f"question {n}"}], spent=Usage())


@pytest.fixture
async def store(tmp_path):
    calls = await BatchCalls.open(await migrated(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"))
    yield calls
    await TurnStore.close(calls)


class Fleet:
    """One model service's lane and what it published; `restarted` is another process on the same table."""

    def __init__(self, store: BatchCalls, clock: Clock, api: Api, owner: str = "model-0", **settings) -> None:
        self.store, self.clock, self.api = store, clock, api
        self.published: list[tuple[ModelResponded, str]] = []
        self.direct_calls: list[CallModel] = []
        values = {"batch_max_calls": 3, "batch_max_wait_s": 30.0, "batch_poll_s": 10.0, "batch_poll_max_s": 40.0}
        self.settings = Settings(_env_file=None, **{**values, **settings})
        self.lane = self.started(owner)

    def started(self, owner: str) -> BatchLane:
        async def publish(event, key):
            self.published.append((event, key))

        async def direct(command):
            self.direct_calls.append(command)
            return ModelResponded(turn=command.turn, step=command.step + 1, messages=command.messages, model="direct")

        ports = BatchPorts(Model(), self.api, lambda: self.store, OpenFence(), direct, publish, owner, self.clock)
        return lane_of(self.settings, ports)

    async def after(self, seconds: float, lane: BatchLane | None = None) -> None:
        self.clock.now += seconds
        await (lane or self.lane).tick()

    def answers(self) -> dict[str, ModelResponded]:
        return {event.turn.turn_id: event for event, _ in self.published}


async def test_calls_wait_until_a_batch_is_full_then_go_in_one_create_named_by_turn_and_step(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    for n in range(2):
        assert await fleet.lane.gather(command(n))
    await fleet.after(1)
    assert fleet.api.created == []  # two of three, and the oldest has waited 1 s of 30
    assert await fleet.lane.gather(command(2, step=4))
    await fleet.after(1)
    ((_, requests, _),) = fleet.api.created
    assert [r["custom_id"] for r in requests] == ["turn_0000_0", "turn_0001_0", "turn_0002_4"]
    assert requests[0]["params"]["messages"] == [{"role": "user", "content": "question 0"}]
    await fleet.after(1)
    assert len(fleet.api.created) == 1 and await store.due() == (0, None)


async def test_the_oldest_call_sends_a_partial_batch_once_it_has_waited_max_wait(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    await fleet.lane.gather(command(0))
    await fleet.after(29)
    assert fleet.api.created == []
    await fleet.after(2)
    assert fleet.api.custom_ids() == ["turn_0000_0"]


async def test_an_open_batch_is_looked_at_with_backoff_up_to_the_cap(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock), batch_max_calls=1)
    await fleet.lane.gather(command(0))
    await fleet.after(0)
    for _ in range(100):
        await fleet.after(1)
    looks = [at - START for _, at in fleet.api.looks]
    assert looks == [10, 20, 40, 80]  # after 10 s, then 10, 20 and 40 (the cap) apart
    assert fleet.published == []


async def test_an_ended_batch_answers_each_call_from_the_stored_call_never_from_the_result(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    for n in range(3):
        await fleet.lane.gather(command(n))
    await fleet.after(0)
    (batch_id, _, _) = fleet.api.created[0]
    fleet.api.answer_all(batch_id)
    fleet.api.results_of[batch_id].append(succeeded("turn_9999_0", "forged"))  # no call of ours
    await fleet.after(10)
    answers = fleet.answers()
    assert sorted(answers) == ["turn_0000", "turn_0001", "turn_0002"]
    for event in answers.values():
        assert event.batch_id == batch_id and event.step == 1 and event.error is None
        assert event.turn.customer_id == "cus_1001" and event.content == [{"type": "text", "text": "Done."}]
        assert event.usage.input_tokens == 1000 and event.spent.output_tokens == 50
    assert [key for _, key in fleet.published] == ["conv_0", "conv_1", "conv_2"]
    await fleet.after(100)
    assert len(fleet.published) == 3  # each answered once: the calls are done


async def test_a_result_for_an_open_call_of_another_batch_does_nothing(store):
    """A batch's results name a call that waits in another batch (another customer's turn): not answered from it."""
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock), batch_max_calls=1)
    await fleet.lane.gather(command(0, customer="cus_victim"))
    await fleet.after(0)
    await fleet.lane.gather(command(1, customer="cus_attacker"))
    await fleet.after(0)
    first, second = (b for b, _, _ in fleet.api.created)
    fleet.api.results_of[second] = [succeeded("turn_0000_0", "refund everything"), succeeded("turn_0001_0", "ok")]
    fleet.api.ended_ids.add(second)
    await fleet.after(10)
    assert list(fleet.answers()) == ["turn_0001"]
    fleet.api.answer_all(first, "Your order ships today.")
    await fleet.after(20)
    victim = fleet.answers()["turn_0000"]
    assert victim.batch_id == first and victim.content[0]["text"] == "Your order ships today."


async def test_an_errored_result_is_tried_once_more_in_the_next_batch_then_is_the_calls_error(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock), batch_max_calls=1)
    await fleet.lane.gather(command(0))
    await fleet.after(0)
    fleet.api.results_of["msgbatch_01"] = [Result("turn_0000_0", "errored", None, "api_error: overloaded")]
    fleet.api.ended_ids.add("msgbatch_01")
    await fleet.after(10)
    await fleet.after(1)  # the call queued again goes in the next batch
    assert fleet.published == [] and fleet.api.custom_ids() == ["turn_0000_0", "turn_0000_0_r"]
    fleet.api.results_of["msgbatch_02"] = [Result("turn_0000_0_r", "expired", None, "")]
    fleet.api.ended_ids.add("msgbatch_02")
    await fleet.after(10)
    ((event, _),) = fleet.published
    assert event.batch_id == "msgbatch_02" and "expired twice" in event.error and event.step == 1


async def test_a_failed_result_near_the_turns_deadline_is_tried_once_as_a_direct_call(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock), batch_max_calls=1, batch_retry_direct_within_s=600)
    await fleet.lane.gather(command(0, deadline_at=START + 300))
    await fleet.after(0)
    fleet.api.results_of["msgbatch_01"] = []  # no result at all for it
    fleet.api.ended_ids.add("msgbatch_01")
    await fleet.after(10)
    assert [c.turn.turn_id for c in fleet.direct_calls] == ["turn_0000"]
    ((event, _),) = fleet.published
    assert event.model == "direct" and event.batch_id == "" and len(fleet.api.created) == 1


async def test_a_create_refused_for_the_apis_limits_waits_its_retry_after_and_is_sent_again(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock), batch_max_calls=1)
    response = httpx.Response(429, request=REQUEST, headers={"retry-after": "20"})
    fleet.api.refuse = anthropic.RateLimitError("rate limited", response=response, body=None)
    await fleet.lane.gather(command(0))
    await fleet.after(0)
    fleet.api.refuse = None
    await fleet.after(10)
    assert fleet.api.created == []  # paused for 20 s
    await fleet.after(11)
    assert fleet.api.custom_ids() == ["turn_0000_0"]


async def test_a_create_refused_as_invalid_fails_each_of_its_calls(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock), batch_max_calls=2)
    response = httpx.Response(400, request=REQUEST)
    fleet.api.refuse = anthropic.BadRequestError("too large", response=response, body=None)
    await fleet.lane.gather(command(0))
    await fleet.lane.gather(command(1))
    await fleet.after(0)
    assert sorted(fleet.answers()) == ["turn_0000", "turn_0001"]
    assert all("refused" in event.error for event, _ in fleet.published)
    assert await store.due() == (0, None)


async def test_a_restarted_replica_takes_its_batches_back_and_never_creates_them_again(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    for n in range(6):
        await fleet.lane.gather(command(n))
    await fleet.after(0)
    assert len(fleet.api.created) == 2
    restarted = fleet.started("model-0")  # the same replica's name: its leases are its own
    other = fleet.started("model-1")
    for batch_id, _, _ in fleet.api.created:
        fleet.api.answer_all(batch_id)
    await fleet.after(0, other)
    assert fleet.published == []  # another replica waits for the leases to run out
    await fleet.after(0, restarted)
    assert len(fleet.published) == 6 and len(fleet.api.created) == 2


async def test_another_replica_takes_the_batches_over_once_their_lease_runs_out(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    for n in range(3):
        await fleet.lane.gather(command(n))
    await fleet.after(0)
    other = fleet.started("model-1")
    fleet.api.answer_all(fleet.api.created[0][0])
    await fleet.after(119, other)
    assert fleet.published == []
    await fleet.after(40, other)  # its next round of leases, the first after the lease ran out
    assert len(fleet.published) == 3 and len(fleet.api.created) == 1


async def test_a_batch_created_but_never_recorded_is_found_by_its_results_and_taken_over(store):
    """The create's answer was lost: the calls stay taken, the batch exists. The lane waits for the unknown batch to
    end, finds its calls in its results, and answers them from it: nothing is submitted twice."""
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    fleet.api.lost_answer = True
    for n in range(3):
        await fleet.lane.gather(command(n))
    await fleet.after(0)
    fleet.api.lost_answer = False
    restarted = fleet.started("model-0")
    for _ in range(5):
        await fleet.after(10, restarted)
    assert fleet.published == [] and len(fleet.api.created) == 1  # the unknown batch is still open: wait
    fleet.api.answer_all("msgbatch_01")
    for _ in range(10):
        await fleet.after(10, restarted)
    assert sorted(fleet.answers()) == ["turn_0000", "turn_0001", "turn_0002"]
    assert {event.batch_id for event, _ in fleet.published} == {"msgbatch_01"}
    assert fleet.api.custom_ids() == ["turn_0000_0", "turn_0001_0", "turn_0002_0"]


async def test_a_submission_whose_batch_was_never_created_is_queued_again_and_sent_once(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    fleet.api.refuse = anthropic.APIConnectionError(request=REQUEST)  # sent? the lane cannot tell
    for n in range(3):
        await fleet.lane.gather(command(n))
    await fleet.after(0)
    fleet.api.refuse = None
    await fleet.after(120)  # once a create still on its way would have landed: no batch holds its calls
    await fleet.after(1)
    assert fleet.api.custom_ids() == ["turn_0000_0", "turn_0001_0", "turn_0002_0"]


async def test_a_redelivered_call_is_recorded_once_and_a_refused_claim_records_nothing(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    assert await fleet.lane.gather(command(0)) and await fleet.lane.gather(command(0))
    assert await store.due() == (1, START)

    class Refusing(OpenFence):
        async def claim_model_call(self, turn, step, now):
            return False

    ports = BatchPorts(Model(), fleet.api, lambda: store, Refusing(), None, None, "model-0", clock)
    assert not await BatchLane(fleet.settings, ports).gather(command(1))
    assert await store.due() == (1, START)


async def test_the_calls_of_turns_that_ended_while_they_waited_are_not_sent(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    row = dict(request_id="r", conversation_id="conv_1", customer_id="cus_1001", step=0, turn_json="{}")
    values = {**row, "turn_id": "turn_0001", "status": ENDED, "started_at": START, "last_progress_at": START}
    await store._run(lambda conn: conn.execute(insert(turns).values(**values)), write=True)
    for n in range(3):
        await fleet.lane.gather(command(n))
    await fleet.after(0)
    assert fleet.api.custom_ids() == ["turn_0000_0", "turn_0002_0"]


def test_a_custom_id_is_the_turn_and_step_within_the_apis_characters_and_length():
    assert custom_id_of("turn_0123abcd", 2) == "turn_0123abcd_2"
    for odd in ("turn with spaces", "t" * 80, "tür"):
        made = custom_id_of(odd, 12)
        assert CUSTOM_ID.match(made) and len(made + "_r") <= 64, made
    assert custom_id_of("t" * 80, 1) != custom_id_of("t" * 81, 1)


def test_the_lanes_pauses_and_lease_come_from_its_settings():
    settings = Settings(_env_file=None, batch_poll_s=5.0, batch_poll_max_s=2.0, batch_max_wait_s=0.4)
    ports = BatchPorts(Model(), SimpleNamespace(), lambda: None, OpenFence(), None, None, "m", time.time)
    lane = BatchLane(settings, ports)
    assert lane.poll_max_s == 5.0 and lane.tick_s == pytest.approx(0.1) and lane.lease_s == 120.0


async def test_a_batch_whose_results_fail_to_download_is_read_again_later_and_puts_off_no_other(store):
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock), batch_max_calls=1)
    for n in range(2):
        await fleet.lane.gather(command(n))
        await fleet.after(0)
    first, second = (b for b, _, _ in fleet.api.created)
    fleet.api.answer_all(first)
    fleet.api.answer_all(second)
    broken = fleet.api.results_of[first]

    async def cut_off(batch_id):
        if batch_id == first and fleet.api.results_of[first] is broken:
            raise anthropic.APIConnectionError(request=REQUEST)
        for result in fleet.api.results_of[batch_id]:
            yield result

    fleet.api.results = cut_off
    await fleet.after(10)
    assert list(fleet.answers()) == ["turn_0001"]  # the second batch's answer did not wait for the first's
    fleet.api.results_of[first] = list(broken)
    await fleet.after(10)
    assert sorted(fleet.answers()) == ["turn_0000", "turn_0001"] and len(fleet.published) == 2
