"""Result records, their summary, and the HTML report: valid HTML with the numbers in it."""

from __future__ import annotations

import csv
import io
import json
import os
from html.parser import HTMLParser
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duet.intake.files import InputProblem
from duet.report.html import render_report
from duet.report.records import (
    CSV_COLUMNS,
    Summary,
    csv_cell,
    csv_row,
    rejected_record,
    result_record,
)
from orchestration import Agent, Team
from orchestration.core.errors import ConfigError
from orchestration.core.results import RoundRecord, RunResult, UsageReport
from orchestration.core.usage import Usage
from tests.reliability import MODEL_OUTPUT, Reliability, lost_of


def _record(
    id: str,
    status: str,
    score: float | None,
    rounds: list[float],
    usd: float,
    duration: float,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "id": id,
        "status": status,
        "output": "fixed code",
        "final_score": score,
        "rounds": [
            {"round": n, "score": s, "issues": [], "summary": ""} for n, s in enumerate(rounds, 1)
        ],
        "n_rounds": len(rounds),
        "usage": {
            "input_tokens": 1000,
            "output_tokens": 200,
            "calls": 2 * len(rounds) + 1,
            "usd": usd,
        },
        "reason": extra.pop("reason", None),
        "error": extra.pop("error", None),
        "run_id": f"run-{id}",
        "user_id": None,
        "metadata": {},
        "duration_s": duration,
        **extra,
    }


RECORDS = [
    _record("sql-fstring", "approved", 0.95, [0.55, 0.95], 0.0125, 3.5),
    _record("shell-true", "approved", 0.92, [0.92], 0.0051, 1.25),
    _record("pickle", "max_rounds_reached", 0.71, [0.31, 0.52, 0.71], 0.0304, 9.75),
    _record("jwt", "interrupted", 0.4, [0.4], 0.002, 2.0, reason="budget:batch:usd"),
    _record("<script>alert(1)</script>", "failed", None, [], 0.0, 0.5, error="auth: bad key"),
    rejected_record(InputProblem("inputs.jsonl", 7, "malformed JSON: Expecting value (column 1)")),
]


