"""build_result(): what a finished run reports, and which output its last score judged."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration.core.results import build_result


def _step(key: str, text: str | None, **extra: Any) -> dict[str, Any]:
    return {"key": key, "text": text, "input_tokens": 1, "output_tokens": 1, **extra}


def _critique(n: int, score: float) -> dict[str, Any]:
    return _step(f"r{n}.critique", "{}", score=score, issues=[], summary="")


RUN = {"run_id": "r", "status": "max_rounds_reached"}


@pytest.mark.parametrize(
    ("steps", "output", "output_round", "score", "scored_round", "judges_output"),
    [
        pytest.param(
            [_step("r0.generate", "v0"), _critique(1, 0.95)],
            "v0",
            0,
            0.95,
            0,
            True,
            id="approved-first-draft",
        ),
        pytest.param(
            [
                _step("r0.generate", "v0"),
                _critique(1, 0.4),
                _step("r1.refine", "v1"),
                _critique(2, 0.95),
            ],
            "v1",
            1,
            0.95,
            1,
            True,
            id="approved-revision",
        ),
        pytest.param(
            [
                _step("r0.generate", "v0"),
                _critique(1, 0.4),
                _step("r1.refine", "v1"),
                _critique(2, 0.6),
                _step("r2.refine", "v2"),
            ],
            "v2",
            2,
            0.6,
            1,
            False,
            id="max-rounds-last-revision-unscored",
        ),
        pytest.param(
            [
                _step("r0.generate", "v0"),
                _critique(1, 0.4),
                _step("r1.refine", "cut", interrupted="max_tokens"),
            ],
            "v0",
            0,
            0.4,
            0,
            True,
            id="interrupted-revision-keeps-judged-output",
        ),
        pytest.param(
            [_step("r0.generate", "cut", interrupted="max_tokens")],
            "cut",
            0,
            None,
            None,
            False,
            id="only-a-cut-draft",
        ),
        pytest.param([], None, None, None, None, False, id="nothing-ran"),
    ],
)
def test_final_score_says_which_output_it_judged(
    steps: list[dict[str, Any]],
    output: str | None,
    output_round: int | None,
    score: float | None,
    scored_round: int | None,
    judges_output: bool,
) -> None:
    result = build_result(RUN, {s["key"]: s for s in reversed(steps)}, [])
    assert (result.output, result.output_round) == (output, output_round)
    assert (result.final_score, result.scored_output_round) == (score, scored_round)
    assert result.final_score_judges_output is judges_output
