"""``duet``: batch review from the terminal.

``duet run`` does a whole batch in one command: on an embedded Redis with an in-process
worker when ``DUET_REDIS_URL`` is unset, else on that cluster. The other commands work
against a cluster: submit a batch, watch it, fetch its results, inspect one run, render
a report, cancel, resume, and start worker pools.

Exit codes: 0 everything finished without failures or rejected inputs; 1 some runs
failed or inputs were rejected; 2 bad usage or a bad config; 130 interrupted.
"""

from __future__ import annotations

import csv
import difflib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from duet.cli_budget import budget_app
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
from duet.inputs import InputProblem, InputReader
from duet.report import (
    CSV_COLUMNS,
    LABELS,
    OUTCOMES,
    Summary,
    csv_row,
    rejected_record,
    render_report,
    result_record,
)
from orchestration.core.errors import ConfigError, RunTimeout
from orchestration.settings import get_settings

if TYPE_CHECKING:
    from orchestration.client.handles import BatchHandle
    from orchestration.core.results import RunResult

#: Seconds between progress refreshes (a screen refresh, not a synchronisation).
REFRESH_S = 0.2
#: Rejected inputs listed on screen; the results file always has every one.
SHOWN_PROBLEMS = 20
#: Outcome -> colour on screen.
COLOURS = {
    "approved": "green",
    "max_rounds_reached": "yellow",
    "interrupted": "magenta",
    "failed": "red",
    "cancelled": "bright_black",
    "rejected": "red",
}

