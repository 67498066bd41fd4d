"""A worker tells a restarted Redis by its new ``run_id``, and when it came back."""

from __future__ import annotations

from orchestration.services.sweeper import RestartWatch


def test_a_new_run_id_is_a_restart_and_says_when_it_came_back() -> None:
    watch = RestartWatch()
    assert watch.seen("a" * 40, 500, now=1000.0) is None  # first sight: nothing to compare
    assert watch.seen("a" * 40, 510, now=1010.0) is None  # the same server
    assert watch.seen("b" * 40, 3, now=1020.0) == 1017.0  # restarted 3 s ago
    assert watch.seen("b" * 40, 5, now=1022.0) is None
