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

import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from duet.commands.app import (
    BatchArg,
    CacheOpt,
    CacheTtlOpt,
    ConfigArg,
    ExcludeOpt,
    IncludeOpt,
    IncludeSecretsOpt,
    LogEveryOpt,
    MaxInFlightOpt,
    StatusOpt,
    StrictOpt,
    TimeoutOpt,
    VendorBatchOpt,
    app,
    check_status,
)
from duet.commands.batch import (
    batch_handle,
    batch_records,
    exit_for,
    exit_for_progress,
    records_as_they_finish,
    select_status,
    summary_table,
    worker_watch,
)
from duet.commands.budget import budget_app
from duet.commands.cache import cache_app
from duet.commands.dead import dead_app
from duet.commands.intake import Reading, load_checked, print_dry_run, submit_reading
from duet.commands.limits import limits_app
from duet.commands.progress import LOG_EVERY_S, ProgressView, follow
from duet.commands.results import (
    Intake,
    ResultsFile,
    collect,
    finished_records,
    read_records,
)
from duet.commands.review import (
    FAIL_ON,
    AllOpt,
    CategoryOpt,
    ContextOpt,
    FailOnOpt,
    FormatOpt,
    GitOpt,
    GitSource,
    LinkOpt,
    PatchOpt,
    RepoOpt,
    RootOpt,
    UnitOpt,
    check_results_file,
    fails,
    input_source,
    records_of,
    write_findings,
)
from duet.commands.support import (
    INTERRUPTED,
    OK,
    SOME_FAILED,
    JsonOpt,
    connect,
    emit_json,
    err,
    error,
    fails_cleanly,
    note,
    out,
    plain,
    record,
    warn,
)
from duet.formats.outputs import write_outputs
from duet.report.records import (
    Summary,
    by_index,
    rejected_record,
)
from orchestration.core.errors import ConfigError, RunTimeout
from orchestration.logjson import json_line
from orchestration.settings import get_settings

if TYPE_CHECKING:
    from orchestration.client.handles import BatchHandle
    from orchestration.core.architecture import LoopSpec

#: Outputs not written that are each named on screen; the rest are counted.
_MISSED_SHOWN = 20


@app.command(
    epilog="Example: duet run examples/review.toml --input examples/inputs.jsonl --output results.jsonl"
)
@fails_cleanly
def run(
    config: ConfigArg,
    input: Annotated[
        Path | None,
        typer.Option(
            "--input",
            "-i",
            exists=True,
            show_default=False,
            help="Inputs: a JSONL file, a CSV file, or a directory (one input per file). "
            "Or give --git instead.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            dir_okay=False,
            help="Results file, one record per input: JSONL, or CSV when the name ends in .csv. "
            "Each record is written as its run finishes; the file is in input order at the "
            "end. Default: INPUT-NAME.results.jsonl in the current directory.",
        ),
    ] = None,
    strict: StrictOpt = False,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    include_secrets: IncludeSecretsOpt = False,
    resume_from: Annotated[
        Path | None,
        typer.Option(
            "--resume-from",
            exists=True,
            dir_okay=False,
            metavar="RESULTS",
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
            "--output-dir",
            file_okay=False,
            metavar="DIR",
            help="Also write each approved output to DIR/<id> (a directory input's relative "
            "path: the reviewed tree is mirrored).",
        ),
    ] = None,
    log_every: LogEveryOpt = LOG_EVERY_S,
    vendor_batch: VendorBatchOpt = False,
    git_range: GitOpt = None,
    repo: RepoOpt = Path("."),
    unit: UnitOpt = "file",
    context: ContextOpt = 10,
    cache: CacheOpt = False,
    cache_ttl: CacheTtlOpt = None,
    max_in_flight: MaxInFlightOpt = None,
) -> None:
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
    embedded = not get_settings().redis_url
    cfg = load_checked(
        config,
        embedded=embedded,
        vendor_batch=vendor_batch,
        cache=cache_ttl or ("7d" if cache else None),
        max_in_flight=max_in_flight,
    )
    run_loaded(
        cfg,
        input,
        output,
        strict=strict,
        include=include,
        exclude=exclude,
        resume_from=resume_from,
        limit=limit,
        dry_run=dry_run,
        output_dir=output_dir,
        log_every=log_every,
        include_secrets=include_secrets,
        git=GitSource(git_range, repo, unit, context, tuple(exclude or ()), include_secrets),
    )


