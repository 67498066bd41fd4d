"""Code review's pure parts: git name-status parsing, findings, SARIF (checked against
the official OASIS schema), rdjson, annotations, the PR summary, patches and sim scripts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest

from duet.config import parse_config
from duet.formats.findings import DEFAULT_RULE, at_least, findings, in_files
from duet.formats.patch import build_patch, fenced_file
from duet.formats.sarif import sarif_log
from duet.formats.text import escape_property, github_annotations, markdown_summary, rdjson
from duet.intake.diffs import Change, binary, fence, parse_raw, split_range, vendored
from orchestration.core.errors import ConfigError
from orchestration.core.review_templates import review_config
from tests.reliability import MODEL_OUTPUT
from workers.providers.sim import parse_sim_model, simulate

SCHEMA = json.loads((Path(__file__).parents[1] / "data/sarif-schema-2.1.0.json").read_text())


def _record(**fields: object) -> dict:
    base = {
        "id": "app.py",
        "status": "max_rounds",
        "issues": [],
        "rounds": [],
        "models": {"actor": "sim", "critic": "sim:critic"},
        "usage": {},
    }
    return {**base, **fields}


def test_raw_diff_entries_follow_renames_and_copies() -> None:
    z, a, b = "0" * 40, "a" * 40, "b" * 40
    raw = (
        f":100644 100644 {z} {a} M\0a.py\0:100644 100644 {z} {b} R087\0old name.py\0"
        f"new name.py\0:100644 000000 {a} {z} D\0gone.txt\0:100644 120000 {z} {a} C100\0x\0y\0"
    ).encode()
    assert parse_raw(raw) == [
        Change("M", "a.py", None, "100644", a, z),
        Change("R", "new name.py", "old name.py", "100644", b, z),
        Change("D", "gone.txt", None, "000000", z, a),
        Change("C", "y", "x", "120000", a, z),
    ]


def test_ranges_vendored_paths_fences_and_binaries() -> None:
    assert split_range("main..feature") == ("main", "feature", False)
    assert split_range("origin/main...HEAD") == ("origin/main", "HEAD", True)
    with pytest.raises(ConfigError, match="BASE..HEAD"):
        split_range("main")
    assert vendored("web/node_modules/x.js") and vendored("third_party/a/b.c")
    assert not vendored("src/vendor.py")
    assert fence("a ``` b\n").startswith("````\n")
    assert binary(b"ab\0c") and not binary(b"abc")


def test_strings_and_objects_become_findings() -> None:
    records = [
        _record(issues=["app.py:5-6: error: SQL injection", "Missing tests"]),
        _record(
            id="lib.py",
            findings=[
                {
                    "message": "race",
                    "path": "lib.py",
                    "line": 3,
                    "severity": "note",
                    "rule": "race",
                },
                {"message": "bad line", "line": -2, "severity": "fatal"},
            ],
        ),
        _record(id="ok.py", status="approved", issues=["left over"]),
    ]
    got = list(findings(records))
    assert [(f.path, f.line, f.end_line, f.severity, f.rule) for f in got] == [
        ("app.py", 5, 6, "error", DEFAULT_RULE),
        ("app.py", None, None, "warning", DEFAULT_RULE),
        ("lib.py", 3, None, "note", "race"),
        ("lib.py", None, None, "warning", DEFAULT_RULE),  # a bad line is a file-level finding
    ]
    everything = _record(id="ok.py", status="approved", rounds=[{"issues": ["r1"]}, {"issues": []}])
    assert [f.message for f in findings([everything], everything=True)] == ["r1"]
    assert at_least("error", "warning") and not at_least("note", "warning")


def test_lines_are_checked_against_the_reviewed_file_and_findings_never_dropped() -> None:
    records = [
        _record(
            issues=[
                "app.py:99: error: past the end",
                "app.py:2-40: a range running past",
                "app.py:3: inside",
                "gone.py:7: a file not at hand",
            ]
        ),
    ]
    files = {"app.py": "one\ntwo\nthree\n"}
    got = list(in_files(findings(records), files.get))
    assert [(f.path, f.line, f.end_line, f.message) for f in got] == [
        ("app.py", None, None, "past the end"),  # kept, at file level
        ("app.py", 2, 3, "a range running past"),
        ("app.py", 3, None, "inside"),
        ("gone.py", 7, None, "a file not at hand"),  # nothing to check it against
    ]
    result = sarif_log(got)["runs"][0]["results"][0]
    assert "region" not in result["locations"][0]["physicalLocation"]
    assert result["level"] == "error"


def test_sarif_validates_against_the_oasis_schema_with_one_run_for_every_critic() -> None:
    records = [
        _record(issues=["app.py:5: error: SQL injection"]),
        _record(id="b.py", models={"critic": "gpt-x"}, findings=[{"message": "m", "rule": "r1"}]),
        _record(id="c.py", issues=["no location at all"]),
    ]
    log = sarif_log(findings(records), version="1.2.3")
    jsonschema.validate(log, SCHEMA)
    (run,) = log["runs"]
    assert run["tool"]["driver"]["properties"]["critics"] == ["gpt-x", "sim:critic"]
    first = run["results"][0]
    assert first["level"] == "error"
    assert first["locations"][0]["physicalLocation"]["region"] == {"startLine": 5}
    empty = sarif_log([])
    jsonschema.validate(empty, SCHEMA)


def test_rdjson_annotations_and_markdown() -> None:
    found = list(findings([_record(id="a,b.py", issues=["a,b.py:2: error: 100% bad\r\nreally"])]))
    diag = rdjson(found)["diagnostics"][0]
    assert diag["severity"] == "ERROR" and diag["location"] == {
        "path": "a,b.py",
        "range": {"start": {"line": 2}},
    }
    line = github_annotations(found)
    assert line == "::error file=a%2Cb.py,line=2,title=duet duet/review::100%25 bad%0D%0Areally\n"
    assert escape_property("x:y,z%") == "x%3Ay%2Cz%25"
    text = markdown_summary([_record(), _record(status="approved")], found)
    assert "1 approved, 1 max_rounds" in text and "| error | `a,b.py:2` |" in text


def test_hostile_issue_text_stays_in_its_cell_and_annotation(reliability) -> None:
    hostile = list(findings([_record(issues=["<img src=x> | @admins\nnew row\n::error::forged"])]))
    row = markdown_summary([], hostile).splitlines()[-1]
    assert (
        row
        == "| warning | `app.py` | &lt;img src=x&gt; \\| @\u200badmins new row ::error::forged |"
    )
    annotation = github_annotations(hostile)
    assert annotation.count("\n") == 1 and "%0A::error::forged" in annotation
    reliability.record(
        section=MODEL_OUTPUT,
        fault="a critic's issue with HTML, table pipes, @-mentions and a forged workflow command",
        load="unit: one issue rendered as a PR-comment row and as a GitHub annotation",
        lost="none: one escaped table row, one annotation line; no HTML, mention or command",
    )


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "r"
    (repo / "src").mkdir(parents=True)
    (repo / "src/a.py").write_text("x = 1\ny = 2\n")
    (repo / "b.txt").write_text("no newline")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    return repo


def test_patch_of_approved_files_applies_and_prose_is_left_out(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    records = [
        _record(
            id="src/a.py", status="approved", output="Fixed:\n```python\nx = 1\ny = 3\n```\nDone."
        ),
        _record(id="b.txt", status="approved", output="```\nfixed\n```\n"),
        _record(id="b.txt", status="approved", output="Looks fine to me."),  # prose
        _record(id="src/a.py#hunk1", status="approved", output="```\nz\n```"),
        _record(id="gone.py", status="approved", output="```\nz\n```"),
        _record(id="src/a.py", status="max_rounds", output="```\nq\n```"),
        _record(id="c.py", status="rejected", output=None),
    ]
    read = lambda p: (repo / p).read_text() if (repo / p).is_file() else None  # noqa: E731
    made = build_patch(records, read)
    assert made.files == 2
    assert made.left_out == {
        "not a fix (no fenced code block)": 1,
        "a hunk without its lines": 1,
        "reviewed file not found": 1,
    }
    assert made.not_approved == 1  # the rejected input never ran: not counted
    (tmp_path / "p.diff").write_text(made.text)
    subprocess.run(
        ["git", "-C", str(repo), "apply", "--check", str(tmp_path / "p.diff")], check=True
    )
    subprocess.run(["git", "-C", str(repo), "apply", str(tmp_path / "p.diff")], check=True)
    assert (repo / "src/a.py").read_text() == "x = 1\ny = 3\n"
    assert (repo / "b.txt").read_text() == "fixed\n"
    assert fenced_file("no fence") is None


def test_sim_scripts_an_issue_and_an_echoed_fix() -> None:
    critic = "sim:critic?scores=0.4,0.95&issue=app.py:5: error: injection"
    assert json.loads(simulate(critic, [{"role": "user", "content": "x"}], 500).text)["issues"] == [
        "app.py:5: error: injection"
    ]
    task = "```diff\n-a\n+b\n```\n\n```\nkeep bad()\n```\n"
    reply = simulate("sim?echo=1&replace=bad=>good", [{"role": "user", "content": task}], 500).text
    assert reply == "[revision 0]\n```\nkeep good()\n```\n"
    with pytest.raises(ConfigError, match="OLD=>NEW"):
        parse_sim_model("sim?replace=nothing")


def test_the_built_in_review_config_asks_for_located_issues() -> None:
    cfg = parse_config(review_config())
    spec = cfg.build_architecture().to_spec()
    assert '"severity"' in spec.critic.instructions and '"line"' in spec.critic.instructions
    assert spec.actor.model == "sim"
