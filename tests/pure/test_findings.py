"""Critic findings: strings and objects, bad fields, sizes, locations, the schema."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from orchestration.core.critique import parse_critique
from orchestration.core.findings import (
    MESSAGE_MAX_CHARS,
    Finding,
    locate,
    parse_finding,
    parse_findings,
)
from orchestration.core.results import build_result
from orchestration.core.structured import CRITIQUE_SCHEMA, FINDING_SCHEMA


def test_strings_objects_and_mixed() -> None:
    raw = [
        "plain issue",
        {
            "message": "SQL injection",
            "path": "app/db.py",
            "line": 12,
            "severity": "HIGH",
            "rule": "sqli",
        },
        {"description": "old key still read"},
        "   ",
        None,
    ]
    found = parse_findings(raw)
    assert found == [
        Finding("plain issue"),
        Finding("SQL injection", "app/db.py", 12, None, "error", "sqli"),
        Finding("old key still read"),
    ]
    assert [f.as_text() for f in found][1] == "app/db.py:12: SQL injection"


def test_bad_fields_are_dropped_and_named_never_the_finding() -> None:
    f = parse_finding({"message": "m", "path": 3, "line": -4, "end_line": "x", "rule": [1]})
    assert f is not None
    assert (f.path, f.line, f.end_line, f.rule) == (None, None, None, None)
    assert f.message == "m (ignored invalid path, line, end_line, rule)"
    assert f.severity == "warning"
    backwards = parse_finding({"message": "m", "path": "a.py", "line": 9, "end_line": 2})
    assert backwards is not None and (backwards.line, backwards.end_line) == (9, None)
    assert parse_finding({"message": "m", "line": True}) == Finding("m (ignored invalid line)")


def test_huge_fields_are_bounded() -> None:
    f = parse_finding({"message": "x" * 100_000, "path": "p" * 10_000, "line": 10**30})
    assert f is not None
    assert len(f.message) <= MESSAGE_MAX_CHARS and f.message.endswith("…")
    assert f.path is not None and len(f.path) <= 512
    assert f.line is None


@pytest.mark.parametrize(
    ("line", "end", "expected"),
    [(2, 3, (2, 3)), (99, None, (None, None)), (2, 50, (2, 3)), (None, None, (None, None))],
)
def test_locate_keeps_out_of_file_lines_as_file_level(
    line: int | None, end: int | None, expected: tuple[int | None, int | None]
) -> None:
    f = locate(Finding("m", "a.py", line, end), {"a.py": "one\ntwo\nthree\n"})
    assert (f.path, f.message, (f.line, f.end_line)) == ("a.py", "m", expected)
    unknown = Finding("m", "b.py", 99)
    assert locate(unknown, {"a.py": "x"}) is unknown


def test_critique_carries_located_findings_and_text_issues() -> None:
    reply = (
        '{"score": 0.4, "summary": "s", "issues": ["plain", '
        '{"message": "bad query", "path": "db.py", "line": 3, "severity": "error"}]}'
    )
    critique = parse_critique(reply)
    assert critique.issues == ["plain", "db.py:3: bad query"]
    assert critique.findings[1] == Finding("bad query", "db.py", 3, None, "error", None)
    again = type(critique).model_validate(critique.model_dump(mode="json"))
    assert again == critique
    assert parse_critique('{"score": 0.4, "issues": ["a"]}').findings == []


def test_schema_accepts_strings_and_objects_and_is_strict() -> None:
    sample = {
        "score": 0.5,
        "summary": "s",
        "issues": [
            "plain",
            {
                "message": "m",
                "path": "a.py",
                "line": 1,
                "end_line": None,
                "severity": "error",
                "rule": None,
            },
        ],
    }
    jsonschema.validate(sample, CRITIQUE_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**sample, "issues": [{"message": "m"}]}, CRITIQUE_SCHEMA)
    assert set(FINDING_SCHEMA["properties"]) == set(FINDING_SCHEMA["required"])
    assert FINDING_SCHEMA["additionalProperties"] is False


def test_stored_steps_with_and_without_findings_build_results() -> None:
    finding = Finding("bad query", "db.py", 3, severity="error").as_dict()
    base: dict[str, Any] = {"text": "x", "input_tokens": 1, "output_tokens": 1}
    old = {"key": "r1.critique", **base, "score": 0.2, "issues": ["a"], "summary": ""}
    new = {
        "key": "r2.critique",
        **base,
        "score": 0.4,
        "issues": ["db.py:3: bad query"],
        "summary": "",
        "findings": [finding],
    }
    steps = {s["key"]: s for s in ({"key": "r0.generate", **base}, old, new)}
    result = build_result({"run_id": "r", "status": "max_rounds_reached"}, steps, [])
    assert [r.findings for r in result.rounds] == [[], [finding]]
    assert [r.issues for r in result.rounds] == [["a"], ["db.py:3: bad query"]]