def run_loaded(
    cfg: Any,
    input: Path | None,
    output: Path | None,
    *,
    strict: bool = False,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    resume_from: Path | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    output_dir: Path | None = None,
    log_every: float = LOG_EVERY_S,
    include_secrets: bool = False,
    git: GitSource | None = None,
) -> None:
    """``duet run`` once its config is loaded (``duet review`` comes in here too)."""
    started = time.monotonic()
    embedded = not get_settings().redis_url
    source = input_source(input, git)
    target = output or Path(f"{source.name.rsplit('.', 1)[0]}.results.jsonl")
    finished = finished_records(resume_from) if resume_from else None
    # With the cache on, every input is looked up before anything starts: on the
    # embedded default, a rerun that hits throughout starts no Redis and no worker.
    run_cache = None
    if not dry_run:
        if not embedded:
            connect()  # the cluster's cache is in its Redis
        from duet.commands.run_cache import RunCache

        run_cache = RunCache.of(cfg.build_architecture().to_spec())
    intake = Intake(finished, limit, run_cache)
    options: dict[str, Any] = {
        "strict": strict,
        "include": include or (),
        "exclude": exclude or (),
        "include_secrets": include_secrets,
    }
    if git is not None and git.spec:
        # A change with nothing to review (only docs in vendor/, say) is not a failure.
        options = {"reader": git.reader(cfg, intake), "empty_ok": True}
    if dry_run:
        reading = Reading(cfg, source, intake, **options)
        print_dry_run(cfg, reading)
        return
    if embedded and run_cache is None:
        connect(embedded_ok=True)
    reading = Reading(cfg, source, intake, **options)
    if embedded and run_cache is not None and reading.first is not None:
        connect(embedded_ok=True)  # something to run: start the embedded cluster now
    handle = submit_reading(cfg, reading) if reading.first is not None else None
    sink = ResultsFile(target, on_write=run_cache.finished if run_cache else None)
    interrupted = False
    try:
        for carried in (*intake.carried, *intake.cached):
            sink.write(carried)
        for r in intake.rejected:
            sink.write(rejected_record(r, batch_id=handle.batch_id if handle else None))
        if handle is None and (intake.carried or intake.cached):
            pass  # everything was carried over or served from the cache
        elif handle is None:
            warn("no valid inputs: nothing to run")
        else:
            interrupted = _collect_while_watching(
                handle,
                sink,
                intake.run_index,
                cfg.build_architecture().to_spec(),
                embedded=embedded,
                target=target,
                log_every=log_every,
            )
    finally:
        sink.finish()
        if run_cache is not None:
            run_cache.flush()
    if handle is not None:
        record(f"batch {handle.batch_id} finished: results in {target}", batch_id=handle.batch_id)
    out.print(summary_table(sink.summary, time.monotonic() - started))
    out.print(plain(f"results: {target}"))
    if output_dir is not None:
        _write_output_dir(read_records(target), output_dir)
    if interrupted:
        raise typer.Exit(INTERRUPTED)
    if git is not None and git.spec and not sink.summary.total:
        note(f"--git {git.spec}: no changed file to review")
        raise typer.Exit(OK)
    raise exit_for(sink.summary)


