"""Whose conversation a run continues, and how much of it a call is sent."""

from __future__ import annotations

import re

import pytest

from orchestration.core.errors import ConfigError
from orchestration.core.memory import (
    ConversationSettings,
    Turn,
    bounded,
    check_name,
    conversation_scope,
    estimate_tokens,
)
from orchestration.core.validation import checked


@pytest.mark.parametrize(
    ("memory", "user_id", "batch_id", "expected"),
    [
        # a single run: the spec's per-user default
        (None, "alice", None, "user:alice"),
        (None, None, None, "run:r1"),
        # a batch input: its own conversation unless the config asks for per-user memory
        (None, "alice", "b1", "run:r1"),
        ("per_user", "alice", "b1", "user:alice"),
        ("per_run", "alice", None, "run:r1"),
        ("per_run", "alice", "b1", "run:r1"),
        ("per_user", "alice", None, "user:alice"),
        # no user: always the run's own
        ("per_user", None, "b1", "run:r1"),
        ("per_user", "", None, "run:r1"),
    ],
)
def test_conversation_scope(
    memory: str | None, user_id: str | None, batch_id: str | None, expected: str
) -> None:
    scope = conversation_scope(memory, run_id="r1", user_id=user_id, batch_id=batch_id)  # type: ignore[arg-type]
    assert scope == expected


def T(step: str, chars: int) -> Turn:  # noqa: N802 - a table helper
    """A turn of ``chars`` characters in prompt and reply together (``chars / 4`` tokens)."""
    return Turn(step, "p" * (chars // 2), "a" * (chars - chars // 2))


@pytest.mark.parametrize(
    ("turns", "max_tokens", "kept"),
    [
        pytest.param([], 100, [], id="empty"),
        pytest.param([T("o/a", 400), T("o/b", 400)], 200, ["o/a", "o/b"], id="fits"),
        pytest.param([T("o/a", 400), T("o/b", 400)], 199, ["o/b"], id="oldest-dropped-first"),
        pytest.param([T("o/a", 400), T("o/b", 400)], 99, [], id="all-others-dropped"),
        pytest.param(
            [T("o/a", 400), T("r/x", 4000), T("o/b", 400)],
            100,
            ["r/x"],
            id="own-run-kept-over-the-bound",
        ),
        pytest.param(
            [T("r/x", 400), T("o/a", 400), T("o/b", 400), T("r/y", 400)],
            300,
            ["r/x", "o/b", "r/y"],
            id="own-turns-kept-others-oldest-first",
        ),
        pytest.param(
            [T("o/a", 400), T("o/a", 400), T("o/b", 400)],
            200,
            ["o/a", "o/b"],
            id="a-repeated-turn-counts-once",
        ),
        pytest.param([T("o/a", 400)], 0, [], id="zero-sends-no-other-runs"),
        pytest.param([T("rx/a", 400)], 0, [], id="prefix-is-the-whole-run-id"),
    ],
)
def test_bounded_by_tokens(turns: list[Turn], max_tokens: int, kept: list[str]) -> None:
    assert [t.step for t in bounded(turns, max_tokens=max_tokens, run_id="r")] == kept


def test_token_estimate_is_four_characters_a_token() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 400)] == [0, 1, 1, 2, 100]
    assert T("s", 400).tokens == 100


@pytest.mark.parametrize("name", ["code-review", "a", "team_1.v2", "A" * 64])
def test_good_names(name: str) -> None:
    check_name(name, "name=")


@pytest.mark.parametrize("name", ["", "-x", "has space", "a:b", "x" * 65, "é", 3, "a\n"])
def test_bad_names_are_refused_naming_where(name: object) -> None:
    with pytest.raises(ConfigError, match="where-it-was"):
        check_name(name, "where-it-was")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"memory": "user"}, "memory: must be 'per_run' or 'per_user', got 'user'"),
        ({"name": "code review"}, "name: 'code review' must be 1-64 letters"),
        ({"conversation_turns": 0}, "conversation_turns: must be >= 1, got 0"),
        ({"conversation_max_tokens": 0}, "conversation_max_tokens: must be >= 1, got 0"),
        ({"conversation_max_tokens": "4000"}, "conversation_max_tokens: must be an integer"),
    ],
)
def test_conversation_settings_are_checked(data: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        checked(ConversationSettings, data)
