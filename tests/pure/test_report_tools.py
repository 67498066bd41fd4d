"""Tool calls in result records and the HTML report: each agent run's turns summarised in the
record (results cut, full size said), one closed ``<details>`` per round on the page, and
nothing a model or a tool wrote ever live markup."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from duet.report import toolviews
from duet.report.html import render_report
from duet.report.records import csv_row, rejected_record, result_record
from duet.report.toolviews import TOOL_ROWS, round_views, tool_rows
from duet.report.turns import CALLS_LISTED, RESULT_CHARS, call_outcome, tool_turns
from orchestration.core.results import RoundRecord, RunResult, UsageReport
from orchestration.core.usage import Usage
from orchestration.state.turns import Turn

#: What a hostile file or model would put in a tool's result, arguments and name.
HOSTILE = (
    "<script>document.title='pwned'</script></details></pre></li></ol>"
    '<a href="javascript:alert(1)">click</a><img src=x onerror=alert(2)>'
)


def _turn(number: int, calls: list[tuple[str, dict[str, Any]]], results: dict[int, Any]) -> Turn:
    data = {
        "text": "",
        "tool_calls": [
            {"id": f"c{i}", "name": n, "arguments": a} for i, (n, a) in enumerate(calls)
        ],
    }
    return Turn(number, data, results)


def _stored() -> dict[str, list[Turn]]:
    """A run's stored turns: the critic of round 1 takes two turns of tools (one result an
    error, one served from the cache, one long), the actor's refine one, its draft none."""
    long = "line of a file\n" * 500
    return {
        "r1.refine": [_turn(1, [("grep", {"pattern": "parse"})], {})],  # no result yet
        "r1.critique": [
            _turn(
                1,
                [("read_file", {"path": "a.py"}), ("run_tests", {})],
                {
                    0: {"name": "read_file", "result": long, "ok": True, "seconds": 0.0125},
                    1: {
                        "name": "run_tests",
                        "result": "tests: 2 passed",
                        "ok": True,
                        "seconds": 0.0,
                        "cached": True,
                    },
                },
            ),
            _turn(
                2,
                [("read_file", {"path": "../../etc/passwd"})],
                {
                    0: {
                        "name": "read_file",
                        "result": "refused: outside the repository",
                        "ok": False,
                        "seconds": 0.001,
                    }
                },
            ),
        ],
    }


def test_a_record_carries_each_agent_runs_tool_calls_in_the_runs_order() -> None:
    steps = tool_turns(_stored())
    assert [(s["step"], s["round"], s["role"]) for s in steps] == [
        ("r1.critique", 1, "critic"),
        ("r1.refine", 1, "actor"),
    ]
    first, second = steps[0]["turns"]
    assert (first["turn"], second["turn"]) == (1, 2)
    read, tests = first["calls"]
    assert read["name"] == "read_file" and json.loads(read["arguments"]) == {"path": "a.py"}
    assert len(read["result"]) == RESULT_CHARS and read["result_chars"] == 15 * 500
    assert (read["ok"], read["cached"], read["seconds"]) == (True, False, 0.0125)
    assert (tests["cached"], tests["result"], tests["result_chars"]) == (
        True,
        "tests: 2 passed",
        15,
    )
    (refused,) = second["calls"]
    assert refused["ok"] is False and refused["result"] == "refused: outside the repository"
    (pending,) = steps[1]["turns"][0]["calls"]
    assert (pending["ok"], pending["result"], pending["seconds"]) == (None, None, None)
    json.dumps(steps)  # a results-file line


def test_duet_show_and_the_record_say_a_call_the_same_way() -> None:
    steps = tool_turns(_stored())
    read, tests = steps[0]["turns"][0]["calls"]
    assert call_outcome(tests, 160) == "served from cache, ok: tests: 2 passed"
    assert call_outcome(read, 19) == "ok: line of a file line"
    assert (
        call_outcome(steps[0]["turns"][1]["calls"][0], 160)
        == "error: refused: outside the repository"
    )
    assert call_outcome(steps[1]["turns"][0]["calls"][0], 160) == "running"


def test_an_agent_run_with_a_great_many_calls_lists_some_and_counts_the_rest() -> None:
    many = [_turn(n, [("grep", {"n": n})] * 10, {}) for n in range(1, 11)]
    (step,) = tool_turns({"r2.critique": many})
    listed = sum(len(t["calls"]) for t in step["turns"])
    assert listed == CALLS_LISTED and step["unlisted"] == 100 - CALLS_LISTED
    (view,) = round_views({"tool_turns": [step]})
    assert view.calls == CALLS_LISTED and view.unlisted == 100 - CALLS_LISTED
    (row, more) = tool_rows([{"tool_turns": [step]}])
    assert (row.name, row.calls, more.name, more.calls) == (
        "grep",
        CALLS_LISTED,
        "(not listed)",
        100 - CALLS_LISTED,
    )


def _result(**extra: Any) -> RunResult:
    fields: dict[str, Any] = {
        "run_id": "r" * 32,
        "status": "max_rounds_reached",
        "output": "fixed",
        "final_score": 0.5,
        "rounds": [RoundRecord(round=1, score=0.5, issues=["x"])],
        "usage": UsageReport(total=Usage(calls=4, tool_calls=4)),
        "input_id": "in-1",
    }
    return RunResult(**{**fields, **extra})


def test_result_and_rejected_records_have_tool_turns_and_the_csv_keeps_them() -> None:
    record = result_record(_result(), turns=_stored())
    assert [s["step"] for s in record["tool_turns"]] == ["r1.critique", "r1.refine"]
    assert record["usage"]["tool_calls"] == 4
    assert result_record(_result())["tool_turns"] == []
    assert rejected_record({"id": "x", "source": "f", "line": 1, "reason": "r"})["tool_turns"] == []
    from duet.report.records import CSV_COLUMNS

    row = dict(zip(CSV_COLUMNS, csv_row(record), strict=True))
    assert json.loads(row["tool_turns"]) == record["tool_turns"]


