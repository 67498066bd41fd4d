"""``duet``: batch review from the terminal.

``duet run`` does a whole batch in one command: on an embedded Redis with an in-process
worker when ``DUET_REDIS_URL`` is unset, else on that cluster. The other commands work
against a cluster: submit a batch, watch it, fetch its results, inspect one run, render
a report, list batches, cancel, resume, and start worker pools.

Exit codes, the same for every command: 0 every input was accepted and every run
finished (approved or out of rounds) without an interruption, failure or cancellation;
1 otherwise (some input rejected, some run interrupted, failed or cancelled, a timeout);
2 bad usage, a bad config or no inputs; 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from duet.cli_budget import budget_app
from duet.cli_progress import (
    COLOURS,
    LOG_EVERY_S,
    ProgressView,
    WorkerWatch,
    duration,
    follow,
)
from duet.cli_results import (
    Intake,
    ResultsFile,
    collect,
    finished_records,
    read_records,
    write_outputs,
)
from duet.cli_support import (
    INTERRUPTED,
    OK,
    SOME_FAILED,
    clean,
    connect,
    current_log_format,
    err,
    error,
    fails_cleanly,
    note,
    out,
    plain,
    record,
    use_log_format,
    warn,
)
from duet.config import ReviewConfig, load_config
from duet.inputs import InputReader
from duet.report import (
    FINISHED_WELL,
    LABELS,
    OUTCOMES,
    Summary,
    by_index,
    rejected_record,
    render_report,
    result_record,
)
from orchestration.core.agents import resolve_model
from orchestration.core.errors import ConfigError, RunTimeout
from orchestration.settings import get_settings

if TYPE_CHECKING:
    from orchestration.client.handles import BatchHandle
    from orchestration.core.architecture import LoopSpec
    from orchestration.core.results import RunResult

#: Rejected inputs listed on screen; the results file always has every one.
SHOWN_PROBLEMS = 20
#: Interruption reasons listed in the summary (most frequent first).
SHOWN_REASONS = 5

app = typer.Typer(
    name="duet",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            out.print(f"duet {version('duet')}")
        except PackageNotFoundError:  # a source checkout that was never installed
            out.print("duet (not installed)")
        raise typer.Exit(OK)


@app.callback(
    epilog="Example: duet run examples/review.toml --input examples/inputs.jsonl "
    "--output results.jsonl"
)
def _duet(
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            help="Messages on stderr as `text` or `json` (one JSON object per line with the "
            "batch and run ids; passed on to `duet worker`). Default: DUET_LOG_FORMAT or text.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Review many inputs with an actor model and a critic model, on a Celery fleet.

    Without DUET_REDIS_URL, `duet run` starts an embedded Redis and an in-process
    worker; with it, every command works against that cluster.
    """
    chosen = log_format or os.environ.get("DUET_LOG_FORMAT") or "text"
    if chosen not in ("text", "json"):
        raise typer.BadParameter(f"{chosen!r}: choose text or json", param_hint="--log-format")
    use_log_format(chosen)


