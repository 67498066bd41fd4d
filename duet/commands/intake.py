"""Reading a batch's inputs for ``duet run`` and ``duet submit``: the config checked for
what only workers would notice, the inputs read and numbered, rejected ones listed, the
batch submitted with its rejections stored, and the worst case of a dry run."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from duet.commands.results import (
    Intake,
)
from duet.commands.support import (
    current_log_format,
    err,
    note,
    out,
    plain,
    print_whole,
    record,
    warn,
)
from duet.config import CacheConfig, ReviewConfig, load_config
from duet.intake.files import InputReader
from orchestration.core import url_credentials
from orchestration.core.agents import resolve_model
from orchestration.core.callcache import parse_ttl
from orchestration.core.errors import ConfigError
from orchestration.settings import get_settings

if TYPE_CHECKING:
    from orchestration.client.handles import BatchHandle
    from orchestration.core.architecture import LoopSpec


#: Rejected inputs listed on screen; the results file always has every one.
SHOWN_PROBLEMS = 20


def load_checked(
    config: Path,
    *,
    embedded: bool,
    vendor_batch: bool = False,
    cache: str | None = None,
    max_in_flight: int | None = None,
) -> ReviewConfig:
    """Load the config and check what only the worker side can check (sim options, keys);
    ``vendor_batch`` sends both agents' calls through the vendors' batch APIs."""
    return check_loaded(
        load_config(config),
        embedded=embedded,
        vendor_batch=vendor_batch,
        cache=cache,
        max_in_flight=max_in_flight,
    )


def check_loaded(
    cfg: ReviewConfig,
    *,
    embedded: bool,
    vendor_batch: bool = False,
    cache: str | None = None,
    max_in_flight: int | None = None,
) -> ReviewConfig:
    """:func:`load_checked` for a config already loaded (a built-in one, say); ``cache``
    (a TTL) turns the model-call cache on over the config's ``[cache]``;
    ``max_in_flight`` (``--max-in-flight``) is put over its ``[batch] max_in_flight``."""
    if vendor_batch:
        cfg = _with_vendor_batch(cfg)
    if max_in_flight is not None:
        batch = cfg.batch.model_copy(update={"max_in_flight": max_in_flight})
        cfg = cfg.model_copy(update={"batch": batch})
    if cache is not None:  # --cache [TTL]: over the config's [cache] ttl
        parse_ttl(cache, "--cache")
        section = cfg.cache or CacheConfig()
        cfg = cfg.model_copy(
            update={"cache": section.model_copy(update={"ttl": cache, "enabled": True})}
        )
    prompt_limit(cfg)
    spec = cfg.build_architecture().to_spec()
    for role in ("actor", "critic"):
        agent = getattr(spec, role)
        if agent.provider == "sim":
            from workers.providers.sim import parse_sim_model

            try:
                parse_sim_model(agent.model_name)
            except ConfigError as exc:
                raise ConfigError(f"{cfg.source}: {role}.model: {exc}") from None
        elif embedded:
            named = [agent.api_key_env, *url_credentials.variables(agent.base_url)]
            unset = [name for name in named if name and not os.environ.get(name)]
            if unset:
                verb = "is" if len(unset) == 1 else "are"
                raise ConfigError(
                    f"{cfg.source}: {role}: {' and '.join(unset)} {verb} not set, and the "
                    "embedded worker runs in this process; export it, or set DUET_REDIS_URL "
                    "to use a cluster"
                )
    return cfg


def _with_vendor_batch(cfg: ReviewConfig) -> ReviewConfig:
    """``cfg`` with ``execution = "vendor_batch"`` for the actor and the critic."""
    update = {}
    for role in ("actor", "critic"):
        section = getattr(cfg, role)
        if resolve_model(section.model)[0] not in ("openai", "anthropic"):
            raise ConfigError(
                f"--vendor-batch: {cfg.source}: {role}.model {section.model!r} has no vendor "
                "batch API (OpenAI and Anthropic models only)"
            )
        update[role] = section.model_copy(update={"execution": "vendor_batch"})
    return cfg.model_copy(update=update)


def _apply_rate_limits(cfg: ReviewConfig) -> None:
    """Store the config's ``[rate_limits]`` for the fleet, each on the endpoint of the
    config's agents of that model (the vendor's own when none names a ``base_url``), and
    say which limits already stored apply to its models though the config sets none."""
    from orchestration.core.ratelimit import limit_name
    from orchestration.state import connection
    from orchestration.state.ratelimits import rate_key, set_rate_limits, stored_rate_limits

    r = connection.get_redis()
    limits = cfg.build_rate_limits()
    named = Path(cfg.source).name
    spec = cfg.build_architecture().to_spec()
    agents = list(dict.fromkeys((spec.actor, spec.critic)))
    ours: set[str] = set()
    for model, limit in limits.items():
        model_key = rate_key(model)
        endpoints = [a.base_url for a in agents if f"{a.provider}:{a.model_name}" == model_key] or [
            None
        ]
        for base_url in dict.fromkeys(endpoints):
            set_rate_limits(r, {model: limit.model_copy(update={"source": named})}, base_url)
            ours.add(rate_key(model, base_url))
    stored = stored_rate_limits(r)
    for agent in agents:
        name = limit_name(agent.provider, agent.model_name, agent.base_url)
        if name in stored and name not in ours:
            source = stored[name].source or "an earlier config"
            warn(
                f"{name} keeps the fleet rate limit set by {source} "
                f"(duet limits show; duet limits clear {name} removes it)"
            )


def prompt_limit(cfg: ReviewConfig) -> int:
    """The longest prompt accepted: the config's ``[inputs] max_prompt_chars``, else the
    process cap ``DUET_MAX_PROMPT_CHARS``.

    Raises:
        ConfigError: the config asks for more than the cap (which would silently win).
    """
    cap = get_settings().max_prompt_chars
    wanted = cfg.inputs.max_prompt_chars
    if wanted is None:
        return cap
    if wanted > cap:
        raise ConfigError(
            f"{cfg.source}: inputs.max_prompt_chars: {wanted:,} is above this process's cap "
            f"of {cap:,} characters (DUET_MAX_PROMPT_CHARS); raise the cap "
            f"(export DUET_MAX_PROMPT_CHARS={wanted}) or lower the key"
        )
    _check_context_windows(cfg, wanted)
    return wanted


def _check_context_windows(cfg: ReviewConfig, chars: int) -> None:
    """Refuse a ``max_prompt_chars`` whose longest request overflows a model's context
    window: the actor's revision carries the input, its last output and the critique and
    gets a reply; the critic's review carries the input and the output (each output at
    its ``max_tokens``).

    Raises:
        ConfigError: naming the key, the model, its window and the most that fits.
    """
    from orchestration.core.capabilities import context_window, prompt_chars_fitting

    spec = cfg.build_architecture().to_spec()
    actor, critic = spec.actor, spec.critic
    loop_adds = {
        "actor": (actor, 2 * actor.max_tokens + critic.max_tokens),
        "critic": (critic, actor.max_tokens + critic.max_tokens),
    }
    for role, (agent, other) in loop_adds.items():
        window = context_window(agent.provider, agent.model_name)
        if window is not None and chars > (fits := prompt_chars_fitting(window, other)):
            raise ConfigError(
                f"{cfg.source}: inputs.max_prompt_chars: {chars:,} characters do not fit "
                f"the {role}'s model {agent.model_name} (a {window:,}-token context window, "
                f"{other:,} tokens of it for outputs at max_tokens); at most {fits:,}"
            )


def _reader(
    cfg: ReviewConfig,
    path: Path,
    intake: Intake,
    *,
    strict: bool,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    include_secrets: bool = False,
) -> InputReader:
    from duet.intake.skips import SkipRules

    limit = prompt_limit(cfg)
    return InputReader(
        path,
        prompt_column=cfg.inputs.prompt_column,
        id_column=cfg.inputs.id_column,
        max_prompt_chars=limit,
        max_line_bytes=cfg.inputs.max_line_bytes,
        on_problem=intake.on_problem,
        strict=strict,
        include=[*cfg.inputs.include, *include],
        exclude=[*cfg.inputs.exclude, *exclude],
        gitignore=cfg.inputs.gitignore,
        prompt_template=cfg.inputs.prompt_template,
        skips=SkipRules(include_secrets=include_secrets),
    )


class Reading:
    """The inputs read for one command: the reader, the intake and the first item."""

    def __init__(
        self,
        cfg: ReviewConfig,
        path: Path,
        intake: Intake,
        reader: Any = None,
        empty_ok: bool = False,
        **options: Any,
    ) -> None:
        self.path = path
        self.intake = intake
        #: An InputReader, or anything shaped like one (``duet.intake.git.GitChanges``).
        self.reader = reader if reader is not None else _reader(cfg, path, intake, **options)
        self.items = intake.items(self.reader)
        with err.status(plain(f"Reading {path}")):
            self.first = next(self.items, None)  # problems up to the first valid input
        if self.first is None:
            self._report()
            if not intake.rejected and not intake.carried and not intake.cached and not empty_ok:
                skipped = f" ({self._skipped()} skipped)" if self.reader.skipped else ""
                raise ConfigError(f"{path}: no inputs found{skipped}: nothing to run")

    def all_items(self) -> Iterable[dict[str, Any]]:
        return [] if self.first is None else itertools.chain([self.first], self.items)

    def _skipped(self) -> str:
        by = self.reader.skipped_by
        return ", ".join(f"{n} {kind}" for kind, n in sorted(by.items()))

    def _report(self) -> None:
        """List what was read but will not run (call once reading is over)."""
        if self.intake.rejected:
            show_problems([r["problem"] for r in self.intake.rejected])
        if self.reader.skipped:
            note(f"skipped {self.reader.skipped} file(s) in {self.path}: {self._skipped()}")
        if self.intake.cached:
            note(f"{len(self.intake.cached)} input(s) served from the cache: not run again")
        if self.intake.carried:
            note(
                f"{len(self.intake.carried)} input(s) already finished in the earlier results: not run again"
            )

    def done(self) -> None:
        if self.first is not None:
            self._report()


def submit_reading(cfg: ReviewConfig, reading: Reading) -> BatchHandle | None:
    """Submit the valid inputs as one batch and store its rejected inputs with it; None
    when there is nothing to submit."""
    from orchestration.state import batches, connection

    team = cfg.build_team()
    _apply_rate_limits(cfg)
    handle = None
    if reading.first is not None:
        with err.status(plain(f"Submitting {reading.path}")):
            handle = team.submit_batch(
                reading.all_items(),
                budget=cfg.build_budget(),
                max_in_flight=cfg.batch.max_in_flight,
            )
        record(
            f"batch {handle.batch_id} submitted: {len(reading.intake.run_index)} run(s)",
            batch_id=handle.batch_id,
        )
    reading.done()
    if handle is not None and reading.intake.rejected:
        batches.add_rejected(
            connection.get_redis(), handle.batch_id, reading.intake.stored_rejections()
        )
    return handle


def show_problems(problems: list[Any]) -> None:
    if current_log_format() == "json":
        for problem in problems:
            warn(f"input rejected: {problem.where}: {problem.reason}")
        return
    table = Table(
        title=f"{len(problems)} rejected input(s)", title_style="bold red", title_justify="left"
    )
    table.add_column("file:line", style="cyan", no_wrap=True)
    table.add_column("id", no_wrap=True)
    table.add_column("reason", style="red", no_wrap=True)
    for problem in problems[:SHOWN_PROBLEMS]:
        table.add_row(plain(problem.where), plain(problem.id or ""), plain(problem.reason))
    if len(problems) > SHOWN_PROBLEMS:
        table.caption = f"... and {len(problems) - SHOWN_PROBLEMS} more"
    print_whole(table, err)


def worst_case(spec: LoopSpec, prompt_bytes: int) -> dict[str, tuple[int, int, int]]:
    """The most one run can use, per role: ``(calls, input tokens, output tokens)``.

    Every run goes to its last round (1 + rounds actor calls, rounds critic calls); each
    call sees its instructions, the prompt and every earlier turn of the run (a turn is
    at most the prompt plus ``max_tokens``); a token is counted per UTF-8 byte, the upper
    bound the budget reservations use.
    """
    use = {"actor": [0, 0, 0], "critic": [0, 0, 0]}
    history = 0
    for n in range(1 + 2 * spec.max_rounds):
        role = "actor" if n % 2 == 0 else "critic"
        agent = getattr(spec, role)
        tally = use[role]
        tally[0] += 1
        tally[1] += len(agent.instructions.encode()) + prompt_bytes + history
        tally[2] += agent.max_tokens
        history += prompt_bytes + agent.max_tokens
    return {role: (c, i, o) for role, (c, i, o) in use.items()}


def print_dry_run(cfg: ReviewConfig, reading: Reading) -> None:
    """Print the worst case of the batch (every run to its last round) and send nothing."""
    from orchestration.core.pricing import cost_usd
    from orchestration.prices import price_for

    spec = cfg.build_architecture().to_spec()
    runs = calls = tokens_in = tokens_out = 0
    usd: float | None = 0.0
    prices = {role: price_for(getattr(spec, role)) for role in ("actor", "critic")}
    for item in reading.all_items():
        runs += 1
        for role, (n, used_in, used_out) in worst_case(spec, len(item["prompt"].encode())).items():
            calls, tokens_in, tokens_out = calls + n, tokens_in + used_in, tokens_out + used_out
            price = prices[role]
            usd = None if usd is None or price is None else usd + cost_usd(price, used_in, used_out)
    reading.done()
    rounds = spec.max_rounds
    table = Table(
        title="Dry run: worst case, nothing sent", title_justify="left", show_header=False
    )
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("runs", f"{runs:,}")
    table.add_row("rejected inputs", f"{len(reading.intake.rejected):,}")
    table.add_row("already finished", f"{len(reading.intake.carried):,}")
    table.add_row("model calls (at most)", f"{calls:,} (1 + 2 × {rounds} per run)")
    table.add_row("input tokens (at most)", f"{tokens_in:,}")
    table.add_row("output tokens (at most)", f"{tokens_out:,}")
    table.add_row(
        "cost (at most)", f"${usd:,.4f}" if usd is not None else "unknown: a model has no price"
    )
    budget = cfg.build_budget()
    if budget is not None and budget.max_usd is not None:
        table.add_row("batch budget", f"${budget.max_usd:,.2f}")
    out.print(table)
