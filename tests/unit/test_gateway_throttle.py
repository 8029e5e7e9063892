"""The gateway admits fewer new turns while turns wait for the model's capacity (services/_gateway/throttle.py)."""

from __future__ import annotations

import asyncio

from roundtrip._gateway.admission import Admission, Lanes
from roundtrip._gateway.throttle import BETA, Throttle


async def test_turns_waiting_for_capacity_cut_admission_below_the_running_turns_and_none_let_it_climb_back():
    admission = Admission(limit=100, forget_after_s=600)
    for i in range(50):
        await admission.admit(f"turn_{i}")
    throttle = Throttle(Lanes(admission, Admission(limit=10, forget_after_s=600)), store=None)
    throttle.adjust(waiting=20)  # fewer than half of them: the model has calls ready, admission holds
    assert admission.limit == 100
    throttle.adjust(waiting=30)
    assert admission.limit == int(50 * BETA)  # new turns wait until running ones end and the model catches up
    late = asyncio.create_task(admission.admit("turn_new"))
    await asyncio.sleep(0.05)  # the window the late admit would (wrongly) have gone through in
    assert not late.done()
    for i in range(20):
        admission.release(f"turn_{i}")
    throttle.adjust(waiting=0)  # nothing waits any more: the limit climbs back, a step per check, to the configured one
    await asyncio.wait_for(late, 1)
    for _ in range(100):
        throttle.adjust(waiting=0)
    assert admission.limit == 100


async def test_the_ledger_is_read_each_check_and_a_failing_read_leaves_admission_alone(monkeypatch):
    import roundtrip._gateway.throttle as module

    monkeypatch.setattr(module, "CHECK_S", 0.01)
    answers = [8, RuntimeError("database is locked"), 0]

    class Store:
        async def waiting_for_capacity(self) -> int:
            answer = answers.pop(0) if answers else 0
            if isinstance(answer, Exception):
                raise answer
            return answer

        async def ended_among(self, turn_ids: list[str]) -> set[str]:
            return set()

    admission = Admission(limit=10, forget_after_s=600)
    for i in range(10):
        await admission.admit(f"turn_{i}")
    throttle = Throttle(Lanes(admission, Admission(limit=10, forget_after_s=600)), Store())
    task = asyncio.create_task(throttle.run())
    while answers:
        await asyncio.sleep(0.01)  # poll interval: the throttle's checks (0.01 s apart) using up the answers
    await asyncio.sleep(0.05)  # several more checks (0.01 s apart) after the last answer
    task.cancel()
    assert throttle.waiting == 0 and 9 <= admission.limit <= 10


async def test_running_turns_that_ended_at_another_replica_are_released_from_the_ledger(monkeypatch):
    """Two gateway replicas: the outcomes' partitions are assigned apart from the requests', so a replica does not see
    the end of about half its turns. Each check asks the ledger which of its running turns ended and frees their places,
    so a full replica admits again within a check instead of after the turn deadline."""
    import roundtrip._gateway.throttle as module

    monkeypatch.setattr(module, "CHECK_S", 0.01)
    ended: set[str] = set()
    asked: list[list[str]] = []

    class Store:
        async def waiting_for_capacity(self) -> int:
            return 0

        async def ended_among(self, turn_ids: list[str]) -> set[str]:
            asked.append(sorted(turn_ids))
            return ended & set(turn_ids)

    admission = Admission(limit=4, forget_after_s=600)
    for i in range(4):
        await admission.admit(f"turn_{i}")
    late = asyncio.create_task(admission.admit("turn_late"))
    task = asyncio.create_task(Throttle(Lanes(admission, Admission(limit=10, forget_after_s=600)), Store()).run())
    await asyncio.sleep(0.05)  # several checks (0.01 s apart): the throttle asked the ledger
    assert not late.done() and asked and asked[-1] == [f"turn_{i}" for i in range(4)]
    ended.update({"turn_1", "turn_3"})  # their outcomes went to the other replica
    await asyncio.wait_for(late, 1)
    task.cancel()
    assert admission.running == 3 and "turn_late" in admission.running_ids()


async def test_batch_turns_that_ended_at_another_replica_are_released_less_often_and_in_bounded_questions(monkeypatch):
    """Batch turns run for hours, thousands at once: the ledger is asked about their ends once in BATCH_CHECK_EVERY
    checks, ASKED_AT_ONCE ids a question; the interactive turns are asked about every check as before."""
    import roundtrip._gateway.throttle as module

    monkeypatch.setattr(module, "CHECK_S", 0.01)
    monkeypatch.setattr(module, "BATCH_CHECK_EVERY", 5)
    monkeypatch.setattr(module, "ASKED_AT_ONCE", 4)
    asked: list[list[str]] = []

    class Store:
        async def waiting_for_capacity(self) -> int:
            return 0

        async def ended_among(self, turn_ids: list[str]) -> set[str]:
            asked.append(list(turn_ids))
            return {t for t in turn_ids if t.endswith(("_1", "_7"))}

    batch = Admission(limit=10, forget_after_s=86400)
    for i in range(10):
        await batch.admit(f"batch_{i}")
    interactive = Admission(limit=10, forget_after_s=600)
    await interactive.admit("chat_0")
    task = asyncio.create_task(Throttle(Lanes(interactive, batch), Store()).run())
    while sum(q[0].startswith("batch_") for q in asked) < 3:
        await asyncio.sleep(0.01)  # poll interval: the throttle's checks (0.01 s apart) until its batch questions
    task.cancel()
    batch_questions = [q for q in asked if q[0].startswith("batch_")]
    chat_questions = [q for q in asked if q == ["chat_0"]]
    assert [len(q) for q in batch_questions] == [4, 4, 2]  # 10 ids, 4 a question
    assert len(chat_questions) >= 5 and batch.running == 8 and "batch_1" not in batch.running_ids()