# --- config, backend, inputs ------------------------------------------------------
def _load(config: Path, *, embedded: bool, vendor_batch: bool = False) -> ReviewConfig:
    """Load the config and check what only the worker side can check (sim options, keys);
    ``vendor_batch`` sends both agents' calls through the vendors' batch APIs."""
    cfg = load_config(config)
    if vendor_batch:
        cfg = _with_vendor_batch(cfg)
    spec = cfg.build_architecture().to_spec()
    for role in ("actor", "critic"):
        agent = getattr(spec, role)
        if agent.provider == "sim":
            from workers.providers.sim import parse_sim_model

            try:
                parse_sim_model(agent.model_name)
            except ConfigError as exc:
                raise ConfigError(f"{cfg.source}: {role}.model: {exc}") from None
        elif embedded and agent.api_key_env and not os.environ.get(agent.api_key_env):
            raise ConfigError(
                f"{cfg.source}: {role}: {agent.api_key_env} is not set, and the embedded worker "
                "runs in this process; export it, or set DUET_REDIS_URL to use a cluster"
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
    limits = cfg.build_rate_limits()
    if limits:
        from orchestration.state import connection
        from orchestration.state.ratelimits import set_rate_limits

        set_rate_limits(connection.get_redis(), limits)


def _reader(
    cfg: ReviewConfig,
    path: Path,
    intake: Intake,
    *,
    strict: bool,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> InputReader:
    limit = get_settings().max_prompt_chars
    if cfg.inputs.max_prompt_chars is not None:
        limit = min(limit, cfg.inputs.max_prompt_chars)
    return InputReader(
        path,
        prompt_column=cfg.inputs.prompt_column,
        id_column=cfg.inputs.id_column,
        max_prompt_chars=limit,
        on_problem=intake.on_problem,
        strict=strict,
        include=[*cfg.inputs.include, *include],
        exclude=[*cfg.inputs.exclude, *exclude],
        gitignore=cfg.inputs.gitignore,
        prompt_template=cfg.inputs.prompt_template,
    )


class _Reading:
    """The inputs read for one command: the reader, the intake and the first item."""

    def __init__(self, cfg: ReviewConfig, path: Path, intake: Intake, **options: Any) -> None:
        self.path = path
        self.intake = intake
        self.reader = _reader(cfg, path, intake, **options)
        self.items = intake.items(self.reader)
        with err.status(plain(f"Reading {path}")):
            self.first = next(self.items, None)  # problems up to the first valid input
        if self.first is None:
            self._report()
            if not intake.rejected and not intake.carried:
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
            _show_problems([r["problem"] for r in self.intake.rejected])
        if self.reader.skipped:
            note(f"skipped {self.reader.skipped} file(s) in {self.path}: {self._skipped()}")
        if self.intake.carried:
            note(
                f"{len(self.intake.carried)} input(s) already finished in the earlier results: not run again"
            )

    def done(self) -> None:
        if self.first is not None:
            self._report()


def _submit(cfg: ReviewConfig, reading: _Reading) -> BatchHandle | None:
    """Submit the valid inputs as one batch and store its rejected inputs with it; None
    when there is nothing to submit."""
    from orchestration.state import batches, connection

    team = cfg.build_team()
    _apply_rate_limits(cfg)
    handle = None
    if reading.first is not None:
        with err.status(plain(f"Submitting {reading.path}")):
            handle = team.submit_batch(reading.all_items(), budget=cfg.build_budget())
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


def _show_problems(problems: list[Any]) -> None:
    if current_log_format() == "json":
        for problem in problems:
            warn(f"input rejected: {problem.where}: {problem.reason}")
        return
    table = Table(
        title=f"{len(problems)} rejected input(s)", title_style="bold red", title_justify="left"
    )
    table.add_column("file:line", style="cyan", no_wrap=True)
    table.add_column("id")
    table.add_column("reason", style="red")
    for problem in problems[:SHOWN_PROBLEMS]:
        table.add_row(plain(problem.where), plain(problem.id or ""), plain(problem.reason))
    if len(problems) > SHOWN_PROBLEMS:
        table.caption = f"... and {len(problems) - SHOWN_PROBLEMS} more"
    err.print(table)


def _batch(batch_id: str) -> BatchHandle:
    """A handle on an existing batch (LookupError when there is none)."""
    from orchestration.client.handles import BatchHandle

    handle = BatchHandle(batch_id)
    handle.progress()
    return handle


def _spec_of(handle: BatchHandle) -> LoopSpec | None:
    from orchestration.client.handles import store
    from orchestration.state import keys

    spec_id = store().r.hget(keys.batch(handle.batch_id), "spec_id")
    try:
        return store().load_spec(spec_id) if spec_id else None
    except LookupError:
        return None


def _worker_watch() -> WorkerWatch | None:
    """On a cluster, a watch on which queues have no worker (None on the embedded default)."""
    if not get_settings().redis_url:
        return None
    from orchestration.client.handles import queues_without_workers

    return WorkerWatch(queues_without_workers).start()


def _batch_records(handle: BatchHandle, timeout: float | None = None) -> Iterable[dict[str, Any]]:
    """A batch's records in input order, its stored rejected inputs in their places,
    each run's as soon as it (and those before it) finished."""
    spec = _spec_of(handle)
    rejected = handle.rejected()
    taken = {r["index"] for r in rejected}
    pending = iter(rejected)
    nxt = next(pending, None)
    index = 0
    for result in handle.results(timeout=timeout):
        while index in taken:
            index += 1
        while nxt is not None and nxt["index"] < index:
            yield rejected_record(nxt, batch_id=handle.batch_id)
            nxt = next(pending, None)
        yield result_record(result, index=index, spec=spec)
        index += 1
    while nxt is not None:
        yield rejected_record(nxt, batch_id=handle.batch_id)
        nxt = next(pending, None)


# --- summary and exit codes --------------------------------------------------------------
def _summary_table(summary: Summary, wall_s: float | None = None) -> Table:
    table = Table(title="Summary", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for outcome in OUTCOMES:
        table.add_row(LABELS[outcome], Text(str(summary.counts[outcome]), style=COLOURS[outcome]))
    table.add_row("inputs", str(summary.total))
    mean = summary.mean_rounds
    table.add_row("mean rounds", f"{mean:.2f}" if mean is not None else "-")
    table.add_row(
        "tokens", f"{summary.tokens:,} ({summary.input_tokens:,} in, {summary.output_tokens:,} out)"
    )
    table.add_row("model calls", f"{summary.calls:,}")
    table.add_row("cost", f"${summary.usd:.4f}")
    if wall_s is not None:
        table.add_row("wall time", duration(wall_s))
    for n, (why, count) in enumerate(summary.reasons.most_common(SHOWN_REASONS)):
        table.add_row("why not" if n == 0 else "", plain(f"{count} × {why}", style="magenta"))
    return table


def _exit_for(summary: Summary) -> typer.Exit:
    return typer.Exit(OK if summary.ok and summary.total else SOME_FAILED)


def _exit_for_progress(p: dict[str, Any]) -> typer.Exit:
    well = all(s in FINISHED_WELL for s, n in p["counts"].items() if n)
    return typer.Exit(OK if well and not p.get("rejected") else SOME_FAILED)


def _select(
    records: Iterable[dict[str, Any]], status: list[str] | None
) -> Iterable[dict[str, Any]]:
    return records if not status else (r for r in records if r.get("status") in status)


# --- arguments shared by commands -------------------------------------------------------
ConfigArg = Annotated[
    Path,
    typer.Argument(help="Review config (TOML).", exists=True, dir_okay=False, show_default=False),
]
InputOpt = Annotated[
    Path,
    typer.Option(
        "--input", "-i", exists=True, show_default=False,
        help="Inputs: a JSONL file, a CSV file, or a directory (one input per file).",
    ),
]  # fmt: skip
IncludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--include", metavar="GLOB",
        help="Directory input: read only files matching this glob (repeat for more), e.g. '*.py'.",
    ),
]  # fmt: skip
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude", metavar="GLOB",
        help="Directory input: leave out files or folders matching this glob (repeatable).",
    ),
]  # fmt: skip
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict", help="Refuse the whole batch (exit 2) if any input is bad, listing every one.",
    ),
]  # fmt: skip
VendorBatchOpt = Annotated[
    bool,
    typer.Option(
        "--vendor-batch",
        help="Send both agents' calls through the vendors' batch APIs (OpenAI Batch, "
        "Anthropic Message Batches): about half the price, answers within the vendors' "
        "window (up to 24 h); each round of the batch goes out together.",
    ),
]  # fmt: skip
LogEveryOpt = Annotated[
    float,
    typer.Option(
        "--log-every", min=0.1, metavar="SECONDS",
        help="When stderr is not a terminal: one progress line every SECONDS.",
    ),
]  # fmt: skip
StatusOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--status", metavar="STATUS",
        help="Only records with this status (repeatable): approved, max_rounds_reached, "
        "interrupted, failed, cancelled, rejected.",
    ),
]  # fmt: skip
BatchArg = Annotated[
    str, typer.Argument(help="Batch id (printed by `duet submit`).", show_default=False)
]
RunArg = Annotated[
    str, typer.Argument(help="Run id (the run_id field of a result).", show_default=False)
]
TimeoutOpt = Annotated[
    float | None, typer.Option("--timeout", help="Give up after this many seconds (exit 1).")
]


