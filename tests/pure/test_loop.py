"""decide(): every transition of the loop, as one table."""

from __future__ import annotations

import pytest

from orchestration.core.loop import (
    Critique,
    Finish,
    Generate,
    LoopState,
    Refine,
    StepOutcome,
    budget_cut,
    decide,
    earlier_of_role,
    interruption,
    parse_step_key,
    starts_round,
    step_index,
    step_key,
)

G = StepOutcome("generate", 0)


def C(n: int, score: float, interrupted: str | None = None) -> StepOutcome:
    return StepOutcome("critique", n, interrupted=interrupted, score=score)


def R(n: int, interrupted: str | None = None) -> StepOutcome:
    return StepOutcome("refine", n, interrupted=interrupted)


def state(*steps: StepOutcome, rounds: int = 3, threshold: float = 0.9, **kw) -> LoopState:
    return LoopState(max_rounds=rounds, approval_threshold=threshold, steps=steps, **kw)


@pytest.mark.parametrize(
    ("st", "expected"),
    [
        # round 0
        (state(), Generate()),
        (state(budget_blocked="budget:run:tokens"), Finish("interrupted", "budget:run:tokens")),
        (
            state(StepOutcome("generate", 0, interrupted="max_tokens")),
            Finish("interrupted", "actor:round_0:max_tokens"),
        ),
        (
            state(StepOutcome("generate", 0, interrupted="provider_error:auth")),
            Finish("interrupted", "actor:round_0:provider_error:auth"),
        ),
        (
            state(StepOutcome("generate", 0, interrupted="error")),
            Finish("failed", "actor:round_0:error"),
        ),
        (
            # an answer Redis could never store (OOM, bigger than its room) fails the run
            state(G, C(1, 0.2, interrupted="redis_out_of_memory")),
            Finish("failed", "critic:round_1:redis_out_of_memory"),
        ),
        # a step refused by the budget ledger ends the run with the ledger's reason
        (
            state(StepOutcome("generate", 0, interrupted="budget:global:tokens")),
            Finish("interrupted", "budget:global:tokens"),
        ),
        (
            state(G, C(1, 0.2, interrupted="budget:run:usd")),
            Finish("interrupted", "budget:run:usd"),
        ),
        # round 1
        (state(G), Critique(1)),
        (state(G, budget_blocked="budget:batch:usd"), Finish("interrupted", "budget:batch:usd")),
        (state(G, C(1, 0.95)), Finish("approved")),
        (state(G, C(1, 0.9)), Finish("approved")),  # at the threshold approves
        (state(G, C(1, 0.89)), Refine(1)),
        (state(G, C(1, 0.0)), Refine(1)),
        (
            state(G, C(1, 0.5, interrupted="max_tokens")),
            Finish("interrupted", "critic:round_1:max_tokens"),
        ),
        (state(G, C(1, 0.2), R(1)), Critique(2)),
        (
            state(G, C(1, 0.2), R(1, interrupted="max_tokens")),
            Finish("interrupted", "actor:round_1:max_tokens"),
        ),
        # round 2 and 3: approval at each round
        (state(G, C(1, 0.2), R(1), C(2, 0.91)), Finish("approved")),
        (state(G, C(1, 0.2), R(1), C(2, 0.5)), Refine(2)),
        (state(G, C(1, 0.2), R(1), C(2, 0.5), R(2)), Critique(3)),
        (state(G, C(1, 0.2), R(1), C(2, 0.5), R(2), C(3, 0.99)), Finish("approved")),
        # the worst case: 1 + 2 x 3 = 7 agent runs, then max rounds
        (state(G, C(1, 0.2), R(1), C(2, 0.5), R(2), C(3, 0.6)), Refine(3)),
        (state(G, C(1, 0.2), R(1), C(2, 0.5), R(2), C(3, 0.6), R(3)), Finish("max_rounds_reached")),
        # budget checked at the start of a round, not between critique and refine
        (state(G, C(1, 0.2), budget_blocked="budget:run:tokens"), Refine(1)),
        (
            state(G, C(1, 0.2), R(1), budget_blocked="budget:user:calls"),
            Finish("interrupted", "budget:user:calls"),
        ),
        # the last round ends by rounds, even with the budget spent
        (
            state(G, C(1, 0.2), R(1), rounds=1, budget_blocked="budget:run:tokens"),
            Finish("max_rounds_reached"),
        ),
        # max_rounds = 1
        (state(G, rounds=1), Critique(1)),
        (state(G, C(1, 0.3), rounds=1), Refine(1)),
        (state(G, C(1, 0.3), R(1), rounds=1), Finish("max_rounds_reached")),
        # thresholds at the edges
        (state(G, C(1, 0.0), threshold=0.0), Finish("approved")),
        (state(G, C(1, 0.99), threshold=1.0), Refine(1)),
        (state(G, C(1, 1.0), threshold=1.0), Finish("approved")),
        # cancellation wins over everything
        (state(cancelled=True), Finish("cancelled", "cancelled")),
        (state(G, C(1, 0.95), cancelled=True), Finish("cancelled", "cancelled")),
    ],
)
def test_decide(st: LoopState, expected: object) -> None:
    assert decide(st) == expected