class _StrictHTML(HTMLParser):
    """Fails on any end tag that does not close the element open at that point."""

    VOID = {"meta", "br", "hr", "img", "input", "link"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def page() -> _StrictHTML:
    parser = _StrictHTML()
    parser.feed(render_report(RECORDS, title="Batch <b> & co"))
    parser.close()
    assert parser.stack == [], f"unclosed elements: {parser.stack}"
    return parser


def test_report_is_well_formed_html(page: _StrictHTML) -> None:
    assert page.tags[:3] == ["html", "head", "meta"]
    assert "body" in page.tags


def test_report_has_inline_svg_charts_and_fetches_nothing(page: _StrictHTML) -> None:
    html = render_report(RECORDS)
    assert page.tags.count("svg") == 5  # outcomes, scores, by round, rounds to approval, cost
    assert "<script" not in html.replace("&lt;script&gt;", "")
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html


@pytest.mark.parametrize(
    "expected",
    [
        "Batch <b> & co",  # the title, escaped in the source and intact as text
        "2 (33%)",  # approved
        "1.40",  # mean rounds over the runs that ran: (2 + 1 + 3 + 1 + 0) / 5
        "$0.0500",  # total cost
        "9.75 s",  # the slowest input's time
        "budget:batch:usd",
        "auth: bad key",
        "malformed JSON: Expecting value (column 1)",
        "inputs.jsonl:7",
        "<script>alert(1)</script>",  # shown as text, never as a tag
    ],
)
def test_report_shows_the_numbers_from_the_records(page: _StrictHTML, expected: str) -> None:
    text = "".join(page.text)
    assert expected in text
    assert page.tags.count("script") == 0


@pytest.mark.parametrize(
    ("row", "value"),
    [("inputs", "6"), ("approved", "2 (33%)"), ("model calls", "19"), ("cost", "$0.0500")],
)
def test_summary_table_rows(row: str, value: str) -> None:
    html = render_report(RECORDS)
    assert f'<th>{row}</th><td class="n">{value}</td>' in html


def test_score_by_round_means(page: _StrictHTML) -> None:
    text = "".join(page.text)
    # Round 1: (0.55 + 0.92 + 0.31 + 0.4) / 4 = 0.545; round 2: (0.95 + 0.52) / 2; round 3: 0.71.
    for label in ("round 1", "round 2", "round 3"):
        assert label in text
    assert "0.55" in text and "0.73" in text and "0.71" in text


def test_report_of_nothing_is_still_a_page() -> None:
    parser = _StrictHTML()
    parser.feed(render_report([]))
    assert parser.stack == []
    assert "No scores yet." in "".join(parser.text)


def test_summary_counts_records_and_skips_rejected_from_means() -> None:
    summary = Summary()
    for record in RECORDS:
        summary.add(record)
    assert summary.counts["approved"] == 2
    assert summary.counts["rejected"] == 1
    assert summary.total == 6
    assert summary.runs == 5
    assert summary.mean_rounds == pytest.approx(7 / 5)
    assert summary.usd == pytest.approx(0.05)
    assert summary.tokens == 5 * 1200
    assert not summary.ok


def test_summary_reads_a_results_files_usage_leniently() -> None:
    """A record read back from a file may hold anything in its usage: what cannot be a
    count is 0, and the rest is summed (cached calls apart)."""
    summary = Summary()
    summary.add({"status": "approved", "usage": {"input_tokens": 10, "calls": 2, "usd": 0.5}})
    summary.add(
        {
            "status": "approved",
            "usage": {"input_tokens": "x", "output_tokens": -4, "calls": None, "usd": "0.25"},
        }
    )
    summary.add({"status": "approved", "usage": {"cached_calls": 3, "saved_usd": 0.1}})
    summary.add({"status": "approved", "usage": ["not", "a", "mapping"]})
    assert (summary.input_tokens, summary.output_tokens, summary.calls) == (10, 0, 2)
    assert summary.usd == pytest.approx(0.75)
    assert (summary.cached_calls, summary.saved_usd) == (3, pytest.approx(0.1))


@pytest.mark.parametrize(
    ("statuses", "ok"),
    [
        (["approved", "max_rounds_reached"], True),
        (["approved", "interrupted"], False),
        (["approved", "cancelled"], False),
        (["approved", "failed"], False),
        (["approved", "rejected"], False),
    ],
)
def test_summary_ok_means_every_input_accepted_and_finished_well(
    statuses: list[str], ok: bool
) -> None:
    summary = Summary()
    for status in statuses:
        summary.add({"status": status})
    assert summary.ok is ok


FINDING = {
    "message": "SQL injection",
    "path": "db.py",
    "line": 3,
    "end_line": None,
    "severity": "error",
    "rule": None,
}


def test_result_record_from_a_run_result() -> None:
    result = RunResult(
        run_id="r1",
        status="approved",
        output="done",
        output_round=1,
        final_score=0.93,
        scored_output_round=1,
        rounds=[
            RoundRecord(
                round=1,
                score=0.5,
                issues=["db.py:3: SQL injection"],
                summary="bad",
                revision="v1",
                findings=[FINDING],
            ),
            RoundRecord(round=2, score=0.93, issues=[], summary="good"),
        ],
        usage=UsageReport(
            total=Usage(input_tokens=10, output_tokens=5, calls=3, usd=0.0001234567),
            by_role={
                "actor": Usage(input_tokens=6, output_tokens=3, calls=2, usd=0.0001),
                "critic": Usage(input_tokens=4, output_tokens=2, calls=1, usd=0.0000234567),
            },
        ),
        input_id="sql",
        batch_id="b1",
        user_id="u1",
        metadata={"lang": "py"},
        created_at=99.0,
        started_at=100.0,
        finished_at=102.5,
    )
    spec = Team.actor_critic(
        actor=Agent("Fix.", model="sim"), critic=Agent("Judge.", model="gpt-4o"), max_rounds=4
    ).spec
    record = result_record(result, index=7, spec=spec)
    assert record == {
        "index": 7,
        "id": "sql",
        "status": "approved",
        "output": "done",
        "final_score": 0.93,
        "scored_output_round": 1,
        "output_round": 1,
        "keep": "last",
        "best_round": None,
        "rounds": [
            {
                "round": 1,
                "score": 0.5,
                "issues": ["db.py:3: SQL injection"],
                "summary": "bad",
                "findings": [FINDING],
            },
            {"round": 2, "score": 0.93, "issues": [], "summary": "good", "findings": []},
        ],
        "n_rounds": 2,
        "issues": [],
        "findings": [],
        "tool_turns": [],
        "usage": {
            "input_tokens": 10,
            "output_tokens": 5,
            "calls": 3,
            "usd": 0.000123,
            "by_role": {
                "actor": {"input_tokens": 6, "output_tokens": 3, "calls": 2, "usd": 0.0001},
                "critic": {"input_tokens": 4, "output_tokens": 2, "calls": 1, "usd": 2.3e-05},
            },
        },
        "reason": None,
        "error": None,
        "run_id": "r1",
        "batch_id": "b1",
        "user_id": "u1",
        "metadata": {"lang": "py"},
        "models": {"actor": "sim", "critic": "gpt-4o"},
        "loop": {
            "max_rounds": 4,
            "approval_threshold": 0.9,
            "keep": "last",
            "min_improvement": None,
        },
        "created_at": "1970-01-01T00:01:39+00:00",
        "started_at": "1970-01-01T00:01:40+00:00",
        "finished_at": "1970-01-01T00:01:42.500000+00:00",
        "duration_s": 2.5,
    }
    json.dumps(record)  # a results-file line


def test_rejected_record_says_where_and_why() -> None:
    record = rejected_record(InputProblem("in.csv", 4, "empty prompt", "x"))
    assert (record["id"], record["status"], record["reason"]) == ("x", "rejected", "empty prompt")
    assert (record["source"], record["line"], record["n_rounds"]) == ("in.csv", 4, 0)


def test_csv_row_flattens_usage_and_keeps_nested_fields_as_json() -> None:
    sink = io.StringIO()
    writer = csv.writer(sink)
    writer.writerow(CSV_COLUMNS)
    writer.writerow(csv_row(RECORDS[0]))
    row = next(csv.DictReader(io.StringIO(sink.getvalue())))
    assert (row["id"], row["status"], row["usd"], row["n_rounds"]) == (
        "sql-fstring",
        "approved",
        "0.0125",
        "2",
    )
    assert json.loads(row["rounds"])[1]["score"] == 0.95
    assert row["reason"] == ""


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised(start: str) -> None:
    record = {**RECORDS[0], "id": f'{start}HYPERLINK("http://x")', "output": f"{start}1+1"}
    row = dict(zip(CSV_COLUMNS, csv_row(record), strict=True))
    assert row["id"] == f'\'{start}HYPERLINK("http://x")' and row["output"] == f"'{start}1+1"
    assert row["usd"] == RECORDS[0]["usage"]["usd"], "numbers stay numbers"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_property_no_csv_cell_starts_a_formula(text: str) -> None:
    cell = csv_cell(text)
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))
    assert cell in (text, "'" + text)