def _check_status(status: list[str] | None) -> None:
    unknown = sorted(set(status or ()) - set(OUTCOMES))
    if unknown:
        raise ConfigError(
            f"--status: unknown status {', '.join(unknown)}; choose from {', '.join(OUTCOMES)}"
        )


# --- commands ---------------------------------------------------------------------------
@app.command(
    epilog="Example: duet run examples/review.toml --input examples/inputs.jsonl --output results.jsonl"
)
@fails_cleanly
def run(
    config: ConfigArg,
    input: InputOpt,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", dir_okay=False,
            help="Results file, one record per input: JSONL, or CSV when the name ends in .csv. "
            "Each record is written as its run finishes; the file is in input order at the "
            "end. Default: INPUT-NAME.results.jsonl in the current directory.",
        ),
    ] = None,
    strict: StrictOpt = False,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    resume_from: Annotated[
        Path | None,
        typer.Option(
            "--resume-from", exists=True, dir_okay=False, metavar="RESULTS",
            help="A results file of an earlier run: inputs it has approved or out of rounds "
            "are not run again (their records are copied); the others run.",
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Run only the first N valid inputs.")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Read the inputs and print the worst case (calls, tokens, USD); send nothing.",
        ),
    ] = False,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir", file_okay=False, metavar="DIR",
            help="Also write each approved output to DIR/<id> (a directory input's relative "
            "path: the reviewed tree is mirrored).",
        ),
    ] = None,
    log_every: LogEveryOpt = LOG_EVERY_S,
    vendor_batch: VendorBatchOpt = False,
) -> None:  # fmt: skip
    """Review every input and wait for the results, with live progress.

    Runs on the cluster in DUET_REDIS_URL or, when it is unset, on an embedded Redis with
    an in-process worker that stop when the command ends. Bad inputs are listed and
    written to the results file with status "rejected"; the others run.

    Ctrl-C: on the embedded default, cancels the batch and keeps the finished records
    (rerun with --resume-from to skip them); on a cluster, stops waiting at once and
    leaves the batch running.

    Exit code 0 when every input was accepted and every run finished without an
    interruption or failure; 1 otherwise; 2 for a bad config, bad usage or no inputs;
    130 after Ctrl-C.
    """
    started = time.monotonic()
    embedded = not get_settings().redis_url
    cfg = _load(config, embedded=embedded, vendor_batch=vendor_batch)
    target = output or Path(f"{input.name.rsplit('.', 1)[0]}.results.jsonl")
    finished = finished_records(resume_from) if resume_from else None
    intake = Intake(finished, limit)
    options = {"strict": strict, "include": include or (), "exclude": exclude or ()}
    if dry_run:
        reading = _Reading(cfg, input, intake, **options)
        _dry_run(cfg, reading)
        return
    connect(embedded_ok=True)
    reading = _Reading(cfg, input, intake, **options)
    handle = _submit(cfg, reading)
    sink = ResultsFile(target)
    interrupted = False
    try:
        for carried in intake.carried:
            sink.write(carried)
        for r in intake.rejected:
            sink.write(rejected_record(r, batch_id=handle.batch_id if handle else None))
        if handle is None:
            warn("no valid inputs: nothing to run")
        else:
            interrupted = _collect_while_watching(
                handle, sink, intake.run_index, cfg.build_architecture().to_spec(),
                embedded=embedded, target=target, log_every=log_every,
            )  # fmt: skip
    finally:
        sink.finish()
    if handle is not None:
        record(f"batch {handle.batch_id} finished: results in {target}", batch_id=handle.batch_id)
    out.print(_summary_table(sink.summary, time.monotonic() - started))
    out.print(plain(f"results: {target}"))
    if output_dir is not None:
        _write_output_dir(read_records(target), output_dir)
    raise typer.Exit(INTERRUPTED) if interrupted else _exit_for(sink.summary)


