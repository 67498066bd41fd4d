"""PauseMemory: which pause keys a step may skip reading, and what it then goes by."""

from __future__ import annotations

from orchestration.services.pauses import PauseMemory


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _memory(recheck_s: float = 1.0) -> tuple[Clock, PauseMemory]:
    clock = Clock()
    return clock, PauseMemory(recheck_s, clock)


def test_a_key_never_learned_is_read() -> None:
    memory = PauseMemory(1.0, Clock())
    assert memory.fresh() == ()
    assert memory.paused_s("k") == 0.0


def test_fresh_no_pause_is_skipped_until_the_recheck_interval_passes() -> None:
    clock, memory = _memory()
    memory.learned("k", 0.0)
    clock.now += 0.99
    assert memory.fresh() == ("k",)
    assert memory.paused_s("k") == 0.0
    clock.now += 0.01
    assert memory.fresh() == (), "stale after recheck_s: read again"


def test_a_read_refreshes_the_memory() -> None:
    clock, memory = _memory()
    memory.learned("k", 0.0)
    clock.now += 5
    assert memory.fresh() == ()
    memory.learned("k", 3.0)  # the read found another process's pause
    assert memory.fresh() == ("k",)
    assert memory.paused_s("k") == 3.0


def test_own_pause_is_known_at_once_and_ends() -> None:
    clock, memory = _memory()
    memory.learned("a", 0.0)
    memory.learned("b", 0.5)  # this process set a 0.5 s pause after a 429
    assert set(memory.fresh()) == {"a", "b"}
    assert memory.paused_s("b") == 0.5
    assert memory.paused_s("a") == 0.0
    clock.now += 0.3
    assert abs(memory.paused_s("b") - 0.2) < 1e-9
    clock.now += 0.3  # the pause is over; what was learned is still fresh
    assert set(memory.fresh()) == {"a", "b"}
    assert memory.paused_s("b") == 0.0


def test_a_long_own_pause_is_read_again_after_the_recheck_interval() -> None:
    clock, memory = _memory()
    memory.learned("k", 5.0)
    clock.now += 1.0
    assert memory.fresh() == (), "another process may have lengthened it"
    assert memory.paused_s("k") == 4.0


def test_zero_recheck_reads_every_call() -> None:
    memory = PauseMemory(0.0, Clock())
    memory.learned("k", 0.0)
    memory.learned("p", 2.0)
    assert memory.fresh() == ()
