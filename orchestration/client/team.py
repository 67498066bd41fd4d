"""Team: the public entry point that runs an ActorCritic loop on the fleet."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from orchestration.client import handles
from orchestration.client.backend import ensure_backend
from orchestration.client.handles import BatchHandle, RunHandle, enqueue, new_id
from orchestration.client.keeper import KeptBatch, server_state
from orchestration.client.served import served_from_cache
from orchestration.core import quoting
from orchestration.core.agents import Agent
from orchestration.core.architecture import (
    DEFAULT_APPROVAL_THRESHOLD,
    DEFAULT_KEEP,
    DEFAULT_MAX_ROUNDS,
    DEFAULT_PERSISTENT_SUBAGENTS,
    ActorCritic,
    Keep,
    LoopSettings,
)
from orchestration.core.budget import Budget, scope
from orchestration.core.callcache import CacheSpec, cache_spec
from orchestration.core.errors import ConfigError
from orchestration.core.jsonlimits import depth_reason, value_too_deep
from orchestration.core.memory import (
    DEFAULT_CONVERSATION_MAX_TOKENS,
    DEFAULT_CONVERSATION_TURNS,
    ConversationSettings,
    Memory,
)
from orchestration.core.results import RunResult
from orchestration.core.runcache import loop_cacheable
from orchestration.core.tools import Workspace
from orchestration.core.validation import checked
from orchestration.settings import get_settings
from orchestration.state.broker import visibility_timeout_of
from orchestration.state.gates import BATCH_FIELD
from orchestration.state.runs import RunRecord

if TYPE_CHECKING:
    from orchestration.state.budgets import ScopeState


class Team:
    """Runs an :class:`ActorCritic` as a distributed workflow.

    With ``DUET_REDIS_URL`` set, work goes to that cluster's workers. Without it, the
    first run starts an embedded Redis and an in-process worker (stopped at exit).

    Args:
        architecture: the loop to run.
        model: the coordinator's model (no call is made with it); part of the team's
            identity.
        budget: limits for each run.
        global_budgets: names of fleet-wide budgets every run is also charged to.
        conversations: the team's name and conversation settings (defaults when None).
        instructions: the coordinator's instructions (the nested form's outer agent);
            part of the team's identity.
        max_in_flight: at most this many runs of each batch started and not finished at
            any moment, fleet-wide (None: no cap); ``submit_batch`` may override it.
    """

    def __init__(
        self,
        architecture: ActorCritic,
        *,
        model: str | None = None,
        budget: Budget | None = None,
        global_budgets: Iterable[str] = (),
        conversations: ConversationSettings | None = None,
        instructions: str | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        self.architecture = architecture
        #: Each batch's cap on runs in flight (not part of the team's identity).
        self.max_in_flight = checked_in_flight(max_in_flight, "max_in_flight")
        #: The coordinator's model: no call is made with it (the coordinator is a Celery
        #: task), but with ``instructions`` (the nested form's outer agent) it is part of
        #: the team's identity, so it keys the team's conversations.
        self.model = model
        coordinator = (
            json.dumps({"model": model, "instructions": instructions}, sort_keys=True)
            if model is not None or instructions is not None
            else None
        )
        #: What runs of this team run: the loop, its team id and conversation settings.
        self.spec = architecture.to_spec(conversations, coordinator=coordinator)
        #: Limits for each run of this team (scope ``run:<id>``).
        self.budget = budget
        #: Named fleet-wide budgets (``global:<name>``) every run of this team is charged to.
        self.global_budgets = tuple(scope("global", name) for name in global_budgets)
        self._check_priced(budget)
        # A call the broker's visibility timeout does not outlast: refused now, clearly.
        visibility = visibility_timeout_of(get_settings())
        if visibility is not None:
            self.spec.check_timeouts(visibility)

    def _check_priced(self, budget: Budget | None) -> None:
        """A USD limit on a model with no known price would never trip: refuse it now (an
        agent's own budget, on that agent's model)."""
        from orchestration.prices import require_price

        if budget is not None and budget.max_usd is not None:
            require_price(self.spec.actor)
            require_price(self.spec.critic)
        for agent in (self.spec.actor, self.spec.critic):
            if agent.budget is not None and agent.budget.max_usd is not None:
                require_price(agent)

    def _agent_limits(self, records: Iterable[RunRecord]) -> dict[str, Budget]:
        """The limits of the agents' own scopes in each run (``actor:<run id>``...)."""
        limits: dict[str, Budget] = {}
        for role, agent in (("actor", self.spec.actor), ("critic", self.spec.critic)):
            if agent.budget is not None:
                limits.update((scope(role, r.run_id), agent.budget) for r in records)
        return limits

    @classmethod
    def actor_critic(
        cls,
        *,
        actor: Agent,
        critic: Agent,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        approval_threshold: float = DEFAULT_APPROVAL_THRESHOLD,
        critique_template: str | None = None,
        refine_template: str | None = None,
        persistent_subagents: bool = DEFAULT_PERSISTENT_SUBAGENTS,
        model: str | None = None,
        budget: Budget | None = None,
        global_budgets: Iterable[str] = (),
        name: str | None = None,
        memory: Memory | None = None,
        conversation_turns: int = DEFAULT_CONVERSATION_TURNS,
        conversation_max_tokens: int = DEFAULT_CONVERSATION_MAX_TOKENS,
        cache: CacheSpec | bool | str | float | None = None,
        keep: Keep = DEFAULT_KEEP,
        min_improvement: float | None = None,
        max_in_flight: int | None = None,
    ) -> Team:
        """A team whose actor and critic review each other's work.

        Args:
            persistent_subagents: actor and critic each keep a conversation per team and
                user across rounds and runs (stored in Redis, so any worker continues it).
            model: the coordinator's model; no call is made with it (the coordinator is
                a task, not a model), but it is part of the team's identity.
            budget: limits for each run (tokens, USD, calls), a hard cap fleet-wide.
            global_budgets: names of fleet-wide budgets (``duet budget set global:NAME``)
                that every run of this team is also charged to.
            name: the team's name (``"code-review"``): its conversations are its own.
                Unnamed, a team is identified by its actor, critic, settings and model.
            memory: whose conversation a run continues: ``"per_user"`` (a user's runs
                share it), ``"per_run"`` (each run its own), or None: per user for
                ``run`` / ``submit`` with a ``user_id``, per run for each batch input.
            conversation_turns: turns kept per conversation (oldest dropped first).
            conversation_max_tokens: about how many tokens of history a call carries;
                earlier runs' oldest turns are dropped first, the run's own turns kept.
            cache: serve repeated model calls from the model-call cache: True, a TTL
                (``"7d"``) or a :class:`~orchestration.core.callcache.CacheSpec`.
            keep: ``"last"`` (default) returns each run's last revision; ``"best"`` its
                highest-scored one, with ``output_round`` naming the round that wrote it.
            min_improvement: end a run (``max_rounds_reached``, reason ``plateau``) when
                a critique's score rose less than this over the one before.
            max_in_flight: at most this many runs of each batch started and not finished
                at any moment, across the whole fleet (None: as many as workers take).
        """
        settings = checked(
            LoopSettings,
            {
                "max_rounds": max_rounds,
                "approval_threshold": approval_threshold,
                "critique_template": critique_template,
                "refine_template": refine_template,
                "persistent_subagents": persistent_subagents,
                "name": name,
                "memory": memory,
                "conversation_turns": conversation_turns,
                "conversation_max_tokens": conversation_max_tokens,
                "cache": cache_spec(cache),
                "keep": keep,
                "min_improvement": min_improvement,
            },
        )
        return cls(
            ActorCritic.from_settings(actor=actor, critic=critic, settings=settings),
            model=model,
            budget=budget,
            global_budgets=global_budgets,
            conversations=settings,
            max_in_flight=max_in_flight,
        )

    # --- submitting -------------------------------------------------------
    def review_tree(self, source: str, commit: str) -> None:
        """Let the agents' tools read ``source`` (a repository path every worker sees, or a
        git URL they fetch from) at ``commit`` (a full or abbreviated hash): the runs
        submitted from now on carry it in their spec."""
        self.spec = self.spec.model_copy(
            update={"workspace": checked(Workspace, {"source": source, "commit": commit})}
        )

    def _freeze_tools(self) -> None:
        """Freeze the schemas of the agents' tools in the spec, as the workers publish
        them (refusing a tool no worker knows); nothing for agents without tools."""
        if (self.spec.actor.tools or self.spec.critic.tools) and not (
            self.spec.actor.tool_specs or self.spec.critic.tool_specs
        ):
            ensure_backend()
            self.spec = handles.freeze_tools(self.spec)

    def _record(
        self,
        prompt: Any,
        *,
        where: str,
        user_id: str | None = None,
        batch_id: str | None = None,
        input_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        run_budget: bool = False,
        batch_budget: bool = False,
        gate: int | None = None,
    ) -> RunRecord:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{where}: prompt must be a non-empty string")
        limit = get_settings().max_prompt_chars
        if len(prompt) > limit:
            raise ConfigError(
                f"{where}: prompt is {len(prompt):,} characters, over the limit of {limit:,} "
                "(DUET_MAX_PROMPT_CHARS)"
            )
        if metadata is not None and value_too_deep(metadata):
            raise ConfigError(f"{where}: metadata {depth_reason()}")
        run_id = new_id()
        scopes = [scope("run", run_id)] if run_budget else []
        if batch_budget and batch_id:
            scopes.append(scope("batch", batch_id))
        if user_id:
            scopes.append(scope("user", user_id))
        scopes.extend(self.global_budgets)
        # The agents' own budgets: each charged by its role's calls alone.
        scopes.extend(
            scope(role, run_id)
            for role, agent in (("actor", self.spec.actor), ("critic", self.spec.critic))
            if agent.budget is not None
        )
        return RunRecord(
            run_id=run_id,
            spec_id=self.spec.spec_id,
            prompt=prompt,
            user_id=user_id,
            batch_id=batch_id,
            input_id=input_id,
            metadata=metadata,
            budget_scopes=tuple(scopes),
            # Unpredictable, as the reviewed text must not be able to guess it.
            boundary=secrets.token_hex(quoting.TOKEN_BYTES),
            gate=gate,
        )

    def submit(
        self,
        prompt: str,
        *,
        user_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        budget: Budget | None = None,
    ) -> RunHandle:
        """Queue one run and return at once; ``budget`` overrides the team's per-run budget."""
        budget = budget or self.budget
        self._check_priced(budget)
        self._freeze_tools()
        record = self._record(
            prompt,
            where="submit",
            user_id=user_id,
            metadata=metadata,
            run_budget=budget is not None,
        )
        ensure_backend()
        limits = self._agent_limits([record])
        if budget is not None:
            limits[record.budget_scopes[0]] = budget
        if limits:
            handles.set_budgets(limits)
        enqueue(self.spec, [record])
        return RunHandle(record.run_id)

    def submit_batch(
        self,
        items: Iterable[str | Mapping[str, Any]],
        *,
        batch_id: str | None = None,
        budget: Budget | None = None,
        max_in_flight: int | None = None,
        cache: bool = True,
    ) -> BatchHandle:
        """Queue many runs as one batch: prompts, or dicts ``{id, prompt, user_id, metadata}``.

        ``budget`` caps the whole batch (scope ``batch:<id>``); the team's per-run budget
        still applies to each run. ``max_in_flight``: at most this many of the batch's
        runs started and not finished at any moment, fleet-wide (default: the team's).
        ``cache``: with the team's cache on, an input whose run finished well before (same
        loop, same prompt, within the TTL) gets that result again, marked ``cached`` and
        billed nothing, without a task being sent for it; False runs every input.

        Every item is checked before anything is written, so a bad item refuses the batch
        with a message naming it (the CLI reports bad inputs and proceeds with the rest).
        """
        batch_id = batch_id or new_id()
        self._check_priced(budget)
        self._freeze_tools()
        gate = checked_in_flight(max_in_flight, "submit_batch: max_in_flight")
        gate = gate or self.max_in_flight
        per_run = self.budget is not None
        in_batch = budget is not None
        records = []
        for n, item in enumerate(items):
            if isinstance(item, str):
                records.append(
                    self._record(
                        item,
                        where=f"item {n}",
                        batch_id=batch_id,
                        input_id=str(n),
                        run_budget=per_run,
                        batch_budget=in_batch,
                        gate=gate,
                    )
                )
                continue
            if not isinstance(item, Mapping):
                raise ConfigError(
                    f"item {n}: expected a prompt string or a mapping, got {type(item).__name__}"
                )
            input_id = item.get("id", item.get("custom_id", n))
            records.append(
                self._record(
                    item.get("prompt"),
                    where=f"item {n} (id {input_id!r})",
                    user_id=item.get("user_id"),
                    batch_id=batch_id,
                    input_id=str(input_id),
                    metadata=item.get("metadata"),
                    run_budget=per_run,
                    batch_budget=in_batch,
                    gate=gate,
                )
            )
        ensure_backend()
        limits: dict[str, Budget] = {}
        if budget is not None:
            limits[scope("batch", batch_id)] = budget
        if self.budget is not None:
            limits.update((r.budget_scopes[0], self.budget) for r in records)
        limits.update(self._agent_limits(records))
        handles.set_budgets(limits)
        if cache and loop_cacheable(self.spec):
            records = served_from_cache(self.spec, records)
        batch = {
            "batch_id": batch_id,
            "spec_id": self.spec.spec_id,
            "total": len(records),
            "done": 0,
            "created_at": repr(time.time()),
            "budgeted": int(budget is not None),
        }
        if gate:
            batch[BATCH_FIELD] = gate
        kept = KeptBatch(self.spec, records, batch, limits, server_state(handles.store().r))
        enqueue(self.spec, records, batch=batch)
        return BatchHandle(batch_id, kept)

    # --- running ----------------------------------------------------------
    def run_sync(
        self,
        prompt: str,
        *,
        user_id: str | None = None,
        timeout: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        budget: Budget | None = None,
    ) -> RunResult:
        """Run the loop on ``prompt`` and wait for its result."""
        handle = self.submit(prompt, user_id=user_id, metadata=metadata, budget=budget)
        return handle.result(timeout=timeout)

    async def run(
        self,
        prompt: str,
        *,
        user_id: str | None = None,
        timeout: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        budget: Budget | None = None,
    ) -> RunResult:
        """Async form of :meth:`run_sync` (the wait runs in a thread)."""
        return await asyncio.to_thread(
            self.run_sync,
            prompt,
            user_id=user_id,
            timeout=timeout,
            metadata=metadata,
            budget=budget,
        )