app = typer.Typer(
    name="duet",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
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
def _load(config: Path, *, embedded: bool) -> ReviewConfig:
    """Load the config and check what only the worker side can check (sim options, keys)."""
    cfg = load_config(config)
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


def _check_workers() -> None:
    """Warn when no worker answers: runs would wait in the queue with nothing moving."""
    from orchestration.client.handles import producer

    if not producer().control.ping(timeout=1.0):
        warn("no worker answered a ping; runs wait in the queue until one starts (duet worker)")


def _apply_rate_limits(cfg: ReviewConfig) -> None:
    limits = cfg.build_rate_limits()
    if limits:
        from orchestration.state import connection
        from orchestration.state.ratelimits import set_rate_limits

        set_rate_limits(connection.get_redis(), limits)


def _reader(
    cfg: ReviewConfig,
    path: Path,
    on_problem: Callable[[InputProblem], None],
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
        on_problem=on_problem,
        strict=strict,
        include=[*cfg.inputs.include, *include],
        exclude=[*cfg.inputs.exclude, *exclude],
        gitignore=cfg.inputs.gitignore,
        prompt_template=cfg.inputs.prompt_template,
    )


def _submit(
    cfg: ReviewConfig,
    input: Path,
    *,
    strict: bool = False,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> tuple[BatchHandle, InputReader, list[tuple[int, InputProblem]]]:
    """Read the inputs and submit the valid ones as one batch (with the config's limits).

    Returns the batch, the reader (counts) and each rejected input with the number of
    valid inputs before it, which places it in the results file.
    """
    team = cfg.build_team()
    _apply_rate_limits(cfg)
    if get_settings().redis_url:
        _check_workers()
    rejected: list[tuple[int, InputProblem]] = []
    reader = _reader(
        cfg, input, lambda problem: rejected.append((reader.count, problem)), strict=strict,
        include=include, exclude=exclude,
    )  # fmt: skip
    with err.status(plain(f"Reading {input} and submitting")):
        handle = team.submit_batch((r.as_item() for r in reader), budget=cfg.build_budget())
    record(f"batch {handle.batch_id} submitted: {reader.count} run(s)", batch_id=handle.batch_id)
    if rejected:
        _show_problems([p for _, p in rejected])
    if reader.skipped:
        why = ", ".join(f"{n} {kind}" for kind, n in sorted(reader.skipped_by.items()))
        note(f"skipped {reader.skipped} file(s) in {input}: {why}")
    return handle, reader, rejected


def _show_problems(problems: list[InputProblem]) -> None:
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


# --- progress ---------------------------------------------------------------------
class _Rate:
    """Runs per minute over the last minute of samples, and the ETA it implies."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.samples: list[tuple[float, int]] = []

    def add(self, done: int, now: float) -> None:
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window_s:
            self.samples.pop(0)

    def per_minute(self) -> float | None:
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) * 60 if t1 > t0 and d1 > d0 else None

    def eta_s(self, remaining: int) -> float | None:
        rate = self.per_minute()
        return remaining / rate * 60 if rate else None


def _counts_text(counts: dict[str, int], rejected: int = 0) -> Text:
    text = Text()
    for outcome in OUTCOMES:
        n = rejected if outcome == "rejected" else counts.get(outcome, 0)
        if n:
            text.append(f"{LABELS[outcome]} {n}  ", style=COLOURS[outcome])
    return text


class _ProgressView:
    """The live view of a batch: bar, counts by outcome, spend, rate and ETA."""

    def __init__(self, *, rejected: int = 0) -> None:
        self.rejected = rejected
        self.rate = _Rate()
        self.progress = Progress(
            TextColumn("[bold]batch"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=err,
        )  # fmt: skip
        self.task = self.progress.add_task("batch", total=None)
        self.detail = Text()

    def __rich__(self) -> Group:
        return Group(self.progress, self.detail)

    def update(self, p: dict[str, Any]) -> None:
        self.rate.add(p["done"], time.monotonic())
        self.progress.update(self.task, total=p["total"], completed=p["done"])
        detail = _counts_text(p["counts"], self.rejected)
        detail.append(f"| {p['tokens']:,} tokens  ${p['usd']:.4f}")
        for unit, b in (p.get("budget") or {}).items():
            money = unit == "usd"
            spent = f"${b['spent']:.4f}" if money else f"{b['spent']:,.0f}"
            limit = f"${b['limit']:.2f}" if money else f"{b['limit']:,.0f}"
            share = b["spent"] / b["limit"] if b["limit"] else 1.0
            style = "red" if share >= 1 else "yellow" if share >= 0.8 else ""
            detail.append(f"  budget {unit} {spent} of {limit}", style=style)
        rate = self.rate.per_minute()
        if rate is not None:
            detail.append(f"  | {rate:,.1f} runs/min")
            eta = self.rate.eta_s(p["total"] - p["done"])
            if eta is not None and p["done"] < p["total"]:
                detail.append(f"  ETA {_duration(eta)}")
        self.detail = detail


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _follow(
    handle: BatchHandle, view: _ProgressView, finished: Callable[[dict[str, Any], float], bool]
) -> dict[str, Any]:
    """Refresh ``view`` from ``handle.progress()`` until ``finished(progress, wait_s)``.

    ``finished`` is also how the loop paces itself: it waits up to ``wait_s`` (on a
    thread, or on the clock) before answering. With JSON logs nothing is drawn (stderr
    holds only log lines).
    """
    if current_log_format() == "json":
        while True:
            p = handle.progress()
            if finished(p, REFRESH_S):
                return handle.progress()
    with Live(view, console=err, refresh_per_second=8) as live:
        while True:
            p = handle.progress()
            view.update(p)
            live.refresh()
            if finished(p, REFRESH_S):
                p = handle.progress()
                view.update(p)
                live.refresh()
                break
    if not err.is_terminal:
        err.print()  # a file or pipe gets the last frame without its line end
    return p


# --- results ----------------------------------------------------------------------
class _ResultWriter:
    """Writes result records in input order, rejected inputs in their places.

    Rejections come as ``(valid inputs before it, problem)``: each is written just
    before the result of the next valid input, so the file follows the input file.
    """

    def __init__(
        self, sink: IO[str], rejected: Iterable[tuple[int, InputProblem]] = (), *,
        as_csv: bool = False,
    ) -> None:  # fmt: skip
        self.sink = sink
        self.rejected = list(rejected)
        self.csv = csv.writer(sink) if as_csv else None
        if self.csv is not None:
            self.csv.writerow(CSV_COLUMNS)
        self.summary = Summary()
        self.error: BaseException | None = None
        self._next_rejected = 0

    def write(self, record: dict[str, Any]) -> None:
        if self.csv is not None:
            self.csv.writerow(csv_row(record))
        else:
            self.sink.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.sink.flush()  # as they come: a reader (or a crash) sees every finished line
        self.summary.add(record)

    def _rejected_up_to(self, position: int | None) -> None:
        while self._next_rejected < len(self.rejected):
            before, problem = self.rejected[self._next_rejected]
            if position is not None and before > position:
                return
            self.write(rejected_record(problem))
            self._next_rejected += 1

    def drain(self, results: Iterable[RunResult]) -> None:
        """Write every result (then any trailing rejections); keeps an error for the caller."""
        try:
            for n, result in enumerate(results):
                self._rejected_up_to(n)
                self.write(result_record(result))
            self._rejected_up_to(None)
        except BaseException as exc:  # re-raised in the main thread by the caller
            self.error = exc


def _write_while_watching(
    handle: BatchHandle,
    writer: _ResultWriter,
    *,
    rejected: int = 0,
    timeout: float | None = None,
    cancel_on_interrupt: bool = True,
    announce: Text | None = None,
) -> bool:
    """Write results as they come while showing progress; True if Ctrl-C cancelled the batch.

    Ctrl-C cancels the batch (``cancel_on_interrupt``) and keeps writing the runs as they
    stop, or just stops; a second Ctrl-C quits at once. ``announce`` is printed once Ctrl-C
    is handled this way.
    """
    # The main thread waits on an Event, not on Thread.join: a join interrupted by Ctrl-C
    # can leave the thread looking finished while it still runs (CPython gh-90882).
    drained = threading.Event()

    def drain() -> None:
        try:
            writer.drain(handle.results(timeout=timeout))
        finally:
            drained.set()

    threading.Thread(target=drain, name="duet-results", daemon=True).start()

    def finished(_: dict[str, Any], wait_s: float) -> bool:
        return drained.wait(wait_s)

    view = _ProgressView(rejected=rejected)
    interrupted = False
    try:
        if announce and current_log_format() == "text":
            err.print(announce)
        _follow(handle, view, finished)
    except KeyboardInterrupt:
        if not cancel_on_interrupt:
            raise typer.Exit(INTERRUPTED) from None
        interrupted = True
        handle.cancel()
        warn("cancelling: runs stop after their current step (Ctrl-C again to quit now)")
        try:
            _follow(handle, view, finished)
        except KeyboardInterrupt:
            raise typer.Exit(INTERRUPTED) from None
    drained.wait()
    if writer.error is not None:
        raise writer.error
    return interrupted


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
        table.add_row("wall time", _duration(wall_s))
    return table


def _is_csv(path: Path) -> bool:
    return path.suffix.lower() == ".csv"


def _exit_for(summary: Summary) -> typer.Exit:
    return typer.Exit(OK if summary.ok else SOME_FAILED)


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
BatchArg = Annotated[
    str, typer.Argument(help="Batch id (printed by `duet submit`).", show_default=False)
]
RunArg = Annotated[
    str, typer.Argument(help="Run id (the run_id field of a result).", show_default=False)
]
TimeoutOpt = Annotated[
    float | None, typer.Option("--timeout", help="Give up after this many seconds (exit 1).")
]


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
            "--output",
            "-o",
            dir_okay=False,
            help="Results file, one record per input in input order: JSONL, or CSV when the "
            "name ends in .csv. Default: INPUT-NAME.results.jsonl in the current directory.",
        ),
    ] = None,  # fmt: skip
    strict: StrictOpt = False,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
) -> None:
    """Review every input and wait for the results, with a live progress bar.

    Runs on the cluster in DUET_REDIS_URL or, when it is unset, on an embedded Redis with
    an in-process worker that stop when the command ends. Bad inputs are listed and
    written to the results file with status "rejected"; the others run.

    Exit code 0 when every input finished without failure, 1 when some run failed or
    some input was rejected, 2 for a bad config or bad usage.
    """
    started = time.monotonic()
    cfg = _load(config, embedded=not get_settings().redis_url)
    target = output or Path(f"{input.name.rsplit('.', 1)[0]}.results.jsonl")
    connect(embedded_ok=True)
    handle, reader, rejected = _submit(
        cfg, input, strict=strict, include=include or (), exclude=exclude or ()
    )
    with target.open("w", encoding="utf-8", newline="") as sink:
        writer = _ResultWriter(sink, rejected, as_csv=_is_csv(target))
        interrupted = False
        if reader.count == 0:
            warn("no valid inputs: nothing to run")
            writer.drain(())
        else:
            interrupted = _write_while_watching(
                handle, writer, rejected=len(rejected),
                announce=plain(f"batch {handle.batch_id}: {reader.count} run(s), results -> {target}"),
            )  # fmt: skip
    record(f"batch {handle.batch_id} finished: results in {target}", batch_id=handle.batch_id)
    out.print(_summary_table(writer.summary, time.monotonic() - started))
    out.print(plain(f"results: {target}"))
    raise typer.Exit(INTERRUPTED) if interrupted else _exit_for(writer.summary)


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
) -> None:
    """Queue every input on the cluster and print the batch id; returns at once.

    Needs DUET_REDIS_URL (an embedded cluster would stop with the command). Follow the
    batch with `duet watch`, fetch it with `duet results`. Exit code 1 when some input
    was rejected (they are listed; the others are queued).
    """
    connect()
    cfg = _load(config, embedded=False)
    handle, reader, rejected = _submit(
        cfg, input, strict=strict, include=include or (), exclude=exclude or ()
    )
    if rejected_to is not None:
        with rejected_to.open("w", encoding="utf-8") as sink:
            _ResultWriter(sink, rejected).drain(())
    err.print(f"queued {reader.count} run(s); follow with: duet watch {handle.batch_id}")
    out.print(handle.batch_id, soft_wrap=True)
    raise typer.Exit(SOME_FAILED if rejected else OK)


@app.command(epilog="Example: duet watch 4c9e34663fac4c9d8513fd84d3ff8b17")
@fails_cleanly
def watch(batch: BatchArg) -> None:
    """Show a batch's progress live until it finishes: done/total, outcomes, spend, rate, ETA.

    Ctrl-C stops watching and leaves the batch running. Exit code 1 when some run failed.
    """
    connect()
    handle = _batch(batch)

    def finished(p: dict[str, Any], wait_s: float) -> bool:
        if p["done"] >= p["total"]:
            return True
        time.sleep(wait_s)  # the screen's refresh interval
        return False

    try:
        p = _follow(handle, _ProgressView(), finished)
    except KeyboardInterrupt:
        note(f"stopped watching; the batch keeps running (duet watch {batch})")
        raise typer.Exit(OK) from None
    raise typer.Exit(SOME_FAILED if p["counts"].get("failed") else OK)


@app.command(epilog="Example: duet results 4c9e34663fac4c9d8513fd84d3ff8b17 -o results.csv")
@fails_cleanly
def results(
    batch: BatchArg,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            dir_okay=False,
            help="Write here: CSV when the name ends in .csv, else JSONL. Default: JSONL on stdout.",
        ),
    ] = None,  # fmt: skip
    timeout: TimeoutOpt = None,
) -> None:
    """Stream a batch's results in input order, each as soon as it (and those before it) finished.

    Exit code 1 when some run failed (or the timeout passed).
    """
    connect()
    handle = _batch(batch)
    try:
        if output is None:
            writer = _ResultWriter(sys.stdout)
            writer.drain(handle.results(timeout=timeout))
            if writer.error is not None:
                raise writer.error
        else:
            with output.open("w", encoding="utf-8", newline="") as sink:
                writer = _ResultWriter(sink, as_csv=_is_csv(output))
                _write_while_watching(handle, writer, timeout=timeout, cancel_on_interrupt=False)
            err.print(_summary_table(writer.summary))
    except RunTimeout as exc:
        error(str(exc))
        raise typer.Exit(SOME_FAILED) from None
    raise _exit_for(writer.summary)


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
        str, typer.Argument(help="Batch id, or a results file (JSONL) written by `duet run`.")
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", dir_okay=False, help="The HTML file to write.")
    ] = Path("report.html"),
    timeout: TimeoutOpt = None,
) -> None:
    """Write one self-contained HTML page about a batch: outcomes, scores, rounds, cost, time.

    Reads a results file directly (no cluster needed), or a batch on the cluster,
    waiting for it to finish.
    """
    if Path(batch).is_file():
        records: Iterable[dict[str, Any]] = _read_records(Path(batch))
        title = f"Duet report: {Path(batch).name}"
    else:
        connect()
        handle = _batch(batch)
        with err.status(f"Waiting for batch {batch} to finish"):
            try:
                records = [result_record(r) for r in handle.results(timeout=timeout)]
            except RunTimeout as exc:
                error(str(exc))
                raise typer.Exit(SOME_FAILED) from None
        title = f"Duet report: batch {batch}"
    page = render_report(records, title=title)
    output.write_text(page, encoding="utf-8")
    note(f"report: {output}")


def _read_records(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{n}: not a results record: {exc.msg}") from None


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
