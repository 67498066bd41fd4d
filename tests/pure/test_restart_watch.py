"""A worker tells a restarted Redis by its new ``run_id``, and when it came back."""

from __future__ import annotations

from orchestration.services.sweeper import RestartWatch


def test_a_new_run_id_is_a_restart_and_says_when_it_came_back() -> None:
    watch = RestartWatch()
    assert watch.seen("a" * 40, 500, now=1000.0) is None  # first sight: nothing to compare
    assert watch.seen("a" * 40, 510, now=1010.0) is None  # the same server
    assert watch.seen("b" * 40, 3, now=1020.0) == 1017.0  # restarted 3 s ago
    assert watch.seen("b" * 40, 5, now=1022.0) is None


def test_a_failover_to_a_replica_up_for_long_is_dated_when_the_old_primary_was_last_seen() -> None:
    """A promoted replica's uptime says nothing of the change: the runs to sweep are those
    that have not moved since the old primary was last seen."""
    watch = RestartWatch()
    assert watch.seen("a" * 40, 500, now=1000.0) is None
    assert watch.seen("a" * 40, 505, now=1005.0) is None
    assert watch.seen("c" * 40, 9000, now=1030.0) == 1005.0  # up 9,000 s: a failover
