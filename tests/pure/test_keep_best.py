"""``[loop] keep = "best"`` and the plateau stop (``min_improvement``): the decision, the
settings in the spec, the config file, and what records, ``duet show`` and the report say."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from duet.config import load_config
from duet.report.html import render_report
from duet.report.records import csv_row, record_kept_note, result_record
from orchestration import ActorCritic, Agent, Team
from orchestration.core.loop import PLATEAU, Finish, LoopState, Refine, StepOutcome, decide
from orchestration.core.results import RunResult, build_result, keep_best, kept
from tests.support import SIM_CONFIG

BASE = SIM_CONFIG


def _run(scores: list[float], status: str = "max_rounds_reached") -> RunResult:
    """A run whose round-``n`` critique scored ``scores[n-1]`` the output ``v{n-1}``, then
    the actor wrote ``v{n}`` (the last one unscored, as when the rounds run out)."""
    base: dict[str, Any] = {"input_tokens": 1, "output_tokens": 1}
    steps: dict[str, dict[str, Any]] = {"r0.generate": {"key": "r0.generate", "text": "v0", **base}}
    for n, score in enumerate(scores, 1):
        steps[f"r{n}.critique"] = {
            "key": f"r{n}.critique",
            "text": "{}",
            "score": score,
            "issues": [f"issue of v{n - 1}"],
            "summary": "",
            **base,
        }
        if status != "approved" or n < len(scores):
            steps[f"r{n}.refine"] = {"key": f"r{n}.refine", "text": f"v{n}", **base}
    return build_result({"run_id": "r", "status": status}, steps, [])


def test_best_returns_the_highest_scored_revision_and_says_which_round() -> None:
    last = _run([0.6, 0.4, 0.3])
    assert (last.output, last.output_round, last.final_score, last.keep) == ("v3", 3, 0.3, "last")
    assert kept(last, "last") is last
    best = kept(last, "best")
    assert (best.output, best.output_round, best.final_score) == ("v0", 0, 0.6)
    assert (best.keep, best.best_round, best.scored_output_round) == ("best", 1, 0)
    assert best.final_score_judges_output
    assert best.verdict is not None and best.verdict.issues == ["issue of v0"]
    assert last.verdict is not None and last.verdict.issues == ["issue of v2"]
    middle = keep_best(_run([0.3, 0.8, 0.5]))
    assert (middle.output, middle.output_round, middle.best_round) == ("v1", 1, 2)


def test_a_tie_keeps_the_earliest_and_an_approved_run_its_approved_output() -> None:
    tie = keep_best(_run([0.6, 0.6]))
    assert (tie.output, tie.output_round, tie.best_round) == ("v0", 0, 1)
    approved = _run([0.3, 0.95], status="approved")
    best = keep_best(approved)
    assert (best.output, best.output_round, best.final_score) == (
        approved.output,
        approved.output_round,
        0.95,
    )
    assert (best.keep, best.best_round) == ("best", 2)


def test_a_run_with_nothing_scored_keeps_what_it_has() -> None:
    draft_only = build_result(
        {"run_id": "r", "status": "interrupted"},
        {"r0.generate": {"key": "r0.generate", "text": "v0"}},
        [],
    )
    best = keep_best(draft_only)
    assert (best.output, best.keep, best.best_round) == ("v0", "best", None)
    assert record_kept_note(result_record(best)) == (
        "the last revision (keep = best, but no revision was scored)"
    )


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ((0.3, 0.32), Finish("max_rounds_reached", PLATEAU)),
        ((0.3, 0.2), Finish("max_rounds_reached", PLATEAU)),
        ((0.3, 0.4), Refine(2)),
        ((0.3,), Refine(1)),
        ((0.3, 0.9), Finish("approved")),  # approval first
    ],
)
def test_min_improvement_stops_on_a_plateau(scores: tuple[float, ...], expected: object) -> None:
    state = _state(scores)
    assert decide(dataclasses.replace(state, min_improvement=0.05)) == expected
    if expected != Finish("approved"):
        assert decide(state) == Refine(len(scores))  # no plateau stop without the setting


def test_a_rise_of_exactly_min_improvement_is_enough_despite_float_rounding() -> None:
    assert 0.7 - 0.6 < 0.1  # float arithmetic: the rise reads a hair short of 0.1
    state = dataclasses.replace(_state((0.6, 0.7)), min_improvement=0.1)
    assert decide(state) == Refine(2)
    zero = dataclasses.replace(_state((0.6, 0.6)), min_improvement=0.0)
    assert decide(zero) == Refine(2)  # 0: only a falling score stops
    assert decide(dataclasses.replace(zero, steps=_state((0.6, 0.5)).steps)) == Finish(
        "max_rounds_reached", PLATEAU
    )


def _state(scores: tuple[float, ...]) -> LoopState:
    steps = [StepOutcome("generate", 0)]
    for n, score in enumerate(scores, 1):
        if n > 1:
            steps.append(StepOutcome("refine", n - 1))
        steps.append(StepOutcome("critique", n, score=score))
    return LoopState(max_rounds=5, approval_threshold=0.9, steps=tuple(steps))


def _pair() -> tuple[Agent, Agent]:
    return Agent("write", model="sim"), Agent("review", model="sim")


def test_keep_and_min_improvement_are_in_the_spec_and_its_id_not_the_team() -> None:
    actor, critic = _pair()
    plain = Team.actor_critic(actor=actor, critic=critic).spec
    team = Team.actor_critic(
        actor=actor, critic=critic, keep="best", min_improvement=0.05, cache="7d"
    )
    assert (team.spec.keep, team.spec.min_improvement) == ("best", 0.05)
    assert (plain.keep, plain.min_improvement) == ("last", None)
    assert team.spec.spec_id != plain.spec_id  # workers read it by spec id
    assert team.spec.team_id == plain.team_id  # the same team, the same conversations
    loop = ActorCritic(actor=actor, critic=critic, keep="best", min_improvement=0.05, cache="7d")
    assert loop.to_spec().keep == "best"
    # ActorCritic(...).run runs what the team runs: its settings (the cache too) all kept.
    assert loop.persistent().to_spec() == team.spec
    nested = Agent("coordinate", model="sim", architecture=loop)
    assert nested.architecture is not None and nested.architecture.keep == "best"


def test_a_config_file_sets_them(tmp_path: Path) -> None:
    path = tmp_path / "review.toml"
    path.write_text(BASE + '\n[loop]\nkeep = "best"\nmin_improvement = 0\n')
    spec = load_config(path).build_team().spec
    assert (spec.keep, spec.min_improvement) == ("best", 0.0)
    path.write_text(BASE)
    default = load_config(path).build_team().spec
    assert (default.keep, default.min_improvement) == ("last", None)


def test_records_csv_and_report_say_which_revision_was_kept() -> None:
    actor, critic = _pair()
    spec = Team.actor_critic(actor=actor, critic=critic, keep="best", min_improvement=0.1).spec
    best = keep_best(_run([0.6, 0.4, 0.3]))
    record = result_record(best, spec=spec)
    assert (record["output"], record["output_round"], record["final_score"]) == ("v0", 0, 0.6)
    assert (record["keep"], record["best_round"], record["issues"]) == ("best", 1, ["issue of v0"])
    assert record["loop"]["keep"] == "best" and record["loop"]["min_improvement"] == 0.1
    note = "the best-scored revision, the first draft (scored 0.60 in round 1)"
    assert record_kept_note(record) == note
    assert record_kept_note(result_record(_run([0.6, 0.4]))) is None
    row = csv_row(record)
    assert "best" in row and 0 in row
    page = render_report([{**record, "id": "a.py", "usage": {}}], title="t")
    assert f"Kept: {note}." in page and "best score 0.60" in page and "Kept output" in page
