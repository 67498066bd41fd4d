"""What each fault and bad-input test tried, under what load, and what was lost — recorded
by the tests themselves and rendered into docs/RELIABILITY.md.

A test asks for the ``reliability`` fixture and, once it has measured and *before* it
asserts, records its row::

    reliability.record(section="The engine", fault="Redis killed mid-batch",
                       load=f"{RUNS} runs on 2 workers", lost=lost_of(stranded, RUNS, "runs"))

The row keeps the test's outcome: a test that fails or xfails after recording shows in
the doc as such, never as "nothing". At the end of the session the rows and the outcome
of every test that asked for the fixture are written as JSON (``DUET_RELIABILITY_OUT``,
default ``.reliability/rows.json``). ``python -m tests.reliability render`` turns that JSON
and the hand-written part (:data:`SOURCE`) into docs/RELIABILITY.md, listing every
recording test that has no row in this run; ``python -m tests.reliability refresh``
re-renders only the hand-written part of the committed doc. ``make reliability`` runs the
tests (``-m reliability``: every test that asks for the fixture) and renders.
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The hand-written part of docs/RELIABILITY.md: intro and guarantees, then MARKER, then
#: what follows the tables.
SOURCE = ROOT / "docs" / "reliability-guarantees.md"
DOC = ROOT / "docs" / "RELIABILITY.md"
MARKER = "<!-- the faults-tried tables go here -->"
BEGIN, END = "<!-- generated: begin -->", "<!-- generated: end -->"
FIXTURE = "reliability"
#: The doc's sections, in order; a row names one of them.
SECRETS = "Secrets"
CLIENTS = "Redis and the clients"
EMBEDDED = "The embedded default"
PACKAGING = "Packaging"
MODEL_OUTPUT = "Untrusted model output"
ENGINE = "The engine: runs, steps, model calls, budgets"
FILES = "Files, patches and output"
SECTIONS = (SECRETS, CLIENTS, EMBEDDED, PACKAGING, MODEL_OUTPUT, FILES, ENGINE)


def out_path() -> Path:
    return Path(os.environ.get("DUET_RELIABILITY_OUT", ROOT / ".reliability" / "rows.json"))


def lost_of(count: int, total: int, what: str) -> str:
    """``"nothing"`` when ``count`` is 0, else ``"{count} of {total} {what}"``."""
    return "nothing" if count == 0 else f"{count} of {total} {what}"


@dataclass
class Row:
    section: str
    fault: str
    load: str
    lost: str
    test: str
    before: str | None = None
    outcome: str = "not finished"
    message: str = ""


@dataclass
class _Cases:
    """Generated cases of one property: how many ran, how many broke it."""

    section: str
    fault: str
    before: str | None
    total: int = 0
    failed: int = 0

    def row(self, test: str) -> Row:
        lost = lost_of(self.failed, self.total, "cases broke the property")
        load = f"{self.total} generated cases"
        return Row(self.section, self.fault, load, lost, test, self.before)


@dataclass
class Reliability:
    """The ``reliability`` fixture: records this test's rows."""

    test: str
    rows: list[Row] = field(default_factory=list)
    cases: dict[tuple[str, str], _Cases] = field(default_factory=dict)

    def record(
        self, *, section: str, fault: str, load: str, lost: str, before: str | None = None
    ) -> None:
        """One row: the fault, the load it met (measured), what was lost (from the test's
        counts), and optionally what happened before the fix (history, not measured)."""
        if section not in SECTIONS:
            raise ValueError(f"unknown section {section!r}: one of {SECTIONS}")
        self.rows.append(Row(section, fault, load, lost, self.test, before))

    @contextlib.contextmanager
    def case(self, *, section: str, fault: str, before: str | None = None) -> Iterator[None]:
        """Count one generated case of a property test (a failure raised inside counts as
        a case that broke it); the row is written when the test ends."""
        if section not in SECTIONS:
            raise ValueError(f"unknown section {section!r}: one of {SECTIONS}")
        cases = self.cases.setdefault((section, fault), _Cases(section, fault, before))
        cases.total += 1
        try:
            yield
        except Exception:  # a broken property (hypothesis's own signals are not Exceptions)
            cases.failed += 1
            raise

    def finished(self) -> list[Row]:
        return self.rows + [c.row(self.test) for c in self.cases.values()]


# --- the pytest plugin (tests/conftest.py imports these) ------------------------------------

_SESSION = pytest.StashKey[dict[str, Any]]()
_RECORDER = pytest.StashKey[Reliability]()


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Reliability:
    """Records this test's rows of docs/RELIABILITY.md (see tests/reliability.py)."""
    recorder = Reliability(request.node.nodeid)
    request.node.stash[_RECORDER] = recorder
    return recorder


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{FIXTURE}: records rows of docs/RELIABILITY.md")
    config.stash[_SESSION] = {"started": time.time(), "outcomes": {}, "rows": []}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Before `-m` deselects: `-m reliability` runs exactly the tests that record rows.
    for item in items:
        if FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(FIXTURE)


