"""The loop's brain: given what has happened in a run, what happens next.

``decide`` is a pure function of a :class:`LoopState`. It reads no clock, no Redis and
no environment; a spent budget or the last round is a returned :class:`Finish`, never an
exception. The coordinator task loads the state, calls it, records the answer and
enqueues the step it names.

Step keys: round 0 is ``r0.generate``; round ``n >= 1`` is ``rN.critique`` then
``rN.refine``. The ``i``-th step of a run (0-based) is made by transition ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from orchestration.core.completion import REFUSED

Phase = Literal["generate", "critique", "refine"]
Role = Literal["actor", "critic"]
Status = Literal["approved", "max_rounds_reached", "interrupted", "failed", "cancelled"]
#: A step whose answer Redis could never store: bigger than all the room it has left
#: under its ``maxmemory`` (``OOM``). The run fails, its call charged.
REDIS_FULL = "redis_out_of_memory"
#: Step interruptions that fail the run (``<role>:round_N:<kind>``), not interrupt it.
FAILING = ("error", REDIS_FULL)

#: The reason of a run ended early because its score stopped rising (``min_improvement``).
PLATEAU = "plateau"
#: How far two scores may differ by float rounding alone (``0.7 - 0.6`` is not ``0.1``).
SCORE_TOLERANCE = 1e-9

ROLE_OF: dict[str, Role] = {"generate": "actor", "critique": "critic", "refine": "actor"}


def step_key(phase: Phase, round_: int) -> str:
    """``r{round}.{phase}``: the step's name inside its run."""
    return f"r{round_}.{phase}"


def parse_step_key(key: str) -> tuple[Phase, int]:
    """Inverse of :func:`step_key`; ValueError on anything else."""
    head, _, phase = key.partition(".")
    if not head.startswith("r") or phase not in ROLE_OF:
        raise ValueError(f"not a step key: {key!r}")
    return phase, int(head[1:])  # type: ignore[return-value]


def earlier_of_role(key: str) -> tuple[str, ...]:
    """The keys of the steps of ``key``'s role before it in its run, oldest first: the
    actor's draft and revisions before a revision, the critiques before a critique."""
    phase, round_ = parse_step_key(key)
    if phase == "critique":
        return tuple(step_key("critique", r) for r in range(1, round_))
    if phase == "generate":
        return ()
    return (step_key("generate", 0), *(step_key("refine", r) for r in range(1, round_)))


def step_index(phase: Phase, round_: int) -> int:
    """Position of a step in its run: generate 0, critique 2n-1, refine 2n."""
    if phase == "generate":
        return 0
    return 2 * round_ - 1 if phase == "critique" else 2 * round_


def interruption(phase: str, stop_reason: str | None, complete_critique: bool) -> str | None:
    """Whether a model's answer interrupts its agent: ``"max_tokens"``, a reason of
    :data:`REFUSED` (``refusal``, ``content_filter``, ``context_window``) or None.

    An answer cut at ``max_tokens`` is not finished, so it interrupts the agent, except
    a critique whose reply already holds a whole JSON object with a score: the critic said
    everything the loop reads, and the cut fell in whatever it wrote after.
    """
    if stop_reason in REFUSED:
        return stop_reason
    if stop_reason != "max_tokens":
        return None
    if phase == "critique" and complete_critique:
        return None
    return "max_tokens"


def budget_cut(interrupted: str | None, lowered_by: str | None) -> str | None:
    """A step's interruption once its budget is known: a reply cut at a ``max_tokens``
    the budget lowered (``lowered_by``, ``budget:<scope>:<unit>``) was cut by that budget,
    not by the agent's own limit, so the run ends with the budget's reason."""
    return lowered_by if lowered_by is not None and interrupted == "max_tokens" else interrupted