def test_report_lists_every_input_not_approved_with_its_last_score_and_issues() -> None:
    issue = "Input <b>validation</b> is incomplete"
    by_role = {
        "actor": {"input_tokens": 700, "output_tokens": 150, "calls": 2, "usd": 0.01},
        "critic": {"input_tokens": 300, "output_tokens": 50, "calls": 1, "usd": 0.0025},
    }
    common = {
        "batch_id": "b-42",
        "models": {"actor": "claude-opus-4-7", "critic": "gpt-4o"},
        "loop": {"max_rounds": 3, "approval_threshold": 0.9},
        "created_at": "2026-11-30T10:00:00+00:00",
        "finished_at": "2026-11-30T10:05:00+00:00",
    }
    records = [
        {**r, **common, "usage": {**r["usage"], "by_role": by_role}} for r in RECORDS[:-1]
    ] + [RECORDS[-1]]
    records[2]["rounds"][-1]["issues"] = [issue, "No tests"]  # pickle: out of rounds
    records[2]["issues"] = [issue, "No tests"]
    records[0]["rounds"][0]["issues"] = [issue.upper()]  # an earlier round's: not counted
    page = render_report(records, title="t")
    parser = _StrictHTML()
    parser.feed(page)
    section = page.split('id="inputs-not-approved"', 1)[1].split("</section>", 1)[0]
    for id_ in ("pickle", "jwt", "&lt;script&gt;alert(1)&lt;/script&gt;", "malformed JSON"):
        assert id_ in section
    assert "sql-fstring" not in section and "shell-true" not in section
    pickle_row = section.split('data-id="pickle"', 1)[1].split('<details class="input"', 1)[0]
    assert (
        "0.71" in pickle_row and "Input &lt;b&gt;validation&lt;/b&gt; is incomplete" in pickle_row
    )
    frequent = page.split('id="most-frequent-issues"', 1)[1].split("</section>", 1)[0]
    # Final-round issues only, counted once per input.
    assert (
        '<td>Input &lt;b&gt;validation&lt;/b&gt; is incomplete</td><td class="n">1</td>' in frequent
    )
    assert "INPUT &lt;B&gt;" not in frequent
    assert '<td>No tests</td><td class="n">1</td>' in frequent
    batch = page.split('id="batch"', 1)[1].split("</section>", 1)[0]
    for text in (
        "b-42",
        "claude-opus-4-7",
        "gpt-4o",
        "2026-11-30 10:00 UTC",
        "2026-11-30 10:05 UTC",
        "Spend by role",
        "$0.0500",
        "$0.0125",
    ):
        assert text in batch, text
    why = page.split('id="why-inputs-did-not-finish-well"', 1)[1].split("</section>", 1)[0]
    assert "budget:batch:usd" in why and "rejected: malformed JSON" in why


