"""docs/RELIABILITY.md cannot drift from the tests: every test it cites exists, every test
that records a row has one in it, and its hand-written part is docs/reliability-guarantees.md."""

from __future__ import annotations

import ast

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
    fault_tests = {t for t in defined_tests() if t.startswith("tests/faults/")
                   and t.split("::")[1].startswith("test_")}  # fmt: skip
    assert sorted(fault_tests - recording) == [], "ask for the `reliability` fixture and record"
