"""``duet ls``, ``show``, ``report``, ``cancel`` and ``resume``: looking at and acting on
batches and runs already submitted."""

from __future__ import annotations

import difflib
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from duet.commands.app import BatchArg, RunArg, TimeoutOpt, app
from duet.commands.batch import batch_handle, batch_records
from duet.commands.progress import COLOURS
from duet.commands.results import (
    read_records,
)
from duet.commands.support import (
    SOME_FAILED,
    JsonOpt,
    clean,
    connect,
    emit_json,
    err,
    error,
    fails_cleanly,
    note,
    out,
    plain,
    print_whole,
)
from duet.report.html import render_report
from duet.report.records import (
    LABELS,
    OUTCOMES,
    Summary,
    by_index,
    kept_note,
)
from duet.report.turns import call_outcome, step_turns, tool_turns
from duet.short_ids import shortest_unique
from orchestration.core.completion import refusal_line
from orchestration.core.errors import ConfigError, RunTimeout
from orchestration.core.loop import ROLE_OF, parse_step_key

if TYPE_CHECKING:
    from orchestration.core.results import RunResult


@app.command("ls", epilog="Example: duet ls --limit 5")
@fails_cleanly
def ls(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many batches.")] = 20,
    wide: Annotated[
        bool,
        typer.Option("--wide", help="Whole batch ids instead of their shortest unique prefix."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """List the newest batches: when, counts by outcome, rejected inputs, spend.

    Each batch id is shown by its shortest unique prefix (8 characters at least), which
    every command accepts in place of the whole id.
    """
    connect()
    from orchestration.state import batches, connection, lookup

    r = connection.get_redis()
    found = batches.recent(r, limit)
    if as_json:
        for batch_id, rec in found:
            row = _ls_row(r, batch_id, rec)
            emit_json({"batch_id": batch_id, **row})
        return
    if not found:
        out.print("no batches")
        return
    short = {} if wide else shortest_unique(lookup.batch_ids(r))
    rows = [(short.get(batch_id, batch_id), _ls_row(r, batch_id, rec)) for batch_id, rec in found]
    print_whole(ls_table(rows))


#: The outcomes column wraps at this width, so `duet ls` fits an 80-column terminal.
_OUTCOMES_WIDTH = 26


def ls_table(rows: list[tuple[str, dict[str, Any]]]) -> Table:
    """``duet ls``'s table of (shown id, row) pairs: 80 columns wide with 8-character ids
    (submitted to the minute, rejected inputs among the outcomes, which wrap)."""
    table = Table(title="Batches, newest first", title_justify="left")
    table.add_column("batch", no_wrap=True)
    table.add_column("submitted", no_wrap=True)
    table.add_column("done", justify="right", no_wrap=True)
    table.add_column("outcomes", max_width=_OUTCOMES_WIDTH)
    table.add_column("cost", justify="right", no_wrap=True)
    for shown, row in rows:
        outcomes = _outcomes(row["outcomes"])
        if row["rejected"] and not row["outcomes"].get("rejected"):
            outcomes.append(f"rejected {row['rejected']}", style=COLOURS["rejected"])
        table.add_row(
            plain(shown),
            row["submitted"][5:16],  # MM-DD HH:MM; --json has the whole time
            f"{row['done']}/{row['total']}",
            outcomes,
            f"${row['usd']:.4f}",
        )
    return table


def _ls_row(r: Any, batch_id: str, rec: dict[str, str]) -> dict[str, Any]:
    """One batch of ``duet ls``: its counts, submission time (local, to the second), spend."""
    from orchestration.state import batches

    outcomes = {
        k.split(":", 1)[1]: int(v) for k, v in rec.items() if k.startswith("status:") and int(v)
    }
    submitted = datetime.fromtimestamp(float(rec.get("created_at") or 0))
    return {
        "submitted": submitted.strftime("%Y-%m-%d %H:%M:%S"),
        "done": int(rec.get("done", 0)),
        "total": int(rec.get("total", 0)),
        "outcomes": outcomes,
        "rejected": batches.rejected_count(r, batch_id),
        "usd": float(rec.get("usd") or 0),
    }


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
    as_json: JsonOpt = False,
) -> None:
    """Show one run: each round's score, issues and summary, and what each revision changed."""
    connect()
    from duet.commands import ids
    from orchestration.client.handles import agent_turns, store

    result = store().result(ids.run_id(run_id))
    if as_json:
        emit_json(result.model_dump(mode="json"))
        return
    turns = tool_turns(agent_turns(result.run_id))
    out.print(_run_header(result))
    if draft := _tool_lines(turns, "r0.generate"):
        out.print(Panel(Group(*draft), title="draft: tool calls"))
    previous = result.rounds[0].judged_output if result.rounds else result.output
    for rnd in result.rounds:
        score = f"{rnd.score:.2f}" if rnd.score is not None else "-"
        body: list[Any] = _tool_lines(turns, f"r{rnd.round}.critique")
        body += [plain(rnd.summary or "(no summary)")]
        body += [plain(f"• {issue}", style="yellow") for issue in rnd.issues]
        body += _tool_lines(turns, f"r{rnd.round}.refine")
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
        kept = _kept(result)
        title = f"kept output: {kept}" if kept else "final output"
        out.print(Panel(plain(text), title=title, title_align="left"))


#: Characters of a tool result shown per call.
TOOL_RESULT_SHOWN = 160


def _tool_lines(turns: list[dict[str, Any]], step: str) -> list[Any]:
    """One line per tool call of a step's recorded turns (:func:`tool_turns`): the turn, the
    tool and its arguments, and how its result began (model and tool output: plain text)."""
    role = ROLE_OF[parse_step_key(step)[0]]
    lines: list[Any] = []
    for turn in step_turns(turns, step):
        for call in turn["calls"]:
            args = call["arguments"][:TOOL_RESULT_SHOWN]
            if call["arguments_chars"] > len(args):
                args += "…"
            outcome = call_outcome(call, TOOL_RESULT_SHOWN)
            line = f"⚙ {role} turn {turn['turn']}: {call['name']} {args} → {outcome}"
            lines.append(plain(line, style="cyan"))
    return lines


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
        *([("kept", kept)] if (kept := _kept(result)) else []),
        ("reason", result.interruption_reason or "-"),
        ("error", refusal_line(result.interruption_reason, result.error) or result.error or "-"),
        (
            "usage",
            f"{usage.input_tokens:,} in, {usage.output_tokens:,} out, "
            f"{usage.calls} calls, ${usage.usd:.4f}"
            + (f", {usage.tool_calls} tool calls" if usage.tool_calls else "")
            + (
                f"; {usage.cached_calls} cached steps (served from the model-call "
                f"cache, ${usage.saved_usd:.4f} saved)"
                if usage.cached_calls
                else ""
            ),
        ),
    ]
    for name, value in rows:
        table.add_row(name, value if isinstance(value, Text) else plain(value))
    return table


def _kept(result: RunResult) -> str | None:
    return kept_note(result.keep, result.output_round, result.best_round, result.final_score)


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
    inputs: Annotated[
        Path | None,
        typer.Option(
            "--inputs",
            exists=True,
            help="The input file or folder the results came from, for each output's diff "
            "from its input (a batch on the cluster has its inputs already).",
        ),
    ] = None,
) -> None:
    """Write one self-contained HTML page to triage a batch from: every input not approved,
    worst first, with its final-round issues, final output and diff from its input; issues
    and reasons grouped across inputs; outcomes, scores, rounds, cost, time, models, dates.

    Reads a results file directly (no cluster needed), or a batch on the cluster,
    waiting for it to finish. Exit code 0 once the page is written (whatever the batch's
    outcomes: `duet results` and `duet watch` exit by those), 1 on a timeout, 2 when the
    file is not a results file.
    """
    prompts: dict[str, str] = {}
    if Path(batch).is_file():
        records: list[dict[str, Any]] = list(by_index(read_records(Path(batch))))
        title = f"Duet report: {Path(batch).name}"
    else:
        connect()
        handle = batch_handle(batch)
        with err.status(plain(f"Waiting for batch {batch} to finish")):
            try:
                records = list(batch_records(handle, timeout))
            except RunTimeout as exc:
                error(str(exc))
                raise typer.Exit(SOME_FAILED) from None
        title = f"Duet report: batch {handle.batch_id}"
        prompts = _stored_prompts(records)
    if not records:
        raise ConfigError(f"{batch}: no records to report on")
    if inputs is not None:
        prompts.update(_file_prompts(inputs))
    summary = Summary()
    for rec in records:
        summary.add(rec)
    output.write_text(render_report(records, title=title, inputs=prompts), encoding="utf-8")
    note(f"report: {output} ({summary.total} input(s))")


