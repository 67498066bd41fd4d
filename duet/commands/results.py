"""Results files for ``duet``: what goes in, what comes out, in which order.

- :class:`Intake` reads the inputs for a batch, numbering every input (``index``) and
  setting aside the rejected ones and those a previous results file already finished
  (``--resume-from``).
- :class:`ResultsFile` writes each record as soon as its run finishes (a crash keeps
  every finished one), then puts the file back in input order.
- :func:`collect` follows the batch's finished-run stream and writes each run once.
- :func:`read_records`: reading a results file back (approved outputs as files:
  :mod:`duet.formats.outputs`).
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from duet.intake.files import (
    BoundedRows,
    InputProblem,
    InputReader,
    RowTooLong,
    bounded_lines,
    long_csv_fields,
)
from duet.report.records import (
    CSV_COLUMNS,
    CSV_JSON,
    CSV_NUMBERS,
    FINISHED_WELL,
    Summary,
    csv_row,
    csv_text,
    is_record,
    result_record,
)
from orchestration.core.errors import ConfigError
from orchestration.core.jsonlimits import depth_reason, too_deep
from orchestration.logjson import json_line

if TYPE_CHECKING:
    from duet.commands.run_cache import RunCache
    from orchestration.client.handles import BatchHandle
    from orchestration.core.architecture import LoopSpec


#: Longest line of a JSONL results file read back: a record is its output, metadata and
#: critiques, far less than this; a longer line is not read into memory.
MAX_RECORD_BYTES = 64 << 20


#: Inputs looked up in the run cache at a time.
LOOKUP_CHUNK = 500
#: With nothing finished for this long, a kept batch's open runs are looked at (a run
#: evicted without Redis counting it, a finished entry lost): seconds.
IDLE_LOOK_S = 30.0


class Intake:
    """The inputs of one batch, read once: items to submit, rejected inputs, carried records.

    Args:
        finished: records of an earlier results file by input id; inputs found there
            finished well are not run again, their records are carried over.
        limit: submit at most this many runs (inputs served from the run cache count).
        cache: the run cache (``duet.commands.run_cache``): inputs it serves are not submitted.
    """

    def __init__(
        self,
        finished: dict[str, dict[str, Any]] | None = None,
        limit: int | None = None,
        cache: RunCache | None = None,
    ) -> None:
        self.finished = finished or {}
        self.limit = limit
        self.cache = cache
        #: Records served from the run cache, with this batch's indexes.
        self.cached: list[dict[str, Any]] = []
        #: Inputs seen so far (valid, rejected or carried): the next input's index.
        self.position = 0
        #: Rejected inputs: index, id, source, line, reason.
        self.rejected: list[dict[str, Any]] = []
        #: Records carried over from ``finished``, with this batch's indexes.
        self.carried: list[dict[str, Any]] = []
        #: The index of each submitted run, in submission order.
        self.run_index: list[int] = []

    def on_problem(self, problem: InputProblem) -> None:
        self.rejected.append(
            {
                "index": self.position,
                "id": problem.id,
                "source": problem.source,
                "line": problem.line,
                "reason": problem.reason,
                "problem": problem,
            }
        )
        self.position += 1

    def items(self, reader: InputReader) -> Iterator[dict[str, Any]]:
        """Items for ``Team.submit_batch``, numbering everything read on the way. With the
        run cache, inputs are looked up :data:`LOOKUP_CHUNK` at a time before any is
        yielded; those it serves go to :attr:`cached`."""
        waiting: list[tuple[int, dict[str, Any]]] = []
        for record in reader:
            taken = len(self.run_index) + len(self.cached) + len(waiting)
            if self.limit is not None and taken >= self.limit:
                break
            index = self.position
            self.position += 1
            earlier = self.finished.get(record.id)
            if earlier is not None:
                self.carried.append({**earlier, "index": index})
                continue
            if self.cache is None:
                self.run_index.append(index)
                yield record.as_item()
                continue
            waiting.append((index, record.as_item()))
            if len(waiting) >= LOOKUP_CHUNK:
                yield from self._looked_up(waiting)
                waiting = []
        yield from self._looked_up(waiting)

    def _looked_up(self, waiting: list[tuple[int, dict[str, Any]]]) -> Iterator[dict[str, Any]]:
        """The items of ``waiting`` the run cache does not serve (noting those it does)."""
        served = self.cache.lookup(waiting) if self.cache is not None and waiting else {}
        for index, item in waiting:
            if index in served:
                self.cached.append(served[index])
            else:
                self.run_index.append(index)
                yield item

    def stored_rejections(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "problem"} for r in self.rejected]


def finished_records(path: Path) -> dict[str, dict[str, Any]]:
    """Records of a results file that finished well, by input id (``--resume-from``)."""
    return {
        str(r["id"]): r
        for r in read_records(path)
        if r.get("status") in FINISHED_WELL and r.get("id") is not None
    }


class ResultsFile:
    """A results file written as runs finish, then sorted into input order.

    Each record is flushed as it is written, so a reader (or a crash) keeps every
    finished record; :meth:`finish` rewrites the file by ``index`` (atomically).
    ``on_write`` is told of each record written (the run cache keeps those of its runs).
    """

    def __init__(
        self, path: Path, on_write: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.path = path
        self.on_write = on_write
        self.as_csv = path.suffix.lower() == ".csv"
        self.summary = Summary()
        self._lock = threading.Lock()
        self._sink: IO[str] = path.open("w", encoding="utf-8", newline="")
        self._csv = csv.writer(self._sink) if self.as_csv else None
        if self._csv is not None:
            self._csv.writerow(CSV_COLUMNS)
            self._sink.flush()

    def write(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._csv is not None:
                self._csv.writerow(csv_row(record))
            else:
                self._sink.write(json_line(record) + "\n")
            self._sink.flush()
            self.summary.add(record)
        if self.on_write is not None:
            self.on_write(record)

    def finish(self) -> None:
        """Close the file and put its records in input order."""
        with self._lock:
            if self._sink.closed:
                return
            self._sink.close()
            (_sort_csv if self.as_csv else _sort_jsonl)(self.path)


def _write_atomically(path: Path, write: Callable[[IO[str]], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            write(out)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sort_key(index: Any, n: int) -> tuple[int, int]:
    return (int(index), n) if str(index).lstrip("-").isdigit() else (1 << 62, n)


def _sort_jsonl(path: Path) -> None:
    """Sort a JSONL results file by ``index``, holding only offsets in memory."""
    spans = []
    with path.open("rb") as src:
        offset = 0
        for n, line in enumerate(src):
            try:
                index = None if too_deep(line.decode()) else json.loads(line).get("index")
            except (ValueError, AttributeError):
                index = None
            spans.append((_sort_key(index, n), offset, len(line)))
            offset += len(line)
    spans.sort()
    with path.open("rb") as src:

        def write(out: IO[str]) -> None:
            for _, at, size in spans:
                src.seek(at)
                out.write(src.read(size).decode("utf-8"))

        _write_atomically(path, write)


def _sort_csv(path: Path) -> None:
    long_csv_fields()
    with path.open(encoding="utf-8", newline="") as src:
        rows = list(csv.reader(src))
    if not rows:
        return
    header, body = rows[0], rows[1:]
    at = header.index("index") if "index" in header else None
    if at is not None:
        body = [r for _, r in sorted((_sort_key(r[at], n), r) for n, r in enumerate(body))]

    def write(out: IO[str]) -> None:
        writer = csv.writer(out)
        writer.writerow(header)
        writer.writerows(body)

    _write_atomically(path, write)


def collect(
    handle: BatchHandle,
    sink: ResultsFile,
    run_index: list[int],
    spec: LoopSpec | None,
    stop: threading.Event,
) -> None:
    """Write each run of the batch to ``sink`` as it finishes, until all are written or
    ``stop`` is set (see :func:`as_they_finish`)."""
    for rec in as_they_finish(handle, run_index, spec, stop=stop):
        sink.write(rec)


def as_they_finish(
    handle: BatchHandle,
    run_index: list[int],
    spec: LoopSpec | None,
    *,
    stop: threading.Event | None = None,
    timeout: float | None = None,
) -> Iterator[dict[str, Any]]:
    """Each run's record of the batch in the order the runs finish, each once, until all
    are given, ``stop`` is set or ``timeout`` passes (RunTimeout). Runs are read from the
    batch's finished-run stream; ``run_index`` maps a run's position to its input index.
    A handle that keeps its inputs also looks for runs an evicting Redis lost (sent again
    under new ids) or whose finished entry it lost (:meth:`BatchHandle.repair`)."""
    import time

    from orchestration.client.handles import result_turns, store
    from orchestration.core.errors import RunTimeout
    from orchestration.core.results import FINISHED_STATUSES
    from orchestration.state import batches

    st = store()
    kept = handle.kept
    positions = {} if kept is not None else batches.run_positions(st.r, handle.batch_id)
    position_of = kept.position_of if kept is not None else positions.get
    total = len(kept) if kept is not None else len(positions)
    deadline = None if timeout is None else time.monotonic() + timeout
    given: set[int] = set()
    last = "0-0"
    moved = time.monotonic()
    while len(given) < total and not (stop is not None and stop.is_set()):
        wait_ms = 500
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunTimeout(f"batch {handle.batch_id} did not finish within {timeout:g}s")
            wait_ms = max(1, min(wait_ms, int(left * 1000)))
        seen = []
        for entry, run_id, _ in batches.finished_since(
            st.r, handle.batch_id, last, block_ms=wait_ms
        ):
            last = entry
            seen.append(run_id)
        if kept is not None:
            # Evictions seen, or nothing finished for a while: look at every open run.
            handle.repair(force=time.monotonic() - moved >= IDLE_LOOK_S)
            seen += kept.take_found()
        for run_id in seen:
            position = position_of(run_id)
            if position is None or position in given:
                continue
            try:
                result = st.result(run_id)
            except LookupError:
                continue  # evicted since it finished: a sweep sends it again
            if result.status not in FINISHED_STATUSES:
                continue  # resumed since it finished; it finishes again later
            if kept is not None:
                kept.saw_finished(run_id, result.status)
            index = run_index[position] if position < len(run_index) else None
            given.add(position)
            moved = time.monotonic()
            yield result_record(result, index=index, spec=spec, turns=result_turns(result))


def read_records(path: Path, max_line_bytes: int = MAX_RECORD_BYTES) -> Iterator[dict[str, Any]]:
    """The records of a results file (JSONL or CSV written by ``duet``).

    Raises:
        ConfigError: a line that is not a result record (e.g. an input file given by
            mistake), not UTF-8, longer than ``max_line_bytes`` or nested too deep.
    """
    if path.suffix.lower() == ".csv":
        yield from _read_csv_records(path)
        return
    with path.open("rb") as lines:
        for n, raw, size in bounded_lines(lines, max_line_bytes):
            if raw is None:
                raise ConfigError(
                    f"{path}:{n}: not a results record: {size:,} bytes, over the limit of "
                    f"{max_line_bytes:,}"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{path}:{n}: not UTF-8 text (byte {exc.start + 1})") from None
            if not line.strip():
                continue
            if too_deep(line):
                raise ConfigError(f"{path}:{n}: not a results record: {depth_reason()}")
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n}: not a results record: {exc.msg}") from None
            if not is_record(record):
                raise ConfigError(
                    f"{path}:{n}: not a results record (no status, id and usage): is this an "
                    "input file? Give a file written by `duet run -o` or `duet results -o`"
                )
            yield record


def _read_csv_records(path: Path) -> Iterator[dict[str, Any]]:
    long_csv_fields()
    with path.open(encoding="utf-8", newline="") as src:
        lines = BoundedRows(src, MAX_RECORD_BYTES)  # rows of at most this many characters
        try:
            yield from _csv_records(path, lines, csv.DictReader(lines))
        except RowTooLong as exc:
            raise ConfigError(
                f"{path}:{lines.count}: not a results record: {exc.size:,} characters, over "
                f"the limit of {MAX_RECORD_BYTES:,}"
            ) from None
        except csv.Error as exc:
            raise ConfigError(f"{path}:{lines.count}: not a results CSV: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}:{lines.count + 1}: not UTF-8 text") from None


def _csv_records(
    path: Path, lines: BoundedRows, rows: csv.DictReader[str]
) -> Iterator[dict[str, Any]]:
    if not {"id", "status", "usd"} <= set(rows.fieldnames or ()):
        raise ConfigError(f"{path}:1: not a results CSV (no id, status and usd columns)")
    while True:
        lines.start_row()
        row = next(rows, None)
        if row is None:
            return
        line = rows.line_num
        record: dict[str, Any] = {k: _from_cell(k, v) for k, v in row.items()}
        record["usage"] = {
            k: record.pop(k, None) for k in ("input_tokens", "output_tokens", "calls", "usd")
        }
        for key in CSV_JSON:
            record[key] = _json_cell(row.get(key) or "", f"{path}:{line}: {key}")
        actor, critic = record.pop("actor_model", None), record.pop("critic_model", None)
        record["models"] = {"actor": actor, "critic": critic} if actor or critic else None
        yield record


def _from_cell(column: str | None, value: str | None) -> Any:
    """A cell as written: a number in a number column, else its text exactly."""
    if value is None or value == "":
        return None
    if column not in CSV_NUMBERS:
        return csv_text(value)
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def _json_cell(raw: str, where: str) -> Any:
    if not raw.startswith(("[", "{")):
        return None
    if too_deep(raw):
        raise ConfigError(f"{where}: {depth_reason()}")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON: {exc.msg}") from None