@app.command(
    epilog="Example: duet review --git main..feature -o review.jsonl && "
    "duet results review.jsonl -f sarif -o duet.sarif"
)
@fails_cleanly
def review(
    config: Annotated[
        Path | None,
        typer.Argument(
            help="Review config (TOML). Default: the built-in code review on sim models "
            "(--actor-model / --critic-model pick real ones).",
            exists=True,
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    git_range: Annotated[
        str, typer.Option("--git", metavar="BASE..HEAD", help="The change to review.")
    ] = "",
    staged: Annotated[
        bool,
        typer.Option(
            "--staged",
            help="Review the staged changes instead of --git: the index against HEAD (the "
            "empty tree before the first commit), as the pre-commit hook does. Results go to "
            "GIT_DIR/duet-review.jsonl unless -o says.",
        ),
    ] = False,
    repo: RepoOpt = Path("."),
    unit: UnitOpt = "file",
    context: ContextOpt = 10,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", dir_okay=False, help="Results file (default review.results.jsonl)."
        ),
    ] = None,
    actor_model: Annotated[
        str, typer.Option("--actor-model", help="Built-in config: the actor's model.")
    ] = "sim",
    critic_model: Annotated[
        str, typer.Option("--critic-model", help="Built-in config: the critic's model.")
    ] = "sim",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the worst case; send nothing.")
    ] = False,
    log_every: LogEveryOpt = LOG_EVERY_S,
    exclude: ExcludeOpt = None,
    include_secrets: IncludeSecretsOpt = False,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="SHA",
            show_default=False,
            help="Review only what changed after SHA (the last reviewed commit, e.g. from "
            "the PR comment's marker), when it is an ancestor of HEAD.",
        ),
    ] = None,
    fail_on: FailOnOpt = "never",
    with_sarif: Annotated[
        list[Path] | None,
        typer.Option(
            "--with-sarif",
            exists=True,
            dir_okay=False,
            metavar="SARIF",
            help="A static analyser's findings (e.g. ruff --output-format sarif): each is "
            "handed to the critic with the file it is on (repeatable).",
        ),
    ] = None,
) -> None:
    """Review the files a git range changed (one input per file or hunk), like
    ``duet run --git``; then ``duet results FILE -f sarif`` or ``--patch``.

    Deleted, binary, vendored, .gitignored, excluded, lock, generated and minified files,
    and files holding keys or credentials, are skipped and counted; renames are followed.
    Exit codes as for ``duet run``.
    """
    from duet.commands.intake import check_loaded
    from duet.config import parse_config
    from orchestration.core import review_templates

    if staged and git_range:
        raise ConfigError("give --git or --staged, not both")
    if fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    if staged:
        from duet.intake.gitproc import git_dir, staged_range

        git_range = staged_range(repo)
        output = output or git_dir(repo) / "duet-review.jsonl"
    if not git_range:
        raise ConfigError("duet review needs --git BASE..HEAD (e.g. --git main..HEAD)")
    target = output or Path("review.results.jsonl")
    embedded = not get_settings().redis_url
    if config is None:
        data = review_templates.review_config(actor_model, critic_model)
        cfg = parse_config(data, source=review_templates.SOURCE, base_dir=Path.cwd())
        cfg = check_loaded(cfg, embedded=embedded)
    else:
        cfg = load_checked(config, embedded=embedded)
    try:
        run_loaded(
            cfg,
            None,
            target,
            dry_run=dry_run,
            log_every=log_every,
            git=GitSource(
                git_range,
                repo,
                unit,
                context,
                tuple(exclude or ()),
                include_secrets,
                since or None,
                tuple(with_sarif or ()),
            ),
        )
    except typer.Exit as done:
        # --fail-on: a finding at least that severe fails the review (the pre-commit hook).
        if (
            fail_on != "never"
            and target.is_file()
            and fails(records_of(str(target), None), fail_on, everything=False)
        ):
            error(f"a finding is at least {fail_on!r}: see {target}")
            raise typer.Exit(SOME_FAILED) from None
        raise done