def _stored_prompts(records: list[dict[str, Any]]) -> dict[str, str]:
    """Input id -> prompt, read from the cluster for the runs not approved (the diffs)."""
    from orchestration.client.handles import store

    wanted = [r for r in records if r.get("status") != "approved" and r.get("run_id")]
    prompts = store().prompts([str(r["run_id"]) for r in wanted])
    return {
        str(r["id"]): prompt
        for r, prompt in zip(wanted, prompts, strict=True)
        if prompt is not None and r.get("id") is not None
    }


def _file_prompts(path: Path) -> dict[str, str]:
    """Input id -> prompt, from an input file or folder (its readable inputs only)."""
    from duet.intake.files import InputReader

    return {record.id: record.prompt for record in InputReader(path)}


@app.command(epilog="Example: duet cancel 4c9e34663fac4c9d8513fd84d3ff8b17")
@fails_cleanly
def cancel(
    id: Annotated[
        str,
        typer.Argument(
            help="A batch id or a run id, or a unique prefix of one.", show_default=False
        ),
    ],
) -> None:
    """Cancel a batch (every unfinished run) or one run; each stops after its current step."""
    connect()
    from duet.commands import ids
    from orchestration.client.handles import BatchHandle, RunHandle

    kind, ident = ids.batch_or_run(id)
    if kind == "run":
        flagged = RunHandle(ident).cancel()
        out.print(plain(f"run {ident}: {'cancelled' if flagged else 'already finished'}"))
        return
    out.print(plain(f"batch {ident}: cancelled {BatchHandle(ident).cancel()} unfinished run(s)"))


@app.command(
    epilog="Example: duet resume 4c9e3466   (after raising its budget: duet resume 4c9e3466 "
    "--interrupted)"
)
@fails_cleanly
def resume(
    batch: BatchArg,
    interrupted: Annotated[
        bool,
        typer.Option(
            "--interrupted",
            help="Also re-run the batch's interrupted runs from where each stopped, once the "
            "cause is fixed (a budget raised, a key set): the step that stopped a run runs "
            "again, its other steps are kept.",
        ),
    ] = False,
) -> None:
    """Re-enqueue every unfinished run of a batch (after a crash, or to undo a cancel).

    Safe at any time: stored steps are never repeated.
    """
    connect()
    handle = batch_handle(batch)
    line = f"batch {handle.batch_id}: re-enqueued {handle.resume()} unfinished run(s)"
    if interrupted:
        line += f", re-running {handle.resume(interrupted=True)} interrupted run(s)"
    out.print(plain(line))
