"""SeenIds: bounded by count and, with max_age_s, by time, so a steady rate holds a steady number of ids."""

from roundtrip._kernel.clock import SYSTEM
from roundtrip._kernel.kafka.dedupe import SeenIds
from tests.clocks import showing


def test_a_duplicate_is_recognised_and_keeps_its_first_value():
    seen = SeenIds(SYSTEM)
    assert seen.first("a", 1) is None
    assert seen.first("a", 2) == 1
    assert not seen.add("a")
    assert seen.add("b")


def test_the_least_recently_seen_go_first_past_the_capacity():
    seen = SeenIds(SYSTEM, capacity=2)
    seen.add("a"), seen.add("b")
    seen.add("a")  # seen again: now the most recent
    seen.add("c")
    assert "a" in seen and "c" in seen and "b" not in seen
    assert len(seen) == 2


def test_ids_older_than_max_age_are_forgotten_so_a_steady_rate_holds_a_steady_number():
    now = [0.0]
    seen = SeenIds(showing(now), capacity=1_000_000, max_age_s=10)
    for i in range(1000):  # 10 a second for 100 s
        now[0] = i / 10
        seen.add(f"id-{i}")
    assert 100 <= len(seen) <= 101  # the last 10 s, not the 1,000 the capacity would allow
    assert "id-999" in seen and "id-880" not in seen
    now[0] = 99.95
    assert not seen.add("id-950")  # within the window: still a duplicate


def test_get_renews_a_keys_age_so_a_key_in_use_stays():
    now = [0.0]
    seen = SeenIds(showing(now), capacity=100, max_age_s=10)
    seen.first("in-use", "turn")
    for t in range(1, 30):  # asked for every second for 29 s while other keys come and go
        now[0] = t
        assert seen.get("in-use") == "turn"
        seen.add(f"other-{t}")
    assert seen.get("never") is None
    assert len(seen) <= 12  # the key in use and the last 10 s of others