def checked_in_flight(value: Any, where: str) -> int | None:
    """``max_in_flight`` as given (None: no cap), or a one-line error naming ``where``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: must be a whole number of runs, 1 or more; got {value!r}")
    return value


# --- the fleet's budgets, on the embedded default too ---------------------------------
# The same functions as in ``handles``, starting the embedded default first when no
# DUET_REDIS_URL is set (as ``Team.run`` does), so they work on a laptop with nothing set.
def set_budgets(limits: Mapping[str, Budget]) -> None:
    """Store limits for budget scopes (``{"global:team-a": Budget(max_usd=50)}``).

    Scopes are ``run:<id>``, ``batch:<id>``, ``user:<id>`` and ``global:<name>``.
    """
    ensure_backend()
    handles.set_budgets(limits)


def get_budget(scope_name: str) -> ScopeState:
    """Limits, spent, reserved and remaining of one scope (e.g. ``"user:alice"``)."""
    ensure_backend()
    return handles.get_budget(scope_name)


def reset_budget(scope_name: str) -> None:
    """Zero a scope's spending (its limits stay)."""
    ensure_backend()
    handles.reset_budget(scope_name)


def list_budgets(prefix: str = "") -> list[str]:
    """Scopes with budget data whose name starts with ``prefix``."""
    ensure_backend()
    return handles.list_budgets(prefix)