def _write_output_dir(records: Iterable[dict[str, Any]], folder: Path) -> None:
    written, missed = write_outputs(records, folder)
    out.print(plain(f"approved outputs: {written} file(s) in {folder}"))
    for miss in missed[:_MISSED_SHOWN]:
        warn(f"output of {miss.id!r} not written in {folder}: {miss.reason}")
    if len(missed) > _MISSED_SHOWN:
        warn(f"and {len(missed) - _MISSED_SHOWN} more output(s) not written in {folder}")


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

    workers = worker_watch()
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


@app.command(epilog="Example: BATCH=$(duet submit examples/review.toml -i examples/inputs.jsonl)")
@fails_cleanly
def submit(
    config: ConfigArg,
    input: Annotated[
        Path | None,
        typer.Option(
            "--input",
            "-i",
            exists=True,
            show_default=False,
            help="Inputs: a JSONL file, a CSV file, or a directory. Or give --git instead.",
        ),
    ] = None,
    rejected_to: Annotated[
        Path | None,
        typer.Option("--rejected", dir_okay=False, help="Also write rejected inputs here (JSONL)."),
    ] = None,
    strict: StrictOpt = False,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    include_secrets: IncludeSecretsOpt = False,
    vendor_batch: VendorBatchOpt = False,
    git_range: GitOpt = None,
    repo: RepoOpt = Path("."),
    unit: UnitOpt = "file",
    context: ContextOpt = 10,
    cache: CacheOpt = False,
    cache_ttl: CacheTtlOpt = None,
    max_in_flight: MaxInFlightOpt = None,
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
    cfg = load_checked(
        config,
        embedded=False,
        vendor_batch=vendor_batch,
        cache=cache_ttl or ("7d" if cache else None),
        max_in_flight=max_in_flight,
    )
    intake = Intake()
    git = GitSource(git_range, repo, unit, context, tuple(exclude or ()), include_secrets)
    source = input_source(input, git)
    options: dict[str, Any] = {
        "strict": strict,
        "include": include or (),
        "exclude": exclude or (),
        "include_secrets": include_secrets,
    }
    if git.spec:
        options = {"reader": git.reader(cfg, intake)}
    reading = Reading(cfg, source, intake, **options)
    handle = submit_reading(cfg, reading)
    if rejected_to is not None:
        with rejected_to.open("w", encoding="utf-8") as sink:
            for r in intake.rejected:
                sink.write(json_line(rejected_record(r)) + "\n")
    if handle is None:
        raise ConfigError(f"{source}: every input was rejected: nothing queued")
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
def watch(batch: BatchArg, log_every: LogEveryOpt = LOG_EVERY_S, as_json: JsonOpt = False) -> None:
    """Show a batch's progress until it finishes: done/total, outcomes, spend, rate, ETA,
    and what it waits on (a rate limit, a spent budget, no worker on a queue).

    Ctrl-C stops watching (exit 130) and leaves the batch running. Exit code 0 when every
    input was accepted and every run finished well, else 1.
    """
    connect()
    handle = batch_handle(batch)
    if as_json:
        raise exit_for_progress(_watch_json(handle, log_every))

    def finished(p: dict[str, Any], wait_s: float) -> bool:
        if p["done"] >= p["total"]:
            return True
        time.sleep(wait_s)  # the screen's refresh interval
        return False

    workers = worker_watch()
    try:
        p = follow(handle, ProgressView(workers), finished, log_every=log_every)
    except KeyboardInterrupt:
        note(f"stopped watching; the batch keeps running (duet watch {handle.batch_id})")
        raise typer.Exit(INTERRUPTED) from None
    finally:
        if workers is not None:
            workers.stop()
    raise exit_for_progress(p)


def _watch_json(handle: Any, log_every: float) -> dict[str, Any]:
    """``duet watch --json``: the batch's progress as a JSON line whenever it changes (at
    most once a second) and at least every ``log_every`` seconds, the last when it is done."""
    shown: dict[str, Any] | None = None
    at = -float("inf")
    while True:
        p = handle.progress()
        done = p["done"] >= p["total"]
        if done or p != shown or time.monotonic() - at >= log_every:
            emit_json({"batch_id": handle.batch_id, **p})
            shown, at = p, time.monotonic()
        if done:
            return p
        time.sleep(min(1.0, log_every))  # the polling interval


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
            "--output",
            "-o",
            dir_okay=False,
            help="Write here: CSV when the name ends in .csv, else JSONL. Default: JSONL on stdout.",
        ),
    ] = None,
    status: StatusOpt = None,
    timeout: TimeoutOpt = None,
    log_every: LogEveryOpt = LOG_EVERY_S,
    format: FormatOpt = None,
    everything: AllOpt = False,
    fail_on: FailOnOpt = "never",
    patch: PatchOpt = False,
    root: RootOpt = Path("."),
    category: CategoryOpt = None,
    link: LinkOpt = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="JSON lines on stdout, one record each (the default without -o)."
        ),
    ] = False,
) -> None:
    """Stream a batch's records in input order (rejected inputs in their places), each as
    soon as it (and those before it) finished; with --status and no --output, each match
    as soon as its run finishes, in the order runs finish.

    Exit code 0 when every input was accepted and every run finished well; 1 otherwise
    (or when the timeout passed).
    """
    check_status(status)
    if fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    check_results_file(batch)
    if as_json and (output is not None or format is not None or patch):
        raise ConfigError("--json prints JSON lines on stdout: leave out -o, -f and --patch")
    if format is not None or patch:
        write_findings(
            batch,
            format,
            output,
            everything=everything,
            fail_on=fail_on,
            patch=patch,
            root=root,
            timeout=timeout,
            category=category,
            link=link,
        )
        return
    try:
        _results(batch, output, status, timeout, log_every)
    except typer.Exit as done:
        # --fail-on gates records too, not only -f: a finding at least that severe is exit 1.
        if fail_on != "never" and fails(records_of(batch, timeout), fail_on, everything=everything):
            raise typer.Exit(SOME_FAILED) from None
        raise done


