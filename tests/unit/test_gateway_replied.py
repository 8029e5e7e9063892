"""The gateway's memory of answered turns: a copy of a turn's end gets no second reply, and an end whose
reply a rebalance dropped before its commit is answered when it is read again (never lost)."""

from aiokafka import TopicPartition

from roundtrip._gateway.replied import RepliedTurns

TP, OTHER = TopicPartition("turn.outcomes", 0), TopicPartition("turn.outcomes", 1)


def replied() -> RepliedTurns:
    memory = RepliedTurns("127.0.0.1:1", "support.replies", memory_s=3600.0)
    memory._primed = True  # what reading support.replies would have found: nothing
    return memory


async def test_a_copy_of_an_end_is_not_answered_again_before_or_after_the_commit():
    memory = replied()
    assert await memory.claim("turn_a", TP, 10)
    assert not await memory.claim("turn_a", TP, 14)  # a copy while the first reply waits for its commit
    memory.committed_up_to({TP: 11})
    assert "turn_a" in memory.committed and not memory.staged
    assert not await memory.claim("turn_a", TP, 20)  # a copy after it


async def test_an_end_read_again_after_a_rebalance_dropped_its_uncommitted_reply_is_answered():
    memory = replied()
    assert await memory.claim("turn_a", TP, 10)
    assert await memory.claim("turn_b", OTHER, 3)
    memory.forget([TP])  # the staged reply of turn_a was never committed
    assert await memory.claim("turn_a", TP, 10)  # read again: answered, not dropped as a duplicate
    assert memory.staged["turn_b"] == (OTHER, 3)


async def test_the_same_record_handled_again_keeps_its_claim():
    memory = replied()
    assert await memory.claim("turn_a", TP, 10)
    assert await memory.claim("turn_a", TP, 10)


async def test_nothing_committed_below_the_offsets_stays_staged():
    memory = replied()
    assert await memory.claim("turn_a", TP, 10)
    memory.committed_up_to({TP: 10, OTHER: 99})
    assert "turn_a" in memory.staged and "turn_a" not in memory.committed
