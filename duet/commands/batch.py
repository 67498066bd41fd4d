"""A submitted batch read back for the terminal: its handle and loop, its records in
input order with its rejected inputs in their places, the summary table and exit codes
every command shares, and the watch on which queues have a worker."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table
from rich.text import Text

from duet.commands.progress import COLOURS, WorkerWatch, duration
from duet.commands.support import (
    OK,
    SOME_FAILED,
    plain,
)
from duet.report.records import (
    FINISHED_WELL,
    LABELS,
    OUTCOMES,
    Summary,
    rejected_record,
    result_record,
)
from orchestration.settings import get_settings

if TYPE_CHECKING:
    from orchestration.client.handles import BatchHandle
    from orchestration.core.architecture import LoopSpec


#: Interruption reasons listed in the summary (most frequent first).
SHOWN_REASONS = 5


def batch_handle(batch_id: str) -> BatchHandle:
    """A handle on an existing batch, named by its id or a unique prefix of it
    (LookupError when there is none, or the prefix names several)."""
    from duet.commands import ids
    from orchestration.client.handles import BatchHandle

    handle = BatchHandle(ids.batch_id(batch_id))
    handle.progress()
    return handle


def spec_of(handle: BatchHandle) -> LoopSpec | None:
    from orchestration.client.handles import store
    from orchestration.state import keys

    spec_id = store().r.hget(keys.batch(handle.batch_id), "spec_id")
    try:
        return store().load_spec(spec_id) if spec_id else None
    except LookupError:
        return None


def worker_watch() -> WorkerWatch | None:
    """On a cluster, a watch on which queues have no worker (None on the embedded default)."""
    if not get_settings().redis_url:
        return None
    from orchestration.client.handles import queues_without_workers

    return WorkerWatch(queues_without_workers).start()


def batch_records(handle: BatchHandle, timeout: float | None = None) -> Iterable[dict[str, Any]]:
    """A batch's records in input order, its stored rejected inputs in their places,
    each run's as soon as it (and those before it) finished."""
    from orchestration.client.handles import result_turns

    spec = spec_of(handle)
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
        yield result_record(result, index=index, spec=spec, turns=result_turns(result))
        index += 1
    while nxt is not None:
        yield rejected_record(nxt, batch_id=handle.batch_id)
        nxt = next(pending, None)


def records_as_they_finish(
    handle: BatchHandle, timeout: float | None = None
) -> Iterable[dict[str, Any]]:
    """A batch's records as its runs finish, not in input order: its rejected inputs
    first, then each run's the moment it finishes (for following a live batch)."""
    from duet.commands.results import as_they_finish

    rejected = handle.rejected()
    for rec in rejected:
        yield rejected_record(rec, batch_id=handle.batch_id)
    taken = {r["index"] for r in rejected}
    runs = len(handle.run_ids())
    run_index = [i for i in range(runs + len(taken)) if i not in taken]
    yield from as_they_finish(handle, run_index, spec_of(handle), timeout=timeout)


def summary_table(summary: Summary, wall_s: float | None = None) -> Table:
    table = Table(title="Summary", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    if summary.simulated:
        table.add_row(
            "SIMULATED",
            plain(f"{summary.simulated} run(s) on the offline sim model: no real model read them"),
            style="yellow",
        )
    for outcome in OUTCOMES:
        table.add_row(LABELS[outcome], Text(str(summary.counts[outcome]), style=COLOURS[outcome]))
    table.add_row("inputs", str(summary.total))
    mean = summary.mean_rounds
    table.add_row("mean rounds", f"{mean:.2f}" if mean is not None else "-")
    table.add_row(
        "tokens", f"{summary.tokens:,} ({summary.input_tokens:,} in, {summary.output_tokens:,} out)"
    )
    table.add_row("model calls", f"{summary.calls:,}")
    if summary.cached_calls:
        table.add_row(
            "from cache",
            f"{summary.cached_calls:,} calls served from cache, ${summary.saved_usd:.4f} saved",
        )
    table.add_row("cost", f"${summary.usd:.4f}")
    if wall_s is not None:
        table.add_row("wall time", duration(wall_s))
    for n, (why, count) in enumerate(summary.reasons.most_common(SHOWN_REASONS)):
        table.add_row("why not" if n == 0 else "", plain(f"{count} × {why}", style="magenta"))
    return table


def exit_for(summary: Summary) -> typer.Exit:
    return typer.Exit(OK if summary.ok and summary.total else SOME_FAILED)


def exit_for_progress(p: dict[str, Any]) -> typer.Exit:
    well = all(s in FINISHED_WELL for s, n in p["counts"].items() if n)
    return typer.Exit(OK if well and not p.get("rejected") else SOME_FAILED)


def select_status(
    records: Iterable[dict[str, Any]], status: list[str] | None
) -> Iterable[dict[str, Any]]:
    return records if not status else (r for r in records if r.get("status") in status)