def error_interruption(kind: str) -> str:
    """The interruption of a provider error of ``kind``: ``provider_error:<kind>``, or the
    kind itself when it is an outcome of :data:`REFUSED` (a 400 for a context overflow)."""
    return kind if kind in REFUSED else f"provider_error:{kind}"


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What the loop needs to know about one finished step."""

    phase: Phase
    round: int
    #: Why the agent stopped itself (``max_tokens``, ``provider_error:auth``...), or None;
    #: ``error`` for a failure of Duet itself, and :data:`REDIS_FULL`, fail the run.
    interrupted: str | None = None
    #: The critic's score, for critique steps.
    score: float | None = None

    @property
    def role(self) -> Role:
        return ROLE_OF[self.phase]


@dataclass(frozen=True, slots=True)
class LoopState:
    """A run as ``decide`` sees it."""

    max_rounds: int
    approval_threshold: float
    #: Finished steps, in order.
    steps: tuple[StepOutcome, ...] = ()
    cancelled: bool = False
    #: ``budget:<scope>:<unit>`` when a budget scope of the run has no room left.
    budget_blocked: str | None = None
    #: Plateau stop: a critique whose score rose less than this over the previous one
    #: ends the run (``max_rounds_reached``, reason :data:`PLATEAU`); None never stops.
    min_improvement: float | None = None


@dataclass(frozen=True, slots=True)
class Generate:
    """Round 0: the actor writes the first draft."""

    round: int = 0
    phase: Phase = "generate"


@dataclass(frozen=True, slots=True)
class Critique:
    """Round ``n``: the critic scores the current output."""

    round: int
    phase: Phase = "critique"


@dataclass(frozen=True, slots=True)
class Refine:
    """Round ``n``: the actor revises the output to address the critique."""

    round: int
    phase: Phase = "refine"


@dataclass(frozen=True, slots=True)
class Finish:
    """The run ends with ``status``; ``reason`` says why when it did not simply finish."""

    status: Status
    reason: str | None = None


Step = Generate | Critique | Refine
Action = Generate | Critique | Refine | Finish


def starts_round(state: LoopState) -> bool:
    """Whether the next action opens a round (so the budget must be checked first)."""
    if state.cancelled:
        return False
    if not state.steps:
        return True
    last = state.steps[-1]
    return last.interrupted is None and last.phase != "critique" and last.round < state.max_rounds


def decide(state: LoopState) -> Action:
    """The next action of a run: a step to run, or how it finishes."""
    if state.cancelled:
        return Finish("cancelled", "cancelled")
    if not state.steps:
        if state.budget_blocked:
            return Finish("interrupted", state.budget_blocked)
        return Generate()
    last = state.steps[-1]
    if last.interrupted and last.interrupted.startswith("budget:"):
        return Finish("interrupted", last.interrupted)
    if last.interrupted in FAILING:
        return Finish("failed", f"{last.role}:round_{last.round}:{last.interrupted}")
    if last.interrupted:
        return Finish("interrupted", f"{last.role}:round_{last.round}:{last.interrupted}")
    if last.phase == "critique":
        if last.score is not None and last.score >= state.approval_threshold:
            return Finish("approved")
        if _plateaued(state, last):
            return Finish("max_rounds_reached", PLATEAU)
        return Refine(last.round)
    next_round = last.round + 1
    if next_round > state.max_rounds:
        return Finish("max_rounds_reached")
    if state.budget_blocked:
        return Finish("interrupted", state.budget_blocked)
    return Critique(next_round)


def rerun_point(steps: tuple[StepOutcome, ...]) -> tuple[int, str | None]:
    """Where an interrupted run starts again once its cause is fixed: the transition to
    make again and the step to drop first (its last, when that step is what stopped it;
    a run stopped between steps, by a spent budget, drops none). Every other stored step
    is kept, so no call that completed is paid twice."""
    if steps and steps[-1].interrupted:
        last = steps[-1]
        return len(steps) - 1, step_key(last.phase, last.round)
    return len(steps), None


def _plateaued(state: LoopState, last: StepOutcome) -> bool:
    """Whether ``last``'s score rose less than ``min_improvement`` over the critique before
    (a rise of exactly ``min_improvement``, give or take float rounding, is enough)."""
    if state.min_improvement is None or last.score is None:
        return False
    before = [s.score for s in state.steps[:-1] if s.phase == "critique" and s.score is not None]
    rise = last.score - before[-1] if before else None
    return rise is not None and rise < state.min_improvement - SCORE_TOLERANCE