def _write_output_dir(records: Iterable[dict[str, Any]], folder: Path) -> None:
    written, refused = write_outputs(records, folder)
    out.print(plain(f"approved outputs: {written} file(s) in {folder}"))
    if refused:
        warn(
            f"{len(refused)} id(s) are not a path inside {folder}, not written: {', '.join(refused[:5])}"
        )


def _collect_while_watching(
    handle: BatchHandle,
    sink: ResultsFile,
    run_index: list[int],
    spec: LoopSpec,
    *,
    embedded: bool,
    target: Path,
    log_every: float,
) -> bool:
    """Write records as runs finish while showing progress; True after Ctrl-C."""
    stop = threading.Event()
    collected = threading.Event()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            collect(handle, sink, run_index, spec, stop)
        except BaseException as exc:  # re-raised in the main thread
            failure.append(exc)
        finally:
            collected.set()

    threading.Thread(target=work, name="duet-results", daemon=True).start()

    def finished(_: dict[str, Any], wait_s: float) -> bool:
        return collected.wait(wait_s)

    workers = _worker_watch()
    view = ProgressView(workers)
    batch = handle.batch_id
    try:
        # Inside the try: from this line on, Ctrl-C is handled (the CLI tests wait for it).
        note(f"batch {batch}: {len(run_index)} run(s), results -> {target}")
        follow(handle, view, finished, log_every=log_every)
    except KeyboardInterrupt:
        if not embedded:
            stop.set()
            warn(
                f"stopped waiting; batch {batch} keeps running on the cluster. Cancel it: "
                f"duet cancel {batch}; follow it: duet watch {batch}; fetch its results: "
                f"duet results {batch} -o FILE"
            )
            return True
        handle.cancel()
        warn(
            "cancelling: runs stop after their current step (Ctrl-C again to quit now); "
            f"rerun with --resume-from {target} to skip the finished inputs"
        )
        try:
            follow(handle, view, finished, log_every=log_every)
        except KeyboardInterrupt:
            stop.set()
        return True
    finally:
        if workers is not None:
            workers.stop()
    collected.wait()
    if failure:
        raise failure[0]
    return False


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


