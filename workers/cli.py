"""``duet``: batch review from the terminal.

``duet run`` does a whole batch in one command: on an embedded Redis with an in-process
worker when ``DUET_REDIS_URL`` is unset, else on that cluster. The other commands work
against a cluster: submit a batch, watch it, fetch its results, inspect one run, render
a report, cancel, resume, and start worker pools.

Exit codes: 0 everything finished without failures or rejected inputs; 1 some runs
failed or inputs were rejected; 2 bad usage or a bad config; 130 interrupted.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Annotated, Any, TypeVar

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from orchestration.config import ReviewConfig, load_config
from orchestration.errors import ConfigError
from orchestration.inputs import InputProblem, InputReader
from orchestration.settings import get_settings

from .report import LABELS, OUTCOMES, Summary, rejected_record, result_record

#: Exit codes.
OK, SOME_FAILED, BAD_USAGE, INTERRUPTED = 0, 1, 2, 130
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
    help="Review many inputs with an actor model and a critic model, on a Celery fleet.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
out = Console()
err = Console(stderr=True)


@app.callback()
def _duet() -> None:
    """Review many inputs with an actor model and a critic model, on a Celery fleet.

    Without DUET_REDIS_URL, `duet run` starts an embedded Redis and an in-process worker;
    with it, every command works against that cluster.
    """


F = TypeVar("F", bound=Callable[..., Any])


def _fails_cleanly(command: F) -> F:
    """Turn the errors a user can fix into a one-line message and exit code 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # Settings are read once per process; a command starts from the environment
        # it was given (this matters when many commands run in one test process).
        get_settings.cache_clear()
        try:
            return command(*args, **kwargs)
        except (ConfigError, LookupError) as exc:
            _error(str(exc))
            raise typer.Exit(BAD_USAGE) from None

    return wrapper  # type: ignore[return-value]


def _error(message: str) -> None:
    # soft_wrap: a long path or key path stays on one line, whole, for copy and grep.
    err.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)


def _warn(message: str) -> None:
    err.print(Text("warning: " + message, style="yellow"), soft_wrap=True)


# --- config and inputs ----------------------------------------------------------
def _load(config: Path, *, embedded: bool) -> ReviewConfig:
    """Load the config and check what only the worker side can check (sim options, keys)."""
    cfg = load_config(config)
    spec = cfg.build_architecture().to_spec()
    for role in ("actor", "critic"):
        agent = getattr(spec, role)
        if agent.provider == "sim":
            from .providers.sim import parse_sim_model

            try:
                parse_sim_model(agent.model_name)
            except ConfigError as exc:
                raise ConfigError(f"{cfg.source}: {role}.model: {exc}") from None
        elif embedded and agent.api_key_env and not _env(agent.api_key_env):
            raise ConfigError(
                f"{cfg.source}: {role}: {agent.api_key_env} is not set, and the embedded worker "
                "runs in this process; export it, or set DUET_REDIS_URL to use a cluster"
            )
    if cfg.budget is not None or cfg.rate_limits:
        # Checked and kept, but Team does not take them yet: say so rather than pretend.
        _warn(f"{cfg.source}: [budget] and [rate_limits] are not enforced yet")
    return cfg


def _env(name: str) -> str | None:
    import os

    return os.environ.get(name)


def _reader(
    cfg: ReviewConfig, path: Path, on_problem: Callable[[InputProblem], None]
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
    )


def _connect(*, embedded_ok: bool) -> str:
    """Point this process at the cluster, or start the embedded one; the Redis URL."""
    from orchestration import connection, local

    url = get_settings().redis_url
    if url:
        connection.use_redis(url)
        return url
    if not embedded_ok:
        raise ConfigError(
            "this command needs a cluster: set DUET_REDIS_URL (e.g. redis://localhost:6379/0). "
            "An embedded cluster would stop when the command ends; use `duet run` for that."
        )
    with err.status("No DUET_REDIS_URL: starting an embedded Redis and an in-process worker"):
        return local.ensure_backend()


def _show_problems(problems: list[InputProblem], total: int) -> None:
    table = Table(title=f"{total} rejected input(s)", title_style="bold red", title_justify="left")
    table.add_column("file:line", style="cyan", no_wrap=True)
    table.add_column("id")
    table.add_column("reason", style="red")
    for problem in problems[:SHOWN_PROBLEMS]:
        table.add_row(problem.where, problem.id or "", problem.reason)
    if total > SHOWN_PROBLEMS:
        table.caption = f"... and {total - SHOWN_PROBLEMS} more"
    err.print(table)


# --- progress -------------------------------------------------------------------
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
            TextColumn("[bold]batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
        )
        self.task = self.progress.add_task("batch", total=None)
        self.detail = Text()

    def __rich__(self) -> Group:
        return Group(self.progress, self.detail)

    def update(self, p: dict[str, Any]) -> None:
        now = time.monotonic()
        self.rate.add(p["done"], now)
        self.progress.update(self.task, total=p["total"], completed=p["done"])
        detail = _counts_text(p["counts"], self.rejected)
        detail.append(f"| {p['tokens']:,} tokens  ${p['usd']:.4f}")
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
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _follow(
    handle: Any, view: _ProgressView, finished: Callable[[dict[str, Any], float], bool]
) -> dict[str, Any]:
    """Refresh ``view`` from ``handle.progress()`` until ``finished(progress, wait_s)``.

    ``finished`` is also how the loop paces itself: it waits up to ``wait_s`` (on a
    thread, or just the clock) before answering.
    """
    with Live(view, console=err, refresh_per_second=8) as live:
        while True:
            p = handle.progress()
            view.update(p)
            live.refresh()
            if finished(p, REFRESH_S):
                p = handle.progress()
                view.update(p)
                live.refresh()
                return p


