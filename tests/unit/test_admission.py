"""The gateway's admission: at most `limit` running turns, first come first served, leaks forgotten."""

from __future__ import annotations

import asyncio

import pytest

from roundtrip._gateway.admission import Admission


async def test_admits_up_to_the_limit_then_in_arrival_order():
    admission = Admission(limit=2, forget_after_s=60)
    await admission.admit("t1")
    await admission.admit("t2")
    order: list[str] = []

    async def wait(turn: str) -> None:
        await admission.admit(turn)
        order.append(turn)

    waiting = [asyncio.create_task(wait(t)) for t in ("t3", "t4", "t5")]
    await asyncio.sleep(0.01)  # the waiters' tasks run to their wait (no I/O: a few loop turns)
    assert admission.running == 2 and admission.waiting == 3 and order == []
    admission.release("t1")
    await asyncio.sleep(0.01)  # the woken waiter's task runs on (a few loop turns)
    assert order == ["t3"] and admission.running == 2
    admission.release("t2")
    admission.release("t3")
    await asyncio.sleep(0.01)  # the woken waiters' tasks run on (a few loop turns)
    assert order == ["t3", "t4", "t5"] and admission.running == 2
    await asyncio.gather(*waiting)


async def test_a_newcomer_does_not_overtake_a_woken_waiter():
    admission = Admission(limit=1, forget_after_s=60)
    await admission.admit("t1")
    first = asyncio.create_task(admission.admit("t2"))
    await asyncio.sleep(0.01)  # t2's task runs to its wait (a few loop turns)
    admission.release("t1")  # the slot is handed to t2 ...
    late = asyncio.create_task(admission.admit("t3"))  # ... so t3, arriving now, waits
    await asyncio.sleep(0.01)  # t2 takes the slot, t3 reaches its wait (a few loop turns)
    assert first.done() and not late.done()
    admission.release("t2")
    await asyncio.wait_for(late, 1)


async def test_a_cancelled_waiter_passes_its_slot_on():
    admission = Admission(limit=1, forget_after_s=60)
    await admission.admit("t1")
    gone = asyncio.create_task(admission.admit("t2"))
    next_one = asyncio.create_task(admission.admit("t3"))
    await asyncio.sleep(0.01)  # both tasks run to their wait (a few loop turns)
    gone.cancel()
    admission.release("t1")
    await asyncio.wait_for(next_one, 1)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert admission.running == 1


async def test_turns_whose_end_was_never_seen_are_forgotten():
    admission = Admission(limit=1, forget_after_s=0.2)
    await admission.admit("lost")  # its outcome went to another gateway replica
    await asyncio.wait_for(admission.admit("next"), 2)  # admitted once the lost one is forgotten
    assert admission.running == 1
