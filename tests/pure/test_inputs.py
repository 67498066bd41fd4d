"""Input readers: every kind of bad input is reported with its file and line; the rest run."""

from __future__ import annotations

import csv
import io
import json
import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duet.intake.files import InputProblem, InputReader, detect_format
from orchestration.core.errors import InputError
from orchestration.core.jsonlimits import MAX_DEPTH, too_deep, value_too_deep
from tests.reliability import MODEL_OUTPUT, Reliability, lost_of

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
    (
        '{"id": "b", "prompt": "' + "x" * 101 + '"}',
        "prompt is 101 characters, over the limit of 100",
        "b",
    ),
    (
        '{"id": [1], "prompt": "x"}',
        "id must be a non-empty string or an integer, got an array",
        None,
    ),
    ('{"id": "", "prompt": "x"}', "id must be a non-empty string or an integer", None),
    ('{"id": true, "prompt": "x"}', "got a boolean", None),
    ('{"id": "b", "prompt": "x", "user_id": 5}', "user_id must be a string, got a number", "b"),
    (
        '{"id": "b", "prompt": "x", "metadata": "m"}',
        "metadata must be an object, got a string",
        "b",
    ),
]


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
def test_directory_gives_one_input_per_file_skipping_hidden_binary_and_empty(
    tmp_path: Path,
) -> None:
    root = tmp_path / "code"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "b.py").write_text("print('b')\n")
    (root / "sub" / "a.py").write_text("print('a')\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / ".env").write_text("SECRET=1\n")
    (root / ".git" / "config").write_text("[core]\n")
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (root / "empty.txt").write_text("  \n")
    reader = InputReader(root)
    records = list(reader)
    assert [(r.id, r.prompt, r.line) for r in records] == [
        ("b.py", "File: b.py\n\nprint('b')\n", None),
        ("sub/a.py", "File: sub/a.py\n\nprint('a')\n", None),
    ], "the model is told which file it reads"
    assert reader.problems == [], "an empty file is nothing to review, not a bad input"
    assert dict(reader.skipped_by) == {"binary": 1, "empty": 2}


def test_directory_prompt_template_is_configurable(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = {1: 2}\n")
    records, _ = _read(tmp_path, prompt_template="{prompt}")
    assert records[0].prompt == "x = {1: 2}\n"
    records, _ = _read(tmp_path, prompt_template="Review {input_id} ({unknown}):\n{prompt}")
    assert records[0].prompt == "Review a.py ({unknown}):\nx = {1: 2}\n"


def test_jsonl_prompt_template_replaces_only_its_placeholders(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, '{"id": "q", "prompt": "has {input_id} and {prompt} inside"}')
    records, _ = _read(path, prompt_template="[{input_id}] {prompt}")
    assert records[0].prompt == "[q] has {input_id} and {prompt} inside", "one pass only"


def test_directory_file_over_the_limit_is_rejected_unread(tmp_path: Path) -> None:
    root = tmp_path / "code"
    root.mkdir()
    (root / "big.py").write_text("x" * 500)
    _, problems = _read(root, max_prompt_chars=100)
    assert "file is 500 bytes, over the prompt limit of 100 characters" in problems[0].reason


def test_a_large_binary_is_skipped_like_a_small_one_and_caches_are_not_read(
    tmp_path: Path,
) -> None:
    root = tmp_path / "code"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "node_modules" / "left-pad").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("print('m')\n")
    (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\xa7\r\r\n" + b"x" * 50)
    (root / "node_modules" / "left-pad" / "index.js").write_text("module.exports = 1\n")
    (root / "big.pyc").write_bytes(b"\xa7\r\r\n\x00\x00\x00\x00" + b"\x01" * 5000)
    (root / "big.bin").write_bytes(b"\xff\xfe" + b"\x80" * 5000)  # no NUL, not UTF-8
    # Large text is still a rejected input (a character cut at the sniff's end is text).
    (root / "big.txt").write_text("a" + "é" * 5000)
    reader = InputReader(root, max_prompt_chars=100)
    records = list(reader)
    assert [r.id for r in records] == ["pkg/mod.py"]
    assert [p.id for p in reader.problems] == ["big.txt"]
    assert "over the prompt limit of 100 characters" in reader.problems[0].reason
    assert dict(reader.skipped_by) == {"binary": 2}


def _tree_with_traps(tmp_path: Path) -> Path:
    """A directory of two good files and every kind of entry that must not be read."""
    root = tmp_path / "code"
    (root / "pkg").mkdir(parents=True)
    (root / "a.py").write_text("print('a')\n")
    (root / "pkg" / "z.py").write_text("print('z')\n")
    outside = tmp_path / "secret.txt"
    outside.write_text("API_KEY=sk-do-not-send\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "more.txt").write_text("also secret\n")
    (root / "passwd").symlink_to("/etc/passwd")
    (root / "zero").symlink_to("/dev/zero")
    (root / "secret").symlink_to(outside)
    (root / "up").symlink_to("../secret.txt")
    (root / "linked_dir").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "inside").symlink_to("a.py")  # stays in the tree: read like any file
    os.mkfifo(root / "pipe")
    return root


def test_directory_refuses_symlinks_out_fifos_and_devices_and_loses_nothing_else(
    tmp_path: Path,
) -> None:
    root = _tree_with_traps(tmp_path)
    reader = InputReader(root, max_prompt_chars=10_000)
    records = list(reader)  # a FIFO must not hang this, /dev/zero must not fill memory
    assert sorted(r.id for r in records) == ["a.py", "inside", "pkg/z.py"]
    assert not any("secret" in r.prompt or "root:" in r.prompt for r in records)
    found = {p.id: p.reason for p in reader.problems}
    assert found == {
        "passwd": "symlink to a file outside the input directory: not read",
        "zero": "symlink to a file outside the input directory: not read",
        "secret": "symlink to a file outside the input directory: not read",
        "up": "symlink to a file outside the input directory: not read",
        "linked_dir": "symlink to a directory outside the input directory: not followed",
        "pipe": "not a regular file (a named pipe (FIFO)): not read",
    }
    assert all(p.source == str(root / p.id) for p in reader.problems), "each names its path"


def test_a_device_inside_the_tree_is_not_read(tmp_path: Path) -> None:
    # Symlinks out are refused before their target is looked at; a device node reached
    # without a symlink is refused on its type (checked on the open descriptor).
    from duet.intake.files import _read_regular, _Unreadable

    with pytest.raises(_Unreadable, match=r"not a regular file \(a character device\)"):
        _read_regular(Path("/dev/zero"), 1000)
    with pytest.raises(_Unreadable, match="over the prompt limit"):
        big = tmp_path / "big"
        big.write_bytes(b"x" * 101)
        _read_regular(big, 100)


def test_include_and_exclude_globs(tmp_path: Path) -> None:
    for rel in ("a.py", "b.txt", "src/c.py", "src/deep/d.py", "tests/t.py", "build/x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# {rel}\n")
    ids = lambda **kw: [r.id for r in InputReader(tmp_path, **kw)]  # noqa: E731
    assert ids(include=["*.py"], exclude=["tests", "build/"]) == [
        "a.py",
        "src/c.py",
        "src/deep/d.py",
    ]
    assert ids(include=["src/**/*.py"]) == ["src/c.py", "src/deep/d.py"]
    assert ids(exclude=["*.py"]) == ["b.txt"]


def test_gitignore_files_are_honoured_at_every_level(tmp_path: Path) -> None:
    for rel in ("a.py", "debug.log", "keep.log", "dist/x.py", "pkg/gen.py", "pkg/ok.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# {rel}\n")
    (tmp_path / ".gitignore").write_text("*.log\n!keep.log\ndist/\n")
    (tmp_path / "pkg" / ".gitignore").write_text("gen.py\n")
    assert [r.id for r in InputReader(tmp_path)] == ["a.py", "keep.log", "pkg/ok.py"]
    every = [r.id for r in InputReader(tmp_path, gitignore=False)]
    assert every == ["a.py", "debug.log", "keep.log", "dist/x.py", "pkg/gen.py", "pkg/ok.py"]


# --- properties: arbitrary text and bytes never crash a reader, nothing goes missing ------
_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


_JSONISH = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    st.lists(
        st.one_of(
            st.text(max_size=40),
            st.fixed_dictionaries(
                {},
                optional={
                    "id": st.one_of(st.text(max_size=8), st.integers(), st.none(), st.booleans()),
                    "prompt": st.one_of(st.text(max_size=30), st.integers(), st.none()),
                    "user_id": st.one_of(st.text(max_size=5), st.integers()),
                    "metadata": st.one_of(
                        st.dictionaries(st.text(max_size=3), st.text(max_size=3)),
                        st.text(max_size=3),
                    ),
                },
            ).map(json.dumps),
        ),
        max_size=12,
    ).map(lambda lines: "\n".join(lines).encode()),
)


@_SETTINGS
@given(data=_JSONISH)
def test_property_jsonl_never_raises_and_accounts_for_every_line(
    tmp_path: Path, data: bytes
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    reader = InputReader(path, max_prompt_chars=50)
    records = list(reader)
    # Lines are split on \n only (as the file is read in binary).
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    expected = 0
    for i, raw in enumerate(lines):
        try:
            expected += bool(raw.decode("utf-8-sig" if i == 0 else "utf-8").strip())
        except UnicodeDecodeError:
            expected += 1
    assert len(records) + reader.problem_count == expected
    assert len({r.id for r in records}) == len(records), "ids stay unique"
    assert all(isinstance(r.prompt, str) and r.prompt.strip() for r in records)


@_SETTINGS
@given(text=st.text(max_size=300), as_bytes=st.binary(max_size=100))
def test_property_csv_never_raises_but_a_clear_input_error(
    tmp_path: Path, text: str, as_bytes: bytes
) -> None:
    for n, payload in enumerate((("id,prompt,x\n" + text).encode(), b"id,prompt\n" + as_bytes)):
        path = tmp_path / f"in{n}.csv"
        path.write_bytes(payload)
        reader = InputReader(path, max_prompt_chars=50)
        try:
            records = list(reader)
        except InputError as exc:
            assert str(path) in str(exc), "a whole-file error names the file"
            continue
        assert len({r.id for r in records}) == len(records)
        assert all(r.prompt.strip() for r in records)
        try:  # when Python's csv module reads every row, each is a record or a problem
            rows = [r for r in csv.reader(io.StringIO(payload.decode("utf-8-sig"), newline=""))]
        except csv.Error:
            continue
        assert len(records) + reader.problem_count == sum(1 for r in rows[1:] if r)


@_SETTINGS
@given(
    files=st.dictionaries(
        st.text("abcxyz._-", min_size=1, max_size=6).filter(lambda n: n not in (".", "..")),
        st.binary(max_size=200),
        max_size=6,
    )
)
def test_property_directory_accounts_for_every_file(tmp_path_factory: Any, files: dict) -> None:
    root = tmp_path_factory.mktemp("tree")
    for name, data in files.items():
        (root / name).write_bytes(data)
    reader = InputReader(root, max_prompt_chars=40)
    records = list(reader)
    visible = [n for n in files if not n.startswith(".")]
    assert len(records) + reader.problem_count + reader.skipped == len(visible)
    assert sorted(r.id for r in records) == sorted(
        set(visible) - {p.id for p in reader.problems} - set(_skipped(root, visible))
    )


def _skipped(root: Path, names: list[str]) -> list[str]:
    out = []
    for name in names:
        data = (root / name).read_bytes()
        try:
            if b"\0" in data:
                raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL")
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            out.append(name)
            continue
        if not text.strip():
            out.append(name)
    return out


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


def _deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def test_a_deeply_nested_line_is_a_rejected_input_and_the_rest_are_read(
    tmp_path: Path, reliability: Reliability
) -> None:
    deep = '{"id": "deep", "prompt": "x", "metadata": ' + _deep(1_000) + "}"
    in_string = '{"id": "quoted", "prompt": "' + "[{" * 500 + '", "metadata": {"k": "\\"[[["}}'
    at_limit = '{"id": "ok64", "prompt": "x", "metadata": ' + _deep(MAX_DEPTH - 1) + "}"
    path = _jsonl(tmp_path, GOOD, deep, "[" * 100_000, in_string, at_limit)
    records, problems = _read(path)
    reliability.record(
        section=MODEL_OUTPUT,
        fault="deeply nested input line",
        load="JSONL: metadata nested 1,000 deep, a line of 100,000 `[`, among 3 good lines",
        lost=lost_of(3 - len(records), 3, "good lines"),
        before="RecursionError ended the whole `duet run`",
    )
    assert [r.id for r in records] == ["ok", "quoted", "ok64"]
    assert [str(p) for p in problems] == [
        f"{path}:2: nested deeper than {MAX_DEPTH} levels",
        f"{path}:3: nested deeper than {MAX_DEPTH} levels",
    ]


def test_the_depth_scan_is_linear_and_skips_strings() -> None:
    assert not too_deep('["' + "[" * 200 + '"]')
    assert not too_deep('["\\"' + "[" * 200 + '"]')  # an escaped quote does not end it
    assert too_deep('["\\\\"' + ",[" * 200 + "]" * 200 + "]")  # an escaped backslash does
    assert not too_deep("[]" * 100_000)  # many arrays, none deep
    assert too_deep("[" * 65) and not too_deep("[" * 64)
    started = time.process_time()
    for text in ('"\\"' * 300_000, "[]" * 300_000, "[" * 1_000_000):
        too_deep(text)
    assert time.process_time() - started < 2.0


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab'),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_JSON, st.integers(min_value=0, max_value=6))
def test_property_the_depth_scan_agrees_with_the_parsed_depth(value: Any, limit: int) -> None:
    text = json.dumps(value, ensure_ascii=False)
    assert too_deep(text, limit) == (_depth(value) > limit)
    assert value_too_deep(value, limit) == (_depth(value) > limit)


def test_a_library_caller_s_deep_or_cyclic_metadata_is_refused_before_anything_runs() -> None:
    from orchestration import Agent, Team
    from orchestration.core.errors import ConfigError

    deep: dict[str, Any] = {}
    for _ in range(2_000):
        deep = {"a": deep}
    cyclic: dict[str, Any] = {}
    cyclic["self"] = [cyclic]
    team = Team.actor_critic(actor=Agent("Fix.", model="sim"), critic=Agent("Judge.", model="sim"))
    for metadata in (deep, cyclic):
        with pytest.raises(ConfigError, match=r"item 0 \(id 'x'\): metadata nested deeper"):
            team.submit_batch([{"id": "x", "prompt": "p", "metadata": metadata}])


def _peak_of(read: Any) -> int:
    tracemalloc.start()
    try:
        read()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_huge_line_is_rejected_in_memory_bounded_by_the_limit_not_the_line(
    tmp_path: Path, reliability: Reliability
) -> None:
    huge = 50_000_000
    path = tmp_path / "in.jsonl"
    with path.open("wb") as fh:
        fh.write(GOOD.encode() + b"\n")
        fh.write(b'{"id": "huge", "prompt": "')
        for _ in range(huge // 1_000_000):
            fh.write(b"x" * 1_000_000)
        fh.write(b'"}\n{"id": "after", "prompt": "y"}\n')
    got: list[Any] = []
    peak = _peak_of(lambda: got.append(_read(path, max_line_bytes=1_000_000)))
    records, problems = got[0]
    reliability.record(
        section=MODEL_OUTPUT,
        fault="huge input line",
        load=f"JSONL: one {huge // 1_000_000} MB line between 2 good ones, a 1 MB line limit",
        lost=lost_of(2 - len(records), 2, "good lines") + f"; peak {peak / 1e6:.1f} MB read",
        before="the line was read whole (1.6 GB RSS for 500 MB) before it was rejected",
    )
    assert [r.id for r in records] == ["ok", "after"]
    assert [str(p) for p in problems] == [
        f"{path}:2: line is {huge + 29:,} bytes, over the limit of 1,000,000 bytes: not read"
    ]
    assert peak < 3_000_000, f"peak {peak:,} bytes for a 1 MB limit"


def test_a_huge_csv_row_is_rejected_in_bounded_memory_and_the_next_rows_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "in.csv"
    with path.open("w") as fh:
        fh.write("id,prompt\na,first\nhuge,")
        for _ in range(20):
            fh.write("x" * 1_000_000)
        fh.write('\nlong,"multi\n' + "line\n" * 300_000 + '"\nb,last\n')
    got: list[Any] = []
    peak = _peak_of(lambda: got.append(_read(path, max_line_bytes=100_000)))
    records, problems = got[0]
    assert [(r.id, r.line) for r in records] == [("a", 2), ("b", 300_006)]
    assert [str(p) for p in problems] == [
        f"{path}:3: row is 20,000,006 characters, over the limit of 100,000 characters: not read",
        f"{path}:4: row is 1,500,014 characters, over the limit of 100,000 characters: not read",
    ]
    assert peak < 1_000_000, f"peak {peak:,} bytes for a 100 kB limit"


def test_the_line_limit_defaults_to_room_for_the_longest_prompt(tmp_path: Path) -> None:
    line = json.dumps({"id": "wide", "prompt": "\U0001f600" * 100}, ensure_ascii=True)
    records, problems = _read(_jsonl(tmp_path, line), max_prompt_chars=100)
    assert [r.id for r in records] == ["wide"] and not problems
    assert InputReader(_jsonl(tmp_path, line)).max_line_bytes is None


def test_a_csv_header_over_the_limit_refuses_the_file_naming_it(tmp_path: Path) -> None:
    path = _csv(tmp_path, "prompt," + "x" * 200 + "\nhello,world\n")
    with pytest.raises(
        InputError,
        match=r"in.csv:1: header row is 208 characters, over the limit of 100 characters: not read",
    ):
        list(InputReader(path, max_line_bytes=100))