def test_a_csv_results_file_reads_back_as_the_records_written(tmp_path: Any) -> None:
    from duet.commands.results import ResultsFile, read_records

    records = [
        {**r, "index": n, "models": {"actor": "sim", "critic": "gpt-4o"}, "issues": ["x"]}
        for n, r in enumerate(RECORDS[:3])
    ]
    records[0]["id"] = "=cmd()"  # neutralised in the file, itself again when read back
    path = tmp_path / "r.csv"
    sink = ResultsFile(path)
    for record in reversed(records):  # written as runs finish...
        sink.write(record)
    sink.finish()  # ...and put in input order
    back = list(read_records(path))
    assert [r["id"] for r in back] == ["=cmd()", "shell-true", "pickle"]
    for got, want in zip(back, records, strict=True):
        assert got["usage"] == {
            k: want["usage"][k] for k in ("input_tokens", "output_tokens", "calls", "usd")
        }
        assert (got["models"], got["issues"], got["rounds"]) == (
            want["models"],
            ["x"],
            want["rounds"],
        )
        assert (got["status"], got["final_score"]) == (want["status"], want["final_score"])


TEXT_IDS = ["007", "1e3", "True", "1.50", "-0", "'quoted", "''", "'=x", "NaN", " 7 "]


def test_csv_ids_and_text_read_back_as_the_text_written(
    tmp_path: Any, reliability: Reliability
) -> None:
    from duet.commands.results import ResultsFile, finished_records, read_records

    path = tmp_path / "r.csv"
    sink = ResultsFile(path)
    for n, input_id in enumerate(TEXT_IDS):
        sink.write(
            {
                **RECORDS[0],
                "index": n,
                "id": input_id,
                "user_id": input_id,
                "output": input_id,
                "status": "approved",
            }
        )
    sink.finish()
    back = list(read_records(path))
    changed = [r["id"] for r, i in zip(back, TEXT_IDS, strict=True) if r["id"] != i]
    reliability.record(
        section=MODEL_OUTPUT,
        fault="CSV ids",
        load=f"{len(TEXT_IDS)} ids that look like numbers, booleans or quoted text, "
        "written to a CSV results file and read back",
        lost=lost_of(len(changed), len(TEXT_IDS), "ids read back changed"),
        before="`007` read back as `7`, `1e3` as `1000.0`: --resume-from ran them again",
    )
    assert [(r["id"], r["user_id"], r["output"]) for r in back] == [(i, i, i) for i in TEXT_IDS]
    assert [r["index"] for r in back] == list(range(len(TEXT_IDS)))
    assert isinstance(back[0]["usage"]["usd"], float)
    assert sorted(finished_records(path)) == sorted(TEXT_IDS)


