"""Untrusted input through the real ``duet`` command: hostile ids and prompts are printed
as text, spreadsheets get no formulas, and a directory's traps are refused one by one
while every other file is reviewed."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import SIM_CONFIG

pytestmark = pytest.mark.system

FAST_CONFIG = SIM_CONFIG + "\n[loop]\nmax_rounds = 2\n"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DUET_REDIS_URL", "DUET_BROKER_URL")}
    # FORCE_COLOR makes Rich write for a terminal: markup parsed by mistake would show
    # as escape sequences (a hyperlink is ESC ] 8).
    return {**env, "COLUMNS": "200", "FORCE_COLOR": "1", **extra}


def _duet(
    *args: str | Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duet", *map(str, args)],
        env=env or _env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "fast.toml"
    path.write_text(FAST_CONFIG)
    return path


HOSTILE_IDS = [
    "[/b]",
    "[link=https://evil.example]click[/link]",
    '=HYPERLINK("https://evil.example","x")',
    "\x1b]8;;https://evil.example\x07esc\x1b]8;;\x07",
]


def test_hostile_ids_are_shown_as_text_and_kept_out_of_spreadsheet_formulas(
    config: Path, tmp_path: Path
) -> None:
    inputs = tmp_path / "in.jsonl"
    lines = [{"id": i, "prompt": f"Review input {n}: eval(x)"} for n, i in enumerate(HOSTILE_IDS)]
    lines.append({"id": "[/b]", "prompt": "a duplicate, listed on screen as rejected"})
    lines.append({"id": "@SUM(1)", "prompt": "-2+3", "metadata": {"note": "+cmd|' /C calc'!A0"}})
    inputs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.csv"
    done = _duet("run", config, "-i", inputs, "-o", out, cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # one rejected input; no crash on "[/b]"
    assert "Traceback" not in done.stderr and "MarkupError" not in done.stderr
    assert "duplicate id '[/b]'" in done.stderr, "the rejected id is printed literally"
    assert "\x1b]8;" not in done.stderr + done.stdout, "no hyperlink reaches the terminal"
    with out.open(newline="") as sink:
        rows = list(csv.DictReader(sink))
    assert [r["id"] for r in rows] == [
        "[/b]",
        "[link=https://evil.example]click[/link]",
        '\'=HYPERLINK("https://evil.example","x")',
        "\x1b]8;;https://evil.example\x07esc\x1b]8;;\x07",  # a file keeps the id exact
        "[/b]",
        "'@SUM(1)",
    ]
    formula = ("=", "+", "-", "@", "\t", "\r")
    assert not [c for r in rows for c in r.values() if c.startswith(formula)]


def test_directory_traps_are_refused_each_with_a_reason_and_nothing_else_lost(
    config: Path, tmp_path: Path
) -> None:
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "a.py").write_text("import os\nos.system(input())\n")
    (root / "pkg" / "b.py").write_text("eval(input())\n")
    (root / "pkg" / "__init__.py").write_text("")
    (tmp_path / "secret.env").write_text("API_KEY=sk-live-do-not-send\n")
    (root / "passwd").symlink_to("/etc/passwd")
    (root / "zero").symlink_to("/dev/zero")
    (root / "key").symlink_to(tmp_path / "secret.env")
    os.mkfifo(root / "pipe")
    out = tmp_path / "out.jsonl"
    done = _duet("run", config, "-i", root, "-o", out, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert {i for i, r in records.items() if r["status"] != "rejected"} == {"a.py", "pkg/b.py"}
    assert {i: r["reason"] for i, r in records.items() if r["status"] == "rejected"} == {
        "key": "symlink to a file outside the input directory: not read",
        "passwd": "symlink to a file outside the input directory: not read",
        "pipe": "not a regular file (a named pipe (FIFO)): not read",
        "zero": "symlink to a file outside the input directory: not read",
    }
    assert "skipped 1 file(s)" in done.stderr and "1 empty" in done.stderr
    assert "sk-live" not in out.read_text() and "root:" not in out.read_text()


@pytest.fixture
def cluster_env(worker: subprocess.Popen[bytes], system_redis_url: str) -> dict[str, str]:
    return _env(DUET_REDIS_URL=system_redis_url)


def test_show_prints_hostile_ids_and_model_output_as_text(
    cluster_env: dict[str, str], config: Path, tmp_path: Path
) -> None:
    link = "[link=https://evil.example]click me[/link]"
    escape = "\x1b]8;;https://evil.example\x07hidden\x1b]8;;\x07\x1b[2J"
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(json.dumps({"id": link, "prompt": f"Review {escape} [/b] {link}"}) + "\n")
    out = tmp_path / "out.jsonl"
    done = _duet("run", config, "-i", inputs, "-o", out, cwd=tmp_path, env=cluster_env)
    assert done.returncode == 0, done.stderr
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    shown = _duet("show", record["run_id"], "--full", cwd=tmp_path, env=cluster_env)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b]8;" not in shown.stdout, "no terminal hyperlink, from the id or the output"
    assert "\x1b[2J" not in shown.stdout, "no screen clear from the output"
    assert link in shown.stdout, "the id is shown as written"
    assert "\\x1b]8;;https://evil.example\\x07hidden" in shown.stdout, "escapes made visible"


APPROVING_CONFIG = FAST_CONFIG.replace(
    'model = "sim"\n\n[loop]', 'model = "sim:critic?scores=0.95"\n\n[loop]'
)
C1_ID = "c1\x9b2J\x9d8;;https://evil.example\x07"


def test_text_ids_resume_from_csv_c1_output_dir_and_deep_lines_through_duet_run(
    tmp_path: Path,
) -> None:
    config = tmp_path / "approving.toml"
    config.write_text(APPROVING_CONFIG + "\n[inputs]\nmax_line_bytes = 10000\n")
    inputs = tmp_path / "in.jsonl"
    ids = ["007", "1e3", "True", C1_ID, "link/x.py"]
    lines = [json.dumps({"id": i, "prompt": f"Review {i}: eval(x)"}) for i in ids]
    deep = '{"a": ' * 1_000 + "1" + "}" * 1_000
    lines.insert(3, '{"id": "deep", "prompt": "x", "metadata": ' + deep + "}")
    lines.append(json.dumps({"id": "huge", "prompt": "y" * 20_000}))
    inputs.write_text("\n".join(lines) + "\n")
    outside, folder = tmp_path / "outside", tmp_path / "approved"
    outside.mkdir()
    folder.mkdir()
    (folder / "link").symlink_to(outside)
    first = tmp_path / "first.csv"
    done = _duet("run", config, "-i", inputs, "-o", first, "--output-dir", folder, cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # the deep line is rejected, the rest ran
    assert "Traceback" not in done.stderr
    assert "in.jsonl:4" in done.stderr and "nested deeper than 64 levels" in done.stderr
    assert "output of 'link/x.py' not written" in done.stderr and "symlink" in done.stderr
    assert list(outside.iterdir()) == [], "nothing written through the symlink"
    assert (folder / "007").read_text() and (folder / "1e3").is_file()
    shown = done.stdout + done.stderr
    assert not [c for c in shown if 0x80 <= ord(c) <= 0x9F], "no raw C1 control on screen"
    with first.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["id"], r["status"]) for r in rows] == [
        *[(i, "approved") for i in ids[:3]],
        ("", "rejected"),
        *[(i, "approved") for i in ids[3:]],
        ("", "rejected"),  # the deep line and the huge one, read no further: no id
    ]
    assert [r["reason"] for r in rows if r["status"] == "rejected"] == [
        "nested deeper than 64 levels",
        "line is 20,029 bytes, over the limit of 10,000 bytes: not read",
    ]
    ran = {r["id"]: r for r in rows}

    again = tmp_path / "again.csv"
    resumed = _duet("run", config, "-i", inputs, "-o", again, "--resume-from", first, cwd=tmp_path)
    assert resumed.returncode == 1, resumed.stderr
    with again.open(newline="") as fh:
        carried = {r["id"]: r["run_id"] for r in csv.DictReader(fh) if r["status"] == "approved"}
    assert carried == {i: ran[i]["run_id"] for i in ids}, "no approved input ran again"

    listed = _duet("results", first, cwd=tmp_path)
    assert not [c for c in listed.stdout if 0x80 <= ord(c) <= 0x9F], "duet results escapes C1"
    assert C1_ID in [json.loads(line)["id"] for line in listed.stdout.splitlines()]