def test_a_csv_results_file_reads_back_its_tool_turns(tmp_path: Path) -> None:
    from duet.commands.results import ResultsFile, read_records

    record = {**result_record(_result(), turns=_stored()), "index": 0}
    path = tmp_path / "r.csv"
    sink = ResultsFile(path)
    sink.write(record)
    sink.finish()
    (back,) = read_records(path)
    assert back["tool_turns"] == record["tool_turns"]


class _Page(HTMLParser):
    """Every element of a page with its attributes, and the rounds' folded blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def of(self, tag: str, cls: str | None = None) -> list[dict[str, str | None]]:
        return [
            a for t, a in self.tags if t == tag and (cls is None or cls in (a.get("class") or ""))
        ]


def _page(records: list[dict[str, Any]]) -> tuple[str, _Page]:
    html = render_report(records)
    parsed = _Page()
    parsed.feed(html)
    parsed.close()
    return html, parsed


def test_each_round_with_tool_calls_is_one_closed_details_block() -> None:
    record = result_record(_result(), turns=_stored())
    approved = {
        **result_record(_result(input_id="ok-1", status="approved"), turns=_stored()),
        "run_id": "a" * 32,
    }
    html, page = _page([record, approved])
    rounds = page.of("details", "round")
    assert len(rounds) == 1, "one round with tool calls, of the one input not approved"
    assert all("open" not in a for a in rounds), "closed by default"
    text = "".join(page.text)
    assert "Round 1: 4 tool call(s) in 3 turn(s), 1 error(s), 1 served from cache" in text
    assert "critic · model call 2" in text and "actor · model call 1" in text
    assert f"… {15 * 500 - RESULT_CHARS:,} more characters (of {15 * 500:,})" in text
    assert "served from cache" in text and "running" in text
    assert "refused: outside the repository" in text
    # the summary and the batch's tool table count the approved input's calls too
    assert "8 (2 error(s), 2 served from cache;" in text
    tools = {
        tuple(cells[:3])
        for row in html.split('<table class="tools">')[1].split("</table>")[0].split("<tr>")[2:]
        if (cells := [c.split("</td>")[0] for c in row.split("<td")[1:]])
    }
    assert (">critic", "><code>read_file</code>", ' class="n">4') in tools


def test_nothing_a_tool_or_a_model_wrote_is_live_markup() -> None:
    stored = {
        "r1.critique": [
            _turn(
                1,
                [(HOSTILE, {"path": HOSTILE, "url": "javascript:alert(3)"})],
                {0: {"name": HOSTILE, "result": HOSTILE * 3, "ok": False, "seconds": 0.5}},
            )
        ]
    }
    record = result_record(_result(), turns=stored)
    html, page = _page([record])
    assert page.of("script") == [] and page.of("img") == []
    assert not [a for a in page.of("a") if "javascript" in str(a.get("href"))]
    assert not any(k.startswith("on") for _, a in page.tags for k in a)
    # a "</details>" in a result closed nothing: one input block and one round block
    assert len(page.of("details", "input")) == 1 and len(page.of("details", "round")) == 1
    assert html.count("</details>") == len(page.of("details"))
    text = "".join(page.text)
    assert HOSTILE in text, "shown as text"
    assert '"url": "javascript:alert(3)"' in text


def test_the_templates_mark_nothing_safe() -> None:
    """Model and tool text reaches the page only through autoescaping: no ``|safe``."""
    templates = Path(__file__).resolve().parents[2] / "duet" / "report" / "templates"
    marked = [p.name for p in templates.glob("*.j2") if "|safe" in p.read_text().replace(" ", "")]
    assert not marked, marked


def test_a_page_lists_tool_calls_up_to_its_limit_worst_inputs_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(toolviews, "PAGE_CALLS", 6)
    records = [
        {**result_record(_result(input_id=f"in-{n}", final_score=n / 10), turns=_stored())}
        for n in range(3)
    ]  # 4 calls in round 1 each; in-0 is the worst
    _html, page = _page(records)
    assert len(page.of("details", "round")) == 3, "every round keeps its fold and counts"
    text = "".join(page.text)
    assert text.count("critic · model call 1") == 1, "only the worst input's calls listed"
    assert text.count("Not listed here") == 2
    assert text.count("Round 1: 4 tool call(s) in 3 turn(s)") == 3


def test_odd_tool_turns_in_a_results_file_are_skipped_not_fatal() -> None:
    odd: list[Any] = [
        "text",
        {"step": "not a step", "turns": [{"calls": [{}]}]},
        {"step": "r1.critique", "turns": ["x", {"turn": "1", "calls": [3, {"ok": "yes"}]}]},
        {"step": "r2.refine", "turns": None, "unlisted": "many"},
    ]
    record = {**result_record(_result()), "tool_turns": odd}
    (view,) = round_views(record)
    (turn,) = view.turns
    assert turn.number == 0 and [c.state for c in turn.calls] == ["error"]
    _html, page = _page([record, {**record, "tool_turns": {"not": "a list"}}])
    assert len(page.of("details", "round")) == 1


def test_the_batch_tool_table_sums_past_its_rows() -> None:
    steps = [
        {"step": "r1.critique", "turns": [{"turn": 1, "calls": [{"name": f"t{n}", "ok": True}]}]}
        for n in range(TOOL_ROWS + 5)
    ]
    rows = tool_rows([{"tool_turns": steps}])
    assert len(rows) == TOOL_ROWS + 1
    assert rows[-1].name == "(other tools: 5)" and rows[-1].calls == 5