def test_a_csv_results_file_with_a_long_output_is_written_and_read_back(tmp_path: Any) -> None:
    from duet.commands.results import ResultsFile, read_records

    before = csv.field_size_limit(131_072)  # the csv module's default, in a fresh process
    try:
        path = tmp_path / "r.csv"
        sink = ResultsFile(path)
        sink.write({**RECORDS[0], "output": "x" * 200_000})
        sink.finish()
        assert [len(r["output"]) for r in read_records(path)] == [200_000]
    finally:
        csv.field_size_limit(before)


def test_a_results_line_too_deep_or_too_long_is_refused_naming_it(tmp_path: Any) -> None:
    from duet.commands.results import read_records

    deep = '{"a": ' * 1000 + "1" + "}" * 1000
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text(json.dumps(RECORDS[0]) + "\n" + '{"metadata": ' + deep + "}\n")
    with pytest.raises(ConfigError, match=r"r.jsonl:2: not a results record: nested deeper"):
        list(read_records(jsonl))
    longer = {**RECORDS[0], "output": "x" * 1_000}
    jsonl.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps(longer) + "\n")
    with pytest.raises(ConfigError, match=r"r.jsonl:2: not a results record: [0-9,]+ bytes, over"):
        list(read_records(jsonl, max_line_bytes=len(json.dumps(RECORDS[0])) + 1))
    table = tmp_path / "r.csv"
    with table.open("w", newline="") as fh:
        csv.writer(fh).writerows(
            [["id", "status", "usd", "metadata"], ["a", "approved", "0", deep]]
        )
    with pytest.raises(ConfigError, match=r"r.csv:2: metadata: nested deeper than 64 levels"):
        list(read_records(table))


@pytest.mark.parametrize(
    ("input_id", "written"),
    [
        ("a.py", "a.py"),
        ("pkg/b.py", "pkg/b.py"),
        ("../escape.py", None),
        ("/etc/cron.d/x", None),
        ("pkg/../../x", None),
        ("a//b", "a/b"),
        ("c:\\\\windows", None),
        ("", None),
        (".", None),
        ("./", None),
        ("a/./b", "a/b"),
    ],
)
def test_output_dir_writes_inside_the_folder_only(
    tmp_path: Any, input_id: str, written: str | None
) -> None:
    from duet.formats.outputs import write_outputs

    folder = tmp_path / "out"
    record = {"id": input_id, "status": "approved", "output": "fixed"}
    count, refused = write_outputs([record, {**record, "status": "max_rounds_reached"}], folder)
    files = (
        sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        if folder.exists()
        else []
    )
    assert (count, files) == ((1, [written]) if written else (0, []))
    assert [r.id for r in refused] == ([] if written else [input_id])
    assert not (tmp_path / "escape.py").exists()