def _dry_run(cfg: ReviewConfig, reading: _Reading) -> None:
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


@app.command(epilog="Example: BATCH=$(duet submit examples/review.toml -i examples/inputs.jsonl)")
@fails_cleanly
def submit(
    config: ConfigArg,
    input: InputOpt,
    rejected_to: Annotated[
        Path | None,
        typer.Option("--rejected", dir_okay=False, help="Also write rejected inputs here (JSONL)."),
    ] = None,
    strict: StrictOpt = False,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    vendor_batch: VendorBatchOpt = False,
) -> None:
    """Queue every input on the cluster and print the batch id; returns at once.

    Needs DUET_REDIS_URL (an embedded cluster would stop with the command). Follow the
    batch with `duet watch`, fetch it with `duet results`. Rejected inputs are listed
    and stored with the batch (`duet results` and the report show them).

    Exit code 0 when every input was queued; 1 when some were rejected (the others are
    queued and the batch id is printed all the same); 2 for a bad config, no inputs, or
    --strict with a bad input (nothing queued).
    """
    connect()
    cfg = _load(config, embedded=False, vendor_batch=vendor_batch)
    intake = Intake()
    reading = _Reading(
        cfg, input, intake, strict=strict, include=include or (), exclude=exclude or ()
    )
    handle = _submit(cfg, reading)
    if rejected_to is not None:
        with rejected_to.open("w", encoding="utf-8") as sink:
            for r in intake.rejected:
                sink.write(json.dumps(rejected_record(r), ensure_ascii=False) + "\n")
    if handle is None:
        raise ConfigError(f"{input}: every input was rejected: nothing queued")
    from orchestration.client.handles import queues_without_workers

    idle = queues_without_workers()
    if idle:
        warn(
            f"no worker is consuming queue {', '.join(idle)}: the batch waits until one "
            "starts (duet worker)"
        )
    note(f"queued {len(intake.run_index)} run(s); follow with: duet watch {handle.batch_id}")
    out.print(handle.batch_id, soft_wrap=True)
    raise typer.Exit(SOME_FAILED if intake.rejected else OK)


@app.command(epilog="Example: duet watch 4c9e34663fac4c9d8513fd84d3ff8b17")
@fails_cleanly
def watch(batch: BatchArg, log_every: LogEveryOpt = LOG_EVERY_S) -> None:
    """Show a batch's progress until it finishes: done/total, outcomes, spend, rate, ETA,
    and what it waits on (a rate limit, a spent budget, no worker on a queue).

    Ctrl-C stops watching (exit 130) and leaves the batch running. Exit code 0 when every
    input was accepted and every run finished well, else 1.
    """
    connect()
    handle = _batch(batch)

    def finished(p: dict[str, Any], wait_s: float) -> bool:
        if p["done"] >= p["total"]:
            return True
        time.sleep(wait_s)  # the screen's refresh interval
        return False

    workers = _worker_watch()
    try:
        p = follow(handle, ProgressView(workers), finished, log_every=log_every)
    except KeyboardInterrupt:
        note(f"stopped watching; the batch keeps running (duet watch {batch})")
        raise typer.Exit(INTERRUPTED) from None
    finally:
        if workers is not None:
            workers.stop()
    raise _exit_for_progress(p)


