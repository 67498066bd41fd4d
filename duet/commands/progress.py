"""Following a batch on screen: a live bar on a terminal, one log line per interval
anywhere else, and what the batch waits on (rate limits, a spent budget, no worker).

Used by ``duet run``, ``watch`` and ``results``. The numbers come from
``BatchHandle.progress()``; whether any worker consumes Duet's queues is asked over the
broker on a thread of its own, so a slow answer never holds the screen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from duet.commands.support import clean, current_log_format, err, plain, record
from duet.report.records import LABELS, OUTCOMES

if TYPE_CHECKING:
    from orchestration.client.handles import BatchHandle

#: Seconds between screen refreshes on a terminal (a refresh, not a synchronisation).
REFRESH_S = 0.2
#: Default seconds between progress lines when stderr is not a terminal.
LOG_EVERY_S = 10.0
#: Seconds a queue must go without a consumer before it is reported.
WORKER_GRACE_S = 5.0
#: Seconds between asking the broker which queues have workers.
WORKER_CHECK_S = 5.0
#: Outcome -> colour on screen.
COLOURS = {
    "approved": "green",
    "max_rounds_reached": "yellow",
    "interrupted": "magenta",
    "failed": "red",
    "cancelled": "bright_black",
    "rejected": "red",
}


class Rate:
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


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class WorkerWatch:
    """Asks the broker, every few seconds on a daemon thread, which of Duet's queues no
    worker consumes; :meth:`missing` names them once that has lasted the grace period."""

    def __init__(self, ask: Callable[[], list[str]], *, grace_s: float = WORKER_GRACE_S) -> None:
        self.ask = ask
        self.grace_s = grace_s
        self._since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="duet-workers", daemon=True)

    def start(self) -> WorkerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                idle = set(self.ask())
            except Exception:  # noqa: BLE001 - a broker hiccup says nothing about workers
                idle = set(self._since)
            now = time.monotonic()
            self._since = {q: self._since.get(q, now) for q in idle}
            self._stop.wait(WORKER_CHECK_S)

    def missing(self) -> list[str]:
        now = time.monotonic()
        return sorted(q for q, t in self._since.items() if now - t >= self.grace_s)


def waits_of(p: dict[str, Any], workers: WorkerWatch | None) -> list[str]:
    """Everything the batch waits on now, in words."""
    waits = list(p.get("waits") or [])
    if workers is not None and p["done"] < p["total"]:
        idle = workers.missing()
        if idle:
            waits.insert(
                0,
                f"no worker is consuming queue {', '.join(idle)}: start one (duet worker) "
                "or check DUET_REDIS_URL / DUET_BROKER_URL",
            )
    return waits


def counts_text(counts: dict[str, int], rejected: int = 0) -> Text:
    text = Text()
    for outcome in OUTCOMES:
        n = rejected if outcome == "rejected" else counts.get(outcome, 0)
        if n:
            text.append(f"{LABELS[outcome]} {n}  ", style=COLOURS[outcome])
    return text


def spend_text(p: dict[str, Any]) -> Text:
    """What the batch spent, each figure once with its label: tokens, then dollars (out
    of the batch budget when it has one), then any other unit the budget limits."""
    budget = p.get("budget") or {}
    text = Text(f"{p['tokens']:,} tokens")
    for unit, b in {"usd": budget.get("usd"), **budget}.items():
        if unit == "usd" and b is None:
            text.append(f"  spent ${p['usd']:.4f}")
            continue
        share = b["spent"] / b["limit"] if b["limit"] else 1.0
        style = "red" if share >= 1 else "yellow" if share >= 0.8 else ""
        if unit == "usd":
            text.append(f"  spent ${b['spent']:.4f} of a ${b['limit']:.2f} budget", style=style)
        else:
            text.append(f"  budget {unit}: {b['spent']:,.0f} of {b['limit']:,.0f}", style=style)
    return text


class ProgressView:
    """The live view of a batch: bar, counts by outcome, spend, rate, ETA and waits."""

    def __init__(self, workers: WorkerWatch | None = None) -> None:
        self.workers = workers
        self.rate = Rate()
        self.progress = Progress(
            TextColumn("[bold]batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
        )
        self.task = self.progress.add_task("batch", total=None)
        self.detail = Text()
        self.waits: list[str] = []
        self.last: dict[str, Any] | None = None

    def __rich__(self) -> Group:
        lines = [plain(f"waiting: {w}", style="yellow") for w in self.waits]
        return Group(self.progress, self.detail, *lines)

    def update(self, p: dict[str, Any]) -> None:
        self.last = p
        self.rate.add(p["done"], time.monotonic())
        self.progress.update(self.task, total=p["total"], completed=p["done"])
        detail = counts_text(p["counts"], p.get("rejected", 0))
        detail.append("| ")
        detail.append_text(spend_text(p))
        rate = self.rate.per_minute()
        if rate is not None:
            detail.append(f"  | {rate:,.1f} runs/min")
            eta = self.rate.eta_s(p["total"] - p["done"])
            if eta is not None and p["done"] < p["total"]:
                detail.append(f"  ETA {duration(eta)}")
        self.detail = detail
        self.waits = waits_of(p, self.workers)

    def line(self) -> str:
        """The current state as one log line (for a file or a pipe)."""
        p = self.last or {"done": 0, "total": 0, "counts": {}, "tokens": 0, "usd": 0.0}
        share = f" ({p['done'] / p['total']:.0%})" if p["total"] else ""
        parts = [f"{datetime.now():%H:%M:%S} {p['done']}/{p['total']} done{share}"]
        counts = counts_text(p["counts"], p.get("rejected", 0)).plain.strip()
        if counts:
            parts.append(counts.replace("  ", ", "))
        parts.append(spend_text(p).plain.replace("  ", ", "))
        rate = self.rate.per_minute()
        if rate is not None:
            eta = self.rate.eta_s(p["total"] - p["done"])
            parts.append(f"{rate:,.1f} runs/min" + (f", ETA {duration(eta)}" if eta else ""))
        parts += [f"waiting: {w}" for w in self.waits]
        return clean(" | ".join(parts))


def follow(
    handle: BatchHandle,
    view: ProgressView,
    finished: Callable[[dict[str, Any], float], bool],
    *,
    log_every: float = LOG_EVERY_S,
) -> dict[str, Any]:
    """Show ``handle.progress()`` until ``finished(progress, wait_s)`` says so.

    On a terminal: a live view refreshed every :data:`REFRESH_S`. Elsewhere (a file, a
    pipe, CI): one line at the start, one per ``log_every`` seconds, one at the end; with
    JSON logs (``--log-format json``) each of those lines is a log record.
    ``finished`` also paces the loop: it waits up to ``wait_s`` before answering.
    """
    json_logs = current_log_format() == "json"

    def log(line: str) -> None:
        if json_logs:
            record(line, batch_id=handle.batch_id)
        else:
            err.print(line, markup=False, highlight=False, soft_wrap=True)

    if err.is_terminal and not json_logs:
        with Live(view, console=err, refresh_per_second=8) as live:
            while True:
                view.update(handle.progress())
                live.refresh()
                if finished(view.last or {}, REFRESH_S):
                    break
            p = handle.progress()
            view.update(p)
            live.refresh()
        return p
    logged, logged_state = -float("inf"), None
    while True:
        view.update(handle.progress())
        if time.monotonic() - logged >= log_every:
            log(view.line())
            logged, logged_state = time.monotonic(), _state(view.last)
        if finished(view.last or {}, min(REFRESH_S * 5, log_every)):
            break
    p = handle.progress()
    view.update(p)
    if _state(p) != logged_state:  # a batch finished at the first look: its line once
        log(view.line())
    return p


def _state(p: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What a progress line says, but its clock: two lines of one state are one line."""
    if p is None:
        return None
    return tuple(repr(p.get(k)) for k in ("done", "total", "counts", "rejected", "usd", "tokens"))
