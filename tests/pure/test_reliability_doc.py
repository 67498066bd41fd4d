"""docs/RELIABILITY.md cannot drift from the tests: every test it cites exists, every test
that records a row has one in it, and its hand-written part is docs/reliability-guarantees.md."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import reliability
from tests.reliability import DOC, ROOT, SOURCE


def defined_tests() -> set[str]:
    found = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.add(f"{path.relative_to(ROOT).as_posix()}::{node.name}")
    return found


def test_every_test_the_doc_cites_exists() -> None:
    cited = reliability.cited_tests(DOC.read_text())
    assert cited
    assert sorted(set(cited) - defined_tests()) == []


def test_every_recording_test_has_a_row_in_the_doc() -> None:
    generated = reliability.generated_part(DOC.read_text())
    in_tables = generated.split("### Not measured in this run")[0]
    missing = [t for t in reliability.recording_tests() if f"`{t}`" not in in_tables]
    assert missing == [], "run `make reliability` (or say why in the doc)"


def test_the_hand_written_part_is_the_source() -> None:
    doc = DOC.read_text()
    assert doc == reliability.render(SOURCE.read_text(), reliability.generated_part(doc)), (
        f"edit {SOURCE.name}, then `python -m tests.reliability refresh`"
    )


def test_every_fault_test_records_a_row() -> None:
    recording = set(reliability.recording_tests())
    fault_tests = {
        t
        for t in defined_tests()
        if t.startswith("tests/faults/") and t.split("::")[1].startswith("test_")
    }
    assert sorted(fault_tests - recording) == [], "ask for the `reliability` fixture and record"


def _row(test: str, lost: str, outcome: str = "passed", message: str = "") -> dict[str, object]:
    return {
        "section": reliability.ENGINE,
        "fault": "a fault",
        "load": "2 runs",
        "lost": lost,
        "test": test,
        "before": None,
        "outcome": outcome,
        "message": message,
    }


def test_a_failed_or_missing_test_shows_as_such() -> None:
    data = {
        "date": "d",
        "nproc": 2,
        "machine": "m",
        "commit": "c",
        "command": "pytest",
        "duration_s": 1,
        "rows": [
            _row("tests/faults/test_x.py::test_a[1]", "nothing"),
            _row(
                "tests/faults/test_x.py::test_a[2]",
                "1 of 2 runs stranded",
                "failed",
                "assert 1 == 2",
            ),
        ],
        "outcomes": {
            "tests/faults/test_x.py::test_a[1]": {"outcome": "passed", "message": ""},
            "tests/faults/test_x.py::test_a[2]": {"outcome": "failed", "message": "x"},
            "tests/faults/test_x.py::test_b": {"outcome": "error at setup", "message": "no Redis"},
        },
    }
    text = reliability.tables(
        data, ["tests/faults/test_x.py::test_a", "tests/faults/test_z.py::test_c"]
    )
    (line,) = [t for t in text.splitlines() if t.startswith("| a fault |")]
    assert "[1]: nothing" in line
    assert "[2]: **FAILED** (assert 1 == 2); its counts: 1 of 2 runs stranded" in line
    missing = text.split("### Not measured in this run")[1]
    assert "`tests/faults/test_x.py::test_b` | error at setup: no Redis" in missing
    assert "`tests/faults/test_z.py::test_c` | did not run in this session" in missing


SAMPLE = """
import pytest
from tests.reliability import ENGINE, lost_of

def test_passes(reliability):
    reliability.record(section=ENGINE, fault="f", load="1 run", lost=lost_of(0, 1, "runs"))

def test_fails_after_recording(reliability):
    stranded = 1
    reliability.record(section=ENGINE, fault="f", load="1 run", lost=lost_of(stranded, 1, "runs"))
    assert stranded == 0

def test_fails_before_recording(reliability):
    assert False, "no figures"

def test_xfails(reliability):
    reliability.record(section=ENGINE, fault="g", load="1 run", lost="nothing")
    pytest.xfail("known")

def test_counts_cases(reliability):
    for n in range(5):
        with reliability.case(section=ENGINE, fault="h"):
            pass
"""


def test_the_plugin_keeps_each_rows_outcome(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "conftest.py").write_text(
        "from tests.reliability import (pytest_collection_modifyitems, pytest_configure,\n"
        "    pytest_runtest_makereport, pytest_sessionfinish, reliability)\n"
    )
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DUET_RELIABILITY_OUT": str(out)}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "reliability",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    data = json.loads(out.read_text())
    rows = {r["test"].split("::")[1]: (r["outcome"], r["lost"], r["load"]) for r in data["rows"]}
    assert rows == {
        "test_passes": ("passed", "nothing", "1 run"),
        "test_fails_after_recording": ("failed", "1 of 1 runs", "1 run"),
        "test_xfails": ("xfail", "nothing", "1 run"),
        "test_counts_cases": ("passed", "nothing", "5 generated cases"),
    }
    seen = data["outcomes"]["test_sample.py::test_fails_before_recording"]
    assert seen["outcome"] == "failed" and "no figures" in seen["message"]


def test_rows_of_xdist_workers_are_merged_and_stale_parts_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUET_RELIABILITY_OUT", str(tmp_path / "rows.json"))
    part = {"outcomes": {"t::a": {"outcome": "passed", "message": ""}}, "rows": [{"test": "t::a"}]}
    (tmp_path / "rows.gw0.json").write_text(json.dumps({**part, "started": 100.0}))
    (tmp_path / "rows.gw1.json").write_text(json.dumps({**part, "started": 50.0}))  # older run
    state: dict[str, object] = {"started": 99.0, "outcomes": {}, "rows": []}
    reliability.merge_parts(state)
    assert state["outcomes"] == part["outcomes"] and state["rows"] == part["rows"]
    assert list(tmp_path.iterdir()) == []