# --- results ----------------------------------------------------------------------
class _ResultWriter:
    """Writes result records in input order, rejected inputs in their places.

    Rejections arrive as ``(valid inputs before it, problem)``: each is written just
    before the result of the next valid input, so the file follows the input file.
    """

    def __init__(self, sink: IO[str], rejected: list[tuple[int, InputProblem]]) -> None:
        self.sink = sink
        self.rejected = rejected
        self.summary = Summary()
        self.error: BaseException | None = None
        self._next_rejected = 0

    def write(self, record: dict[str, Any]) -> None:
        self.sink.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.sink.flush()  # as they come: a watcher (or a crash) sees every finished line
        self.summary.add(record)

    def _rejected_up_to(self, position: int | None) -> None:
        while self._next_rejected < len(self.rejected):
            before, problem = self.rejected[self._next_rejected]
            if position is not None and before > position:
                return
            self.write(rejected_record(problem))
            self._next_rejected += 1

    def drain(self, results: Iterable[Any]) -> None:
        """Write every result (then any trailing rejections); keeps the error for the caller."""
        try:
            for n, result in enumerate(results):
                self._rejected_up_to(n)
                self.write(result_record(result))
            self._rejected_up_to(None)
        except BaseException as exc:  # re-raised in the main thread by the caller
            self.error = exc


def _summary_table(summary: Summary, wall_s: float, title: str = "Summary") -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
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
    table.add_row("wall time", _duration(wall_s))
    return table


# --- commands -------------------------------------------------------------------
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


@app.command(
    epilog="Example: duet run examples/review.toml --input examples/inputs.jsonl --output results.jsonl"
)
@_fails_cleanly
def run(
    config: ConfigArg,
    input: InputOpt,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            dir_okay=False,
            help="Results file (JSONL, one record per input, in input order). "
            "Default: INPUT-NAME.results.jsonl in the current directory.",
        ),
    ] = None,  # fmt: skip
) -> None:
    """Review every input and wait for the results, with a live progress bar.

    Runs on the cluster in DUET_REDIS_URL, or, when it is unset, on an embedded Redis
    with an in-process worker that stop when the command ends. Bad inputs are listed and
    written to the results file with status "rejected"; the others run.

    Exit code 0 when every input finished without failure, 1 when some run failed or
    some input was rejected, 2 for a bad config or bad usage.
    """
    embedded = not get_settings().redis_url
    cfg = _load(config, embedded=embedded)
    team = cfg.build_team()
    target = output or Path(f"{input.name.rsplit('.', 1)[0]}.results.jsonl")
    started = time.monotonic()
    _connect(embedded_ok=True)

    rejected: list[tuple[int, InputProblem]] = []
    reader = _reader(cfg, input, lambda problem: rejected.append((reader.count, problem)))
    with err.status(f"Reading {input} and submitting"):
        handle = team.submit_batch(record.as_item() for record in reader)
    if rejected:
        _show_problems([p for _, p in rejected], len(rejected))
    if reader.skipped:
        _warn(f"skipped {reader.skipped} binary file(s) in {input}")

    with target.open("w", encoding="utf-8") as sink:
        writer = _ResultWriter(sink, rejected)
        if reader.count == 0:
            _warn("no valid inputs: nothing to run")
            writer.drain(())
        else:
            err.print(
                f"batch [bold]{handle.batch_id}[/]: {reader.count} run(s), results -> {target}"
            )
            _wait_for_batch(handle, writer, rejected=len(rejected))
    if writer.error is not None:
        raise writer.error
    out.print(_summary_table(writer.summary, time.monotonic() - started))
    out.print(f"results: {target}")
    raise typer.Exit(OK if writer.summary.ok else SOME_FAILED)


def _wait_for_batch(handle: Any, writer: _ResultWriter, *, rejected: int) -> None:
    """Write results as they come while showing progress; Ctrl-C cancels the batch."""
    thread = threading.Thread(target=writer.drain, args=(handle.results(),), daemon=True)
    thread.start()

    def finished(_: dict[str, Any], wait_s: float) -> bool:
        thread.join(wait_s)
        return not thread.is_alive()

    view = _ProgressView(rejected=rejected)
    try:
        _follow(handle, view, finished)
    except KeyboardInterrupt:
        handle.cancel()
        err.print(
            "[yellow]cancelled: runs stop after their current step (Ctrl-C again to quit now)[/]"
        )
        try:
            _follow(handle, view, finished)
        except KeyboardInterrupt:
            raise typer.Exit(INTERRUPTED) from None
    thread.join()


def main() -> None:
    """Console-script entry point (``duet``)."""
    app(prog_name="duet")


if __name__ == "__main__":
    main()
