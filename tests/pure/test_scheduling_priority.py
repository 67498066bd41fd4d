"""Which kombu priority each task's messages get under each scheduling mode."""

from __future__ import annotations

import pytest

from orchestration.core.errors import ConfigError
from orchestration.state import keys
from workers import publish


def test_drafts_go_after_later_steps_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DUET_SCHEDULING", raising=False)
    assert publish.priority(keys.TASK_GENERATE) == keys.DRAFT_PRIORITY
    assert publish.priority(keys.TASK_REFINE) == publish.priority(keys.TASK_CRITIQUE) == 0
    assert publish.list_key(keys.TASK_GENERATE, "actor") == "duet.actor\x06\x169"
    assert publish.list_key(keys.TASK_REFINE, "actor") == "duet.actor"


def test_breadth_first_keeps_one_fifo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUET_SCHEDULING", "breadth")
    assert publish.priority(keys.TASK_GENERATE) == 0


def test_an_unknown_mode_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUET_SCHEDULING", "sideways")
    with pytest.raises(ConfigError, match="DUET_SCHEDULING='sideways'"):
        publish.priority(keys.TASK_GENERATE)