@app.command(
    epilog="Example: duet results 4c9e34663fac4c9d8513fd84d3ff8b17 -o results.csv --status approved "
    "(or, to put a results file in input order: duet results results.jsonl -o sorted.jsonl)"
)
@fails_cleanly
def results(
    batch: Annotated[
        str,
        typer.Argument(
            help="Batch id, or a results file (JSONL or CSV) to filter and put in input order.",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", dir_okay=False,
            help="Write here: CSV when the name ends in .csv, else JSONL. Default: JSONL on stdout.",
        ),
    ] = None,
    status: StatusOpt = None,
    timeout: TimeoutOpt = None,
    log_every: LogEveryOpt = LOG_EVERY_S,
) -> None:  # fmt: skip
    """Stream a batch's records in input order (rejected inputs in their places), each as
    soon as it (and those before it) finished.

    Exit code 0 when every input was accepted and every run finished well; 1 otherwise
    (or when the timeout passed).
    """
    _check_status(status)
    if Path(batch).is_file():
        records: Iterable[dict[str, Any]] = by_index(read_records(Path(batch)))
        _write_records(_select(records, status), output)
        return
    connect()
    handle = _batch(batch)
    try:
        if output is None:
            _write_records(_select(_batch_records(handle, timeout), status), None)
            return
        with_progress = _RecordsWithProgress(handle, timeout, status, output, log_every)
        with_progress.run()
    except RunTimeout as exc:
        error(str(exc))
        raise typer.Exit(SOME_FAILED) from None


def _write_records(records: Iterable[dict[str, Any]], output: Path | None) -> None:
    """Write records to ``output`` (or stdout as JSONL) and exit as their summary says."""
    summary = Summary()
    if output is None:
        for rec in records:
            sys.stdout.write(json.dumps(rec, ensure_ascii=False) + "\n")
            sys.stdout.flush()
            summary.add(rec)
    else:
        sink = ResultsFile(output)
        try:
            for rec in records:
                sink.write(dict(rec))
        finally:
            sink.finish()
        summary = sink.summary
        err.print(_summary_table(summary))
    raise _exit_for(summary)


class _RecordsWithProgress:
    """``duet results BATCH -o FILE``: write records while showing the batch's progress."""

    def __init__(
        self, handle: BatchHandle, timeout: float | None, status: list[str] | None,
        output: Path, log_every: float,
    ) -> None:  # fmt: skip
        self.handle, self.timeout, self.status = handle, timeout, status
        self.output, self.log_every = output, log_every

    def run(self) -> None:
        sink = ResultsFile(self.output)
        done = threading.Event()
        failure: list[BaseException] = []

        def work() -> None:
            try:
                for rec in _select(_batch_records(self.handle, self.timeout), self.status):
                    sink.write(dict(rec))
            except BaseException as exc:  # re-raised below
                failure.append(exc)
            finally:
                done.set()

        threading.Thread(target=work, name="duet-results", daemon=True).start()
        try:
            follow(self.handle, ProgressView(), lambda _, w: done.wait(w), log_every=self.log_every)
        except KeyboardInterrupt:
            sink.finish()
            raise typer.Exit(INTERRUPTED) from None
        done.wait()
        sink.finish()
        if failure:
            raise failure[0]
        err.print(_summary_table(sink.summary))
        raise _exit_for(sink.summary)


@app.command("ls", epilog="Example: duet ls --limit 5")
@fails_cleanly
def ls(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many batches.")] = 20,
) -> None:
    """List the newest batches: when, counts by outcome, rejected inputs, spend."""
    connect()
    from orchestration.state import batches, connection

    r = connection.get_redis()
    found = batches.recent(r, limit)
    if not found:
        out.print("no batches")
        return
    table = Table(title="Batches, newest first", title_justify="left")
    for column in ("batch", "submitted", "done", "outcomes", "rejected", "cost"):
        table.add_column(
            column, justify="right" if column in ("done", "rejected", "cost") else "left"
        )
    for batch_id, rec in found:
        counts = {
            k.split(":", 1)[1]: int(v) for k, v in rec.items() if k.startswith("status:") and int(v)
        }
        when = datetime.fromtimestamp(float(rec.get("created_at") or 0)).strftime(
            "%Y-%m-%d %H:%M:%S"
        )
        table.add_row(
            plain(batch_id), when, f"{rec.get('done', 0)}/{rec.get('total', 0)}",
            _outcomes(counts), str(batches.rejected_count(r, batch_id)),
            f"${float(rec.get('usd') or 0):.4f}",
        )  # fmt: skip
    out.print(table)


def _outcomes(counts: dict[str, int]) -> Text:
    text = Text()
    for outcome in OUTCOMES:
        if counts.get(outcome):
            text.append(f"{LABELS[outcome]} {counts[outcome]}  ", style=COLOURS[outcome])
    return text