def _results(
    batch: str,
    output: Path | None,
    status: list[str] | None,
    timeout: float | None,
    log_every: float,
) -> None:
    """``duet results`` without -f: records in input order, to a file or stdout."""
    if Path(batch).is_file():
        records: Iterable[dict[str, Any]] = by_index(read_records(Path(batch)))
        _write_records(select_status(records, status), output)
        return
    connect()
    handle = batch_handle(batch)
    try:
        if output is None:
            # Following a batch for some outcomes: each match the moment its run finishes.
            live = records_as_they_finish if status else batch_records
            _write_records(select_status(live(handle, timeout), status), None)
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
            sys.stdout.write(json_line(rec) + "\n")
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
        err.print(summary_table(summary))
    raise exit_for(summary)


class _RecordsWithProgress:
    """``duet results BATCH -o FILE``: write records while showing the batch's progress."""

    def __init__(
        self,
        handle: BatchHandle,
        timeout: float | None,
        status: list[str] | None,
        output: Path,
        log_every: float,
    ) -> None:
        self.handle, self.timeout, self.status = handle, timeout, status
        self.output, self.log_every = output, log_every

    def run(self) -> None:
        sink = ResultsFile(self.output)
        done = threading.Event()
        failure: list[BaseException] = []

        def work() -> None:
            try:
                for rec in select_status(batch_records(self.handle, self.timeout), self.status):
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
        err.print(summary_table(sink.summary))
        raise exit_for(sink.summary)


# The other commands register themselves on the app as their modules are imported.
from duet.commands import flower, inspect, worker  # noqa: E402,F401  (after run..results: help order)

app.add_typer(budget_app, name="budget")
app.add_typer(limits_app, name="limits")
app.add_typer(dead_app, name="dead")
app.add_typer(cache_app, name="cache")


def main() -> None:
    """Console-script entry point (``duet``)."""
    import typer.main

    from duet.commands.app import flags_take_no_value

    flags_take_no_value(typer.main.get_command(app))(prog_name="duet")


if __name__ == "__main__":
    main()