def _message(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        text = str(report.wasxfail)
    elif report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2]).removeprefix("Skipped: ")
    else:
        crash = getattr(report.longrepr, "reprcrash", None)
        text = str(getattr(crash, "message", report.longreprtext))
    # The reason, not a dump it quotes (a log, a list of counts).
    text = re.split(r": [\[{(]['\"]?", " ".join(text.split()), maxsplit=1)[0]
    return text if len(text) <= 200 else text[:197] + "..."


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    if FIXTURE not in getattr(item, "fixturenames", ()):
        return report
    state = item.config.stash[_SESSION]
    outcomes: dict[str, dict[str, str]] = state["outcomes"]
    seen = outcomes.setdefault(item.nodeid, {"outcome": "not run", "message": ""})
    if hasattr(report, "wasxfail"):
        seen.update(outcome="xfail", message=_message(report))
    elif report.failed:
        failed = "failed" if report.when == "call" else f"error at {report.when}"
        if seen["outcome"] not in ("failed", "error at setup"):
            seen.update(outcome=failed, message=_message(report))
    elif report.skipped:
        seen.update(outcome="skipped", message=_message(report))
    elif report.when == "call":
        seen["outcome"] = "passed"
    if report.when == "teardown":
        recorder = item.stash.get(_RECORDER, None)
        for row in recorder.finished() if recorder else []:
            row.outcome, row.message = seen["outcome"], seen["message"]
            state["rows"].append(asdict(row))
    return report


def _part_path(worker: str) -> Path:
    """Where a pytest-xdist worker leaves its outcomes and rows for the controller."""
    path = out_path()
    return path.with_name(f"{path.stem}.{worker}{path.suffix}")


def merge_parts(state: dict[str, Any]) -> None:
    """Fold the parts xdist workers wrote this session into the controller's ``state``."""
    for part in sorted(out_path().parent.glob(f"{out_path().stem}.gw*{out_path().suffix}")):
        data = json.loads(part.read_text())
        if data["started"] >= state["started"]:
            state["outcomes"].update(data["outcomes"])
            state["rows"].extend(data["rows"])
        part.unlink()


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(_SESSION, None)
    if not state:
        return
    worker = getattr(session.config, "workerinput", {}).get("workerid")
    if worker is not None:  # an xdist worker: the controller writes the file
        if state["outcomes"]:
            path = _part_path(worker)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({k: state[k] for k in ("started", "outcomes", "rows")}))
        return
    merge_parts(state)
    if not state["outcomes"]:
        return
    args = [str(a) for a in session.config.invocation_params.args]
    data = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "command": "python -m pytest " + shlex.join(args),
        "duration_s": round(time.time() - state["started"]),
        "commit": _commit(),
        "outcomes": state["outcomes"],
        "rows": state["rows"],
    }
    path = out_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit} (with uncommitted changes)" if dirty else commit


# --- which tests record -----------------------------------------------------------------------


def recording_tests(root: Path = ROOT) -> list[str]:
    """``path::name`` of every test function under tests/ that asks for the fixture."""
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                if FIXTURE in names:
                    found.append(f"{path.relative_to(root).as_posix()}::{node.name}")
    return found


def function_of(nodeid: str) -> str:
    """``path::name`` of a node id (its parameters dropped)."""
    return nodeid.split("[", 1)[0]


def cited_tests(doc: str) -> list[str]:
    """Every ``path::name`` a doc cites in backquotes (parameters dropped)."""
    return sorted(
        {function_of(m) for m in re.findall(r"`(tests/[\w/]+\.py::[\w\[\]\-. ,]+)`", doc)}
    )


# --- rendering ---------------------------------------------------------------------------------

_STATUS = {
    "passed": "",
    "failed": "**FAILED** ({message}); its counts: ",
    "xfail": "**expected failure** ({message}); its counts: ",
}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _lost(row: dict[str, Any]) -> str:
    status = _STATUS.get(row["outcome"], "**{outcome}** ({message}); its counts: ")
    return status.format(**row) + row["lost"]


def _label(row: dict[str, Any], same_function: bool) -> str:
    name = row["test"].split("::", 1)[1]
    return name[name.index("[") :] if same_function and "[" in name else name