@app.command(epilog="Example: duet show 9f1c2e0d7a6b4c3d8e5f4a3b2c1d0e9f")
@fails_cleanly
def show(
    run_id: RunArg,
    full: Annotated[bool, typer.Option("--full", help="Show the final output in full.")] = False,
) -> None:
    """Show one run: each round's score, issues and summary, and what each revision changed."""
    connect()
    from orchestration.client.handles import store

    result = store().result(run_id)
    out.print(_run_header(result))
    previous = result.rounds[0].judged_output if result.rounds else result.output
    for rnd in result.rounds:
        score = f"{rnd.score:.2f}" if rnd.score is not None else "-"
        body: list[Any] = [plain(rnd.summary or "(no summary)")]
        body += [plain(f"• {issue}", style="yellow") for issue in rnd.issues]
        if rnd.revision is not None:
            diff = _diff(
                previous or "", rnd.revision, f"revision {rnd.round - 1}", f"revision {rnd.round}"
            )
            body.append(
                Syntax(clean(diff), "diff", word_wrap=True) if diff else Text("(unchanged)")
            )
            previous = rnd.revision
        out.print(
            Panel(Group(*body), title=f"round {rnd.round}: score {score}", title_align="left")
        )
    if result.output is not None:
        text = result.output if full or len(result.output) <= 2000 else result.output[:2000] + "\n…"
        out.print(Panel(plain(text), title="final output", title_align="left"))


def _run_header(result: RunResult) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    usage = result.usage.total
    rows: list[tuple[str, str | Text]] = [
        ("run", result.run_id),
        ("input", result.input_id or "-"),
        ("batch", result.batch_id or "-"),
        ("status", plain(result.status, style=COLOURS.get(str(result.status), ""))),
        ("final score", _final_score(result)),
        ("reason", result.interruption_reason or "-"),
        ("error", result.error or "-"),
        ("usage", f"{usage.input_tokens:,} in, {usage.output_tokens:,} out, "
                  f"{usage.calls} calls, ${usage.usd:.4f}"),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value if isinstance(value, Text) else plain(value))
    return table


def _final_score(result: RunResult) -> str:
    """The last score, and which output it judged when that is not the final one."""
    if result.final_score is None:
        return "-"
    shown = f"{result.final_score:.2f}"
    if result.final_score_judges_output:
        return shown
    return f"{shown} (of the round {result.scored_output_round} output; the final one is unscored)"


def _diff(before: str, after: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), old, new
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@app.command(
    epilog="Example: duet report 4c9e34663fac4c9d8513fd84d3ff8b17 -o report.html "
    "(or: duet report results.jsonl -o report.html)"
)
@fails_cleanly
def report(
    batch: Annotated[
        str, typer.Argument(help="Batch id, or a results file (JSONL or CSV) written by duet.")
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", dir_okay=False, help="The HTML file to write.")
    ] = Path("report.html"),
    timeout: TimeoutOpt = None,
) -> None:
    """Write one self-contained HTML page about a batch: outcomes, why inputs did not finish
    well, the most frequent issues, every input not approved with its last score and
    issues, scores, rounds, cost, time, models and dates.

    Reads a results file directly (no cluster needed), or a batch on the cluster,
    waiting for it to finish. Exit code 0 when every input was accepted and finished
    well, 1 otherwise, 2 when the file is not a results file.
    """
    if Path(batch).is_file():
        records: list[dict[str, Any]] = list(by_index(read_records(Path(batch))))
        title = f"Duet report: {Path(batch).name}"
    else:
        connect()
        handle = _batch(batch)
        with err.status(plain(f"Waiting for batch {batch} to finish")):
            try:
                records = list(_batch_records(handle, timeout))
            except RunTimeout as exc:
                error(str(exc))
                raise typer.Exit(SOME_FAILED) from None
        title = f"Duet report: batch {batch}"
    if not records:
        raise ConfigError(f"{batch}: no records to report on")
    summary = Summary()
    for rec in records:
        summary.add(rec)
    output.write_text(render_report(records, title=title), encoding="utf-8")
    note(f"report: {output} ({summary.total} input(s))")
    raise _exit_for(summary)


@app.command(epilog="Example: duet cancel 4c9e34663fac4c9d8513fd84d3ff8b17")
@fails_cleanly
def cancel(
    id: Annotated[str, typer.Argument(help="A batch id or a run id.", show_default=False)],
) -> None:
    """Cancel a batch (every unfinished run) or one run; each stops after its current step."""
    connect()
    from orchestration.client.handles import BatchHandle, RunHandle, store

    handle = BatchHandle(id)
    try:
        handle.progress()
    except LookupError:
        if store().status(id) is None:
            raise LookupError(f"no batch or run {id} (expired or never submitted)") from None
        flagged = RunHandle(id).cancel()
        out.print(plain(f"run {id}: {'cancelled' if flagged else 'already finished'}"))
        return
    out.print(plain(f"batch {id}: cancelled {handle.cancel()} unfinished run(s)"))


