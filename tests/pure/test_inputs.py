"""Input readers: every kind of bad input is reported with its file and line; the rest run."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from duet.inputs import InputProblem, InputReader, detect_format
from orchestration.core.errors import InputError

GOOD = '{"id": "ok", "prompt": "Review this"}'


def _jsonl(tmp_path: Path, *lines: str | bytes) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def _read(path: Path, **kwargs: object) -> tuple[list, list[InputProblem]]:
    reader = InputReader(path, **kwargs)  # type: ignore[arg-type]
    records = list(reader)
    return records, reader.problems


# One bad line after a good one: (line text, reason fragment, id the problem names).
JSONL_PROBLEMS = [
    ("{not json", "malformed JSON: Expecting property name", None),
    ('{"id": "a", "prompt": "x"', "malformed JSON", None),
    ('["a", "list"]', "expected a JSON object, got an array", None),
    ('"just a string"', "expected a JSON object, got a string", None),
    ("42", "expected a JSON object, got a number", None),
    ('{"id": "b"}', "missing prompt", "b"),
    ('{"id": "b", "prompt": null}', "missing prompt", "b"),
    ('{"id": "b", "prompt": ""}', "empty prompt", "b"),
    ('{"id": "b", "prompt": "   \\n "}', "empty prompt", "b"),
    ('{"id": "b", "prompt": 7}', "prompt must be a string, got a number", "b"),
    ('{"id": "b", "prompt": ["x"]}', "prompt must be a string, got an array", "b"),
    ('{"id": "b", "prompt": {"text": "x"}}', "prompt must be a string, got an object", "b"),
    ('{"id": "ok", "prompt": "again"}', "duplicate id 'ok' (first on line 1)", "ok"),
    ('{"custom_id": "ok", "prompt": "again"}', "duplicate id 'ok'", "ok"),
    ('{"id": "b", "prompt": "' + "x" * 101 + '"}', "prompt is 101 characters, over the limit of 100", "b"),
    ('{"id": [1], "prompt": "x"}', "id must be a non-empty string or an integer, got an array", None),
    ('{"id": "", "prompt": "x"}', "id must be a non-empty string or an integer", None),
    ('{"id": true, "prompt": "x"}', "got a boolean", None),
    ('{"id": "b", "prompt": "x", "user_id": 5}', "user_id must be a string, got a number", "b"),
    ('{"id": "b", "prompt": "x", "metadata": "m"}', "metadata must be an object, got a string", "b"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "reason", "problem_id"), JSONL_PROBLEMS)
def test_bad_jsonl_line_is_reported_with_file_and_line(
    tmp_path: Path, line: str, reason: str, problem_id: str | None
) -> None:
    path = _jsonl(tmp_path, GOOD, line, '{"id": "last", "prompt": "still read"}')
    records, problems = _read(path, max_prompt_chars=100)
    assert [r.id for r in records] == ["ok", "last"], "the good lines around it still run"
    assert len(problems) == 1
    problem = problems[0]
    assert (problem.source, problem.line, problem.id) == (str(path), 2, problem_id)
    assert reason in problem.reason
    assert str(problem).startswith(f"{path}:2: ")


def test_invalid_utf8_line_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, GOOD, b'{"prompt": "caf\xe9"}')
    records, problems = _read(path)
    assert [r.id for r in records] == ["ok"]
    assert (problems[0].line, problems[0].reason) == (2, "not UTF-8 text: byte 0xe9 at column 16")


def test_jsonl_fields_ids_and_blank_lines(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        '{"id": "a", "prompt": "p1", "user_id": "u1", "metadata": {"lang": "go"}}',
        "",
        '{"custom_id": "b", "prompt": "p2"}',
        '{"id": 7, "prompt": "p3"}',
        '{"prompt": "p4"}',
    )
    records, problems = _read(path)
    assert problems == []
    assert [(r.id, r.line) for r in records] == [("a", 1), ("b", 3), ("7", 4), ("5", 5)]
    first = records[0]
    assert (first.prompt, first.user_id, first.metadata) == ("p1", "u1", {"lang": "go"})
    assert first.as_item() == {
        "id": "a",
        "prompt": "p1",
        "user_id": "u1",
        "metadata": {"lang": "go"},
    }


def test_a_bom_on_the_first_line_is_ignored(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, b"\xef\xbb\xbf" + GOOD.encode())
    records, problems = _read(path)
    assert ([r.id for r in records], problems) == (["ok"], [])


# --- CSV ---------------------------------------------------------------------------
def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "in.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_reads_prompt_id_user_and_metadata(tmp_path: Path) -> None:
    path = _csv(
        tmp_path,
        'id,prompt,user_id,lang\nx1,"two\nlines",u1,py\n,second,,\n',
    )
    records, problems = _read(path)
    assert problems == []
    assert [(r.id, r.line, r.prompt) for r in records] == [
        ("x1", 2, "two\nlines"),
        ("2", 4, "second"),
    ]
    assert (records[0].user_id, records[0].metadata) == ("u1", {"lang": "py"})
    assert records[1].metadata == {}


def test_csv_prompt_column_is_configurable_and_ids_default_to_row_number(tmp_path: Path) -> None:
    path = _csv(tmp_path, "question\nwhat is x?\nwhat is y?\n")
    records, _ = _read(path, prompt_column="question")
    assert [(r.id, r.prompt) for r in records] == [("1", "what is x?"), ("2", "what is y?")]


CSV_PROBLEMS = [
    ("a,\n", "empty prompt", "a"),
    ("a\n", "missing prompt", "a"),
    ("a,x,extra\n", "row has 3 fields, the header has 2", None),
    ("first,again\n", "duplicate id 'first' (first on line 2)", "first"),
    ("a," + "y" * 101 + "\n", "over the limit of 100", "a"),
]


@pytest.mark.parametrize(("row", "reason", "problem_id"), CSV_PROBLEMS)
def test_bad_csv_row_is_reported_with_file_and_line(
    tmp_path: Path, row: str, reason: str, problem_id: str | None
) -> None:
    path = _csv(tmp_path, "id,prompt\nfirst,fine\n" + row + "last,also fine\n")
    records, problems = _read(path, max_prompt_chars=100)
    assert [r.id for r in records] == ["first", "last"]
    assert [(p.source, p.line, p.id) for p in problems] == [(str(path), 3, problem_id)]
    assert reason in problems[0].reason


def test_csv_that_is_not_utf8_refuses_the_file_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b"id,prompt\n1,caf\xe9\n")
    with pytest.raises(InputError, match=r"in\.csv:\d+: not UTF-8 text"):
        list(InputReader(path))


def test_csv_without_the_prompt_column_refuses_the_file(tmp_path: Path) -> None:
    path = _csv(tmp_path, "id,text\n1,hello\n")
    with pytest.raises(
        InputError, match=r"in\.csv:1: no 'prompt' column .*columns: id, text.*prompt_column"
    ):
        list(InputReader(path))


# --- directories ---------------------------------------------------------------------
def test_directory_gives_one_input_per_file_skipping_hidden_and_binary(tmp_path: Path) -> None:
    root = tmp_path / "code"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "b.py").write_text("print('b')\n")
    (root / "sub" / "a.py").write_text("print('a')\n")
    (root / ".env").write_text("SECRET=1\n")
    (root / ".git" / "config").write_text("[core]\n")
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (root / "empty.txt").write_text("  \n")
    reader = InputReader(root)
    records = list(reader)
    assert [(r.id, r.prompt, r.line) for r in records] == [
        ("b.py", "print('b')\n", None),
        ("sub/a.py", "print('a')\n", None),
    ]
    assert reader.skipped == 1
    assert [(p.source, p.line, p.reason) for p in reader.problems] == [
        (str(root / "empty.txt"), None, "empty prompt")
    ]
    assert str(reader.problems[0]) == f"{root / 'empty.txt'}: empty prompt"


def test_directory_file_over_the_limit_is_rejected_unread(tmp_path: Path) -> None:
    root = tmp_path / "code"
    root.mkdir()
    (root / "big.py").write_text("x" * 500)
    _, problems = _read(root, max_prompt_chars=100)
    assert "file is 500 bytes, over the prompt limit of 100 characters" in problems[0].reason


# --- modes ------------------------------------------------------------------------------
def test_strict_raises_after_reading_listing_every_problem(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, GOOD, "{bad", '{"id": "x"}')
    reader = InputReader(path, strict=True)
    with pytest.raises(InputError) as caught:
        list(reader)
    message = str(caught.value)
    assert "2 bad input(s)" in message
    assert f"{path}:2: malformed JSON" in message
    assert f"{path}:3: missing prompt" in message


def test_on_problem_streams_problems_instead_of_keeping_them(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, GOOD, "{bad", '{"id": "x"}')
    seen: list[tuple[int, int | None]] = []
    reader = InputReader(path, on_problem=lambda p: seen.append((reader.count, p.line)))
    assert [r.id for r in reader] == ["ok"]
    assert seen == [(1, 2), (1, 3)], "each problem knows how many valid inputs came before it"
    assert (reader.problems, reader.problem_count) == ([], 2)


@pytest.mark.parametrize(
    ("name", "expected"), [("a.jsonl", "jsonl"), ("a.CSV", "csv"), ("a.ndjson", "jsonl")]
)
def test_detect_format(tmp_path: Path, name: str, expected: str) -> None:
    assert detect_format(tmp_path / name) == expected
    assert detect_format(tmp_path) == "dir"


def test_missing_path_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nope.jsonl: no such file or directory"):
        InputReader(tmp_path / "nope.jsonl")


def test_reading_is_streamed_in_flat_memory(tmp_path: Path) -> None:
    # 20 MB of prompts: reading must hold one line at a time, not the file.
    path = tmp_path / "big.jsonl"
    prompt = "x" * 10_000
    with path.open("w") as fh:
        for n in range(2_000):
            fh.write(json.dumps({"id": f"r{n}", "prompt": prompt}) + "\n")
    tracemalloc.start()
    try:
        count = sum(1 for _ in InputReader(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 2_000
    assert peak < 2_000_000, (
        f"peak {peak:,} bytes while reading a {path.stat().st_size:,} byte file"
    )