def _merged(rows: list[dict[str, Any]]) -> str:
    """One table line for the rows of one fault (a parametrized test, or several tests
    checking one fault): texts that differ are listed, each with its test's label."""
    functions = list(dict.fromkeys(function_of(r["test"]) for r in rows))
    same = len(functions) == 1
    loads = list(dict.fromkeys(r["load"] for r in rows))
    lost = list(dict.fromkeys(_lost(r) for r in rows))
    if len(lost) > 1:
        lost = [f"{_label(r, same)}: {_lost(r)}" for r in rows]
    if len(loads) == 1:
        load = loads[0]
    else:  # each test's loads (a parametrized test's cases, joined)
        per_test = {
            f: list(dict.fromkeys(r["load"] for r in rows if function_of(r["test"]) == f))
            for f in functions
        }
        load = "; ".join(
            (f"{f.split('::')[1]}: " if not same else "") + ", ".join(them)
            for f, them in per_test.items()
        )
    before = rows[0]["before"]
    lost_text = "<br>".join(_cell(t) for t in lost)
    if before:
        lost_text += f"<br>Before the fix: {_cell(before)}"
    tests = []
    for function in functions:
        cases = [r for r in rows if function_of(r["test"]) == function and "[" in r["test"]]
        tests.append(f"`{function}`" + (f" ({len(cases)} cases)" if len(cases) > 1 else ""))
    return f"| {_cell(rows[0]['fault'])} | {_cell(load)} | {lost_text} | {', '.join(tests)} |"


def tables(data: dict[str, Any], expected: list[str]) -> str:
    """The generated part: how the run was made, a table per section, what has no row."""
    rows: list[dict[str, Any]] = data["rows"]
    outcomes: dict[str, dict[str, str]] = data["outcomes"]
    counts: dict[str, int] = {}
    for seen in outcomes.values():
        counts[seen["outcome"]] = counts.get(seen["outcome"], 0) + 1
    tally = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
    out = [
        BEGIN,
        "## Faults and bad inputs tried",
        "",
        f"Generated by `make reliability` on {data['date']}: a machine with {data['nproc']} "
        f"cores ({data['machine']}), commit {data['commit']}, shared with other work. "
        f"Command: `{data['command']}` ({data['duration_s']} s; {len(outcomes)} tests: {tally}).",
        "",
        "Each row: the fault, the load it met and what was lost, as the test measured them "
        "(the target everywhere is **nothing**), and the test. A row whose test did not pass "
        "says so in its *lost* cell.",
    ]
    for section in SECTIONS:
        mine = [r for r in rows if r["section"] == section]
        if not mine:
            continue
        groups: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
        for row in mine:
            groups.setdefault((row["fault"], row["before"]), []).append(row)
        out += [
            "",
            f"### {section}",
            "",
            "| fault | load | lost | test |",
            "| --- | --- | --- | --- |",
        ]
        out += [_merged(group) for group in groups.values()]
    missing = _missing(data, expected)
    if missing:
        out += [
            "",
            "### Not measured in this run",
            "",
            "Tests that record rows but have none here (the doc drops no fault quietly):",
            "",
            "| test | why |",
            "| --- | --- |",
        ]
        out += [f"| `{test}` | {_cell(why)} |" for test, why in missing]
    out.append(END)
    return "\n".join(out)


def _missing(data: dict[str, Any], expected: list[str]) -> list[tuple[str, str]]:
    with_rows = {r["test"] for r in data["rows"]}
    functions_with_rows = {function_of(t) for t in with_rows}
    missing = []
    for nodeid, seen in data["outcomes"].items():
        if nodeid not in with_rows:
            why = f"{seen['outcome']}: {seen['message']}" if seen["message"] else seen["outcome"]
            if seen["outcome"] == "passed":
                why = "passed without recording a row"
            missing.append((nodeid, why))
    ran = {function_of(n) for n in data["outcomes"]}
    for function in expected:
        if function not in ran and function not in functions_with_rows:
            missing.append((function, "did not run in this session"))
    return missing


def _split(text: str, first: str, second: str) -> tuple[str, str]:
    if text.count(first) != 1 or text.count(second) != 1:
        raise SystemExit(f"expected {first!r} and {second!r} once each")
    head, rest = text.split(first)
    middle, tail = rest.split(second)
    return head, tail


_HEADER = (
    "<!-- Generated by `make reliability` (tests/reliability.py): edit "
    "docs/reliability-guarantees.md, not this file; `python -m tests.reliability refresh` "
    "applies a change to it without running the tests again. -->\n"
)


def render(source: str, generated: str) -> str:
    if source.count(MARKER) != 1:
        raise SystemExit(f"{SOURCE.name} must hold {MARKER!r} once")
    head, tail = source.split(MARKER)
    return _HEADER + head.rstrip("\n") + "\n\n" + generated + "\n\n" + tail.lstrip("\n")


def generated_part(doc: str) -> str:
    head, tail = _split(doc, BEGIN, END)
    return BEGIN + doc[len(head) + len(BEGIN) : len(doc) - len(tail) - len(END)] + END


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command == "render":
        path = Path(argv[1]) if len(argv) > 1 else out_path()
        data = json.loads(path.read_text())
        generated = tables(data, recording_tests())
        missing = _missing(data, recording_tests())
        for test, why in missing:
            print(f"not measured: {test}: {why}", file=sys.stderr)
    elif command == "refresh":
        generated = generated_part(DOC.read_text())
    else:
        print("usage: python -m tests.reliability render [ROWS.json] | refresh", file=sys.stderr)
        return 2
    DOC.write_text(render(SOURCE.read_text(), generated))
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