@pytest.mark.parametrize("rounds", [1, 2, 3, 5])
def test_worst_case_is_one_plus_two_per_round(rounds: int) -> None:
    steps: list[StepOutcome] = []
    while True:
        action = decide(state(*steps, rounds=rounds))
        if isinstance(action, Finish):
            break
        steps.append(
            StepOutcome(
                action.phase, action.round, score=0.0 if action.phase == "critique" else None
            )
        )
    assert action == Finish("max_rounds_reached")
    assert len(steps) == 1 + 2 * rounds


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ((), True),
        ((G,), True),
        ((G, C(1, 0.1)), False),
        ((G, C(1, 0.1), R(1)), True),
        ((G, C(1, 0.1), R(1), C(2, 0.1), R(2), C(3, 0.1), R(3)), False),
        ((StepOutcome("generate", 0, interrupted="max_tokens"),), False),
    ],
)
def test_starts_round(steps: tuple[StepOutcome, ...], expected: bool) -> None:
    assert starts_round(state(*steps)) is expected


@pytest.mark.parametrize(
    ("phase", "round_", "key", "index"),
    [
        ("generate", 0, "r0.generate", 0),
        ("critique", 1, "r1.critique", 1),
        ("refine", 1, "r1.refine", 2),
        ("critique", 3, "r3.critique", 5),
        ("refine", 3, "r3.refine", 6),
    ],
)
def test_step_keys(phase: str, round_: int, key: str, index: int) -> None:
    assert step_key(phase, round_) == key  # type: ignore[arg-type]
    assert parse_step_key(key) == (phase, round_)
    assert step_index(phase, round_) == index  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "generate", "x1.refine", "r1.review", "r.generate"])
def test_parse_step_key_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_step_key(bad)


@pytest.mark.parametrize(
    ("phase", "stop_reason", "complete", "expected"),
    [
        ("generate", "end_turn", False, None),
        ("generate", None, False, None),
        ("generate", "max_tokens", False, "max_tokens"),
        ("refine", "max_tokens", False, "max_tokens"),
        # an actor's answer cut short is never finished, whatever it holds
        ("refine", "max_tokens", True, "max_tokens"),
        ("critique", "end_turn", False, None),
        ("critique", "end_turn", True, None),
        # a cut critique counts only when its JSON object was whole, score included
        ("critique", "max_tokens", True, None),
        ("critique", "max_tokens", False, "max_tokens"),
    ],
)
def test_interruption(phase: str, stop_reason: str | None, complete: bool, expected: str | None):
    assert interruption(phase, stop_reason, complete) == expected


@pytest.mark.parametrize(
    ("interrupted", "lowered_by", "expected"),
    [
        ("max_tokens", "budget:run:tokens", "budget:run:tokens"),
        ("max_tokens", None, "max_tokens"),
        # only the cut is the budget's: a whole answer or a refusal stays what it was
        (None, "budget:run:tokens", None),
        ("refusal", "budget:global:usd", "refusal"),
    ],
)
def test_a_cut_at_a_budget_lowered_limit_is_the_budgets(
    interrupted: str | None, lowered_by: str | None, expected: str | None
) -> None:
    assert budget_cut(interrupted, lowered_by) == expected


def test_a_budget_cut_step_ends_the_run_with_the_budget_reason() -> None:
    cut = StepOutcome("generate", 0, interrupted=budget_cut("max_tokens", "budget:run:tokens"))
    assert decide(state(cut)) == Finish("interrupted", "budget:run:tokens")


@pytest.mark.parametrize(
    ("key", "earlier"),
    [
        ("r0.generate", ()),
        ("r1.critique", ()),
        ("r1.refine", ("r0.generate",)),
        ("r3.refine", ("r0.generate", "r1.refine", "r2.refine")),
        ("r3.critique", ("r1.critique", "r2.critique")),
    ],
)
def test_earlier_steps_of_the_role(key: str, earlier: tuple[str, ...]) -> None:
    assert earlier_of_role(key) == earlier


def test_rerun_point_drops_only_the_step_that_stopped_the_run() -> None:
    from orchestration.core.loop import rerun_point

    cut = (StepOutcome("generate", 0), StepOutcome("critique", 1, interrupted="budget:run:usd"))
    assert rerun_point(cut) == (1, "r1.critique")
    # Stopped between steps (the budget check before a round): nothing is dropped.
    assert rerun_point((StepOutcome("generate", 0),)) == (1, None)
    assert rerun_point(()) == (0, None)