def test_output_dir_traps_are_each_refused_by_id_and_the_rest_written(
    tmp_path: Any, reliability: Reliability
) -> None:
    from duet.formats.outputs import write_outputs

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep me")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "link").symlink_to(outside)
    (folder / "victim").symlink_to(outside / "victim")
    (folder / "pipe").mkdir()
    os.mkfifo(folder / "pipe" / "fifo")
    traps = {
        "link/x.py": "a symlink is in its way: not followed",
        "victim": "a symlink is in its way: not followed",
        "n" * 300: "a name in it is longer than the file system allows",
        "a.py/b.py": "a file is in the way of its folder",
        "pkg": "a folder of that name is there",
        "pipe/fifo": "not a regular file there",
        ".": "not a path inside the folder",
        "..": "not a path inside the folder",
    }
    good = ["a.py", "pkg/b.py", "deep/" * 10 + "c.py"]
    records = [{"id": i, "status": "approved", "output": f"fixed {i}"} for i in [*good, *traps]]
    records.append({"id": "broken", "status": "approved", "output": "a lone \ud800"})
    traps["broken"] = "the output is not Unicode text (a lone surrogate)"
    count, missed = write_outputs(records, folder)
    escaped = (outside / "victim").read_text() != "keep me" or (outside / "x.py").exists()
    reliability.record(
        section=MODEL_OUTPUT,
        fault="symlinked output dir",
        load=f"--output-dir with {len(traps)} trap ids (symlinks out of DIR, a FIFO, a name "
        "over NAME_MAX, file/folder clashes, `.`, `..`) among 3 good ids",
        lost=lost_of(3 - count, 3, "good outputs") + ("; wrote outside DIR" if escaped else ""),
        before="the symlink was followed out of DIR; a long id, a clash or `.` ended the "
        "write with a traceback",
    )
    assert count == 3 and not escaped
    assert {m.id: m.reason for m in missed} == traps
    assert (folder / "pkg" / "b.py").read_text() == "fixed pkg/b.py"
    assert not (folder / "broken").exists()


def test_frequent_issues_count_only_final_round_issues() -> None:
    """An issue a later round fixed is not among the most frequent issues."""
    fixed = {
        "status": "approved",
        "issues": [],
        "rounds": [
            {"round": 0, "score": 0.2, "issues": ["FIXEDISSUE"]},
            {"round": 1, "score": 0.9, "issues": []},
        ],
    }
    still = {
        "status": "max_rounds_reached",
        "issues": ["OPENISSUE"],
        "rounds": [{"round": 0, "score": 0.2, "issues": ["OPENISSUE"]}],
    }
    page = render_report([fixed, still])
    table = page.split('id="most-frequent-issues"', 1)[1].split("</section>", 1)[0]
    assert "OPENISSUE" in table
    assert "FIXEDISSUE" not in page


def test_readable_date_drops_microseconds() -> None:
    from duet.report.records import readable_date

    assert readable_date("2026-12-02T13:20:05.123456+00:00") == "2026-12-02 13:20 UTC"
    assert readable_date("not a date") == "not a date"


def test_the_report_escapes_through_its_template_engine_only() -> None:
    """No hand-written escaping in duet/report: the Jinja2 environment autoescapes."""
    from pathlib import Path

    room = Path(__file__).resolve().parents[2] / "duet" / "report"
    by_hand = [
        f"{path.name}:{n}"
        for path in room.glob("*.py")
        for n, text in enumerate(path.read_text().splitlines(), 1)
        if "escape(" in text or "esc(" in text or "Markup(" in text
    ]
    assert not by_hand, by_hand
    page = render_report([{"id": "<img src=x onerror=alert(1)>", "status": "failed"}])
    assert "<img" not in page and "&lt;img src=x" in page
