"""The batch lane cancels an open batch once the turns of all its calls ended (a deadline, a cancel, the fence): the
cancel is recorded on its calls, which are looked at no more; a batch that still holds a live turn's call is not
cancelled, and a cancel the API refuses leaves the batch to be read as before (its answers dropped by the guard).
The fakes of test_model_batch_lane.py over the real batch calls' table (SQLite)."""

from __future__ import annotations

import anthropic
import httpx
from sqlalchemy import insert, select, update

from roundtrip._kernel.storage.turnstore import ENDED, RUNNING, batch_calls, turns
from tests.unit.test_model_batch_lane import REQUEST, START, Api, Clock, Fleet, command, store  # noqa: F401 - a fixture

TURNS = ["turn_0000", "turn_0001", "turn_0002"]


async def running_turn(store, n: int) -> None:  # noqa: F811
    """The ledger's row of `command(n)`'s turn, as the guard records it."""
    values = dict(
        turn_id=f"turn_{n:04d}", request_id=f"req_{n}", conversation_id=f"conv_{n}", customer_id="cus_1001",
        status=RUNNING, step=0, started_at=START, last_progress_at=START, turn_json="{}",
    )  # fmt: skip
    await store._run(lambda conn: conn.execute(insert(turns).values(**values)), write=True)


async def end(store, n: int) -> None:  # noqa: F811
    statement = update(turns).where(turns.c.turn_id == f"turn_{n:04d}").values(status=ENDED, outcome="cancelled")
    await store._run(lambda conn: conn.execute(statement), write=True)


async def call_states(store) -> dict[str, str]:  # noqa: F811
    query = select(batch_calls.c.turn_id, batch_calls.c.status)
    return dict(await store._run(lambda conn: conn.execute(query).all()))


async def started(store, count: int) -> tuple[Fleet, str]:  # noqa: F811
    """`count` running turns whose calls went out in one batch."""
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock))
    for n in range(count):
        await running_turn(store, n)
        await fleet.lane.gather(command(n))
    await fleet.after(fleet.settings.batch_max_wait_s)
    ((batch_id, _, _),) = fleet.api.created
    return fleet, batch_id


async def test_a_batch_whose_turns_all_ended_is_cancelled_and_looked_at_no_more(store):  # noqa: F811
    fleet, batch_id = await started(store, 3)
    for n in (0, 1):
        await end(store, n)
    await fleet.after(10)
    assert fleet.api.cancelled == [] and len(fleet.api.looks) == 1  # one turn still waits for its answer
    await end(store, 2)
    await fleet.after(20)
    assert fleet.api.cancelled == [batch_id]
    assert await call_states(store) == dict.fromkeys(TURNS, "cancelled")
    looks = len(fleet.api.looks)
    for _ in range(10):
        await fleet.after(60)
    other = fleet.started("model-1")
    await fleet.after(200, other)  # past any lease: another replica finds nothing open
    assert len(fleet.api.looks) == looks and fleet.published == [] and fleet.api.cancelled == [batch_id]
    await fleet.after(fleet.settings.batch_deadline_s)
    assert await call_states(store) == {}  # forgotten as answered calls are


async def test_a_cancel_the_api_refuses_leaves_the_batch_to_be_read_as_before(store):  # noqa: F811
    fleet, batch_id = await started(store, 1)
    response = httpx.Response(409, request=REQUEST)
    fleet.api.refuse_cancel = anthropic.ConflictError("it ended meanwhile", response=response, body=None)
    await end(store, 0)
    await fleet.after(10)
    assert fleet.api.cancelled == [] and await call_states(store) == {"turn_0000": "in_batch"}
    fleet.api.answer_all(batch_id)
    await fleet.after(20)
    ((event, _),) = fleet.published  # the guard drops it: its turn ended
    assert event.batch_id == batch_id and await call_states(store) == {"turn_0000": "done"}


async def test_a_batch_of_turns_the_ledger_does_not_know_as_ended_is_never_cancelled(store):  # noqa: F811
    clock = Clock()
    fleet = Fleet(store, clock, Api(clock), batch_max_calls=1)
    await fleet.lane.gather(command(7))  # no row in the ledger: nothing says it ended
    for _ in range(10):
        await fleet.after(30)
    assert fleet.api.cancelled == [] and len(fleet.api.looks) > 3