@app.command(epilog="Example: duet resume 4c9e34663fac4c9d8513fd84d3ff8b17")
@fails_cleanly
def resume(batch: BatchArg) -> None:
    """Re-enqueue every unfinished run of a batch (after a crash, or to undo a cancel).

    Safe at any time: stored steps are never repeated.
    """
    connect()
    handle = _batch(batch)
    out.print(plain(f"batch {batch}: re-enqueued {handle.resume()} unfinished run(s)"))


@app.command(
    epilog="Example: DUET_REDIS_URL=redis://localhost:6379/0 duet worker --queues actor,critic --concurrency 200"
)
@fails_cleanly
def worker(
    queues: Annotated[
        str, typer.Option("--queues", "-Q", help="Comma-separated queues to consume.")
    ] = "actor,critic,coordinator",
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            "-c",
            min=1,
            help="Calls in flight (threads). Default: DUET_WORKER_CONCURRENCY.",
        ),
    ] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="Celery log level.")] = "INFO",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            help="Serve Prometheus metrics on this port (/metrics). Default: DUET_METRICS_PORT.",
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            help="Worker log lines as `text` or `json` (with run, batch, step and task ids). "
            "Default: `duet --log-format`, DUET_LOG_FORMAT or text.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Become a Celery worker (threads pool, task events on) for the cluster in DUET_REDIS_URL."""
    from orchestration.state import keys

    if not (get_settings().redis_url or get_settings().broker_url):
        raise ConfigError(
            "a worker needs a cluster: set DUET_REDIS_URL (e.g. redis://localhost:6379/0)"
        )
    chosen = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = sorted(set(chosen) - set(keys.ALL_QUEUES))
    if not chosen or unknown:
        raise ConfigError(
            f"--queues: unknown queue(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(keys.ALL_QUEUES)}"
        )
    argv = [
        sys.executable, "-m", "celery", "-A", "workers", "worker",
        "--pool", "threads", "--concurrency", str(concurrency or get_settings().worker_concurrency),
        "-E", "-Q", ",".join(chosen), "--loglevel", loglevel,
        "--hostname", f"duet-{os.getpid()}@%h",
    ]  # fmt: skip
    if metrics_port is not None:
        os.environ["DUET_METRICS_PORT"] = str(metrics_port)
    if log_format not in (None, "text", "json"):
        raise ConfigError(f"--log-format {log_format!r}: choose text or json")
    os.environ["DUET_LOG_FORMAT"] = log_format or current_log_format()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)  # this process becomes the worker: signals go straight to it


@app.command(epilog="Example: DUET_REDIS_URL=redis://localhost:6379/0 duet metrics --port 9809")
@fails_cleanly
def metrics(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to serve /metrics on.")] = 9809,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",  # noqa: S104
) -> None:
    """Serve the fleet's figures from Redis for Prometheus: queue depth, runs and batches
    in flight, budgets per scope (one scrape target; workers serve their own figures)."""
    import redis
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import start_http_server

    from duet.exporter import FleetCollector
    from orchestration.state.connection import get_redis

    connect()
    settings = get_settings()
    broker_url = settings.broker_url or settings.redis_url or ""
    broker = None
    if broker_url.split("://", 1)[0] in ("redis", "rediss"):
        broker = redis.Redis.from_url(
            broker_url,
            socket_timeout=settings.redis_socket_timeout_s,
            socket_connect_timeout=settings.redis_connect_timeout_s,
        )
    registry = CollectorRegistry()
    registry.register(FleetCollector(get_redis(), broker))
    try:
        server, _ = start_http_server(port, host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"--port {port}: cannot listen on {host}: {exc}") from exc
    err.print(f"serving the fleet's metrics on http://{host}:{port}/metrics (Ctrl-C stops)")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
        raise typer.Exit(INTERRUPTED) from None


@app.command("fake-llm", epilog="Example: duet fake-llm --port 8765 --latency-ms 50")
def fake_llm(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    latency_ms: Annotated[float, typer.Option(help="Delay added to every answer.")] = 0.0,
) -> None:
    """Serve a local stand-in for the OpenAI and Anthropic APIs (answers as the sim model)."""
    from duet.fake_llm import serve

    serve(host, port, latency_ms)


app.add_typer(budget_app, name="budget")


def main() -> None:
    """Console-script entry point (``duet``)."""
    app(prog_name="duet")


if __name__ == "__main__":
    main()
