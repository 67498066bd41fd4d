"""The walk-through of issue 27, as a test: a 77-file source tree (with ``__pycache__``, a
large ``.pyc`` and a large binary) reviewed on a cluster of two workers with the stand-in
model, from ``duet submit`` to the report, through the real CLI in subprocesses.

Each command's output is checked as a person would read it: no id cut short (``…``), no
traceback, every id printed works as a prefix, one dollar figure per line with its label,
a batch's cost never falls, no rate limit left over from before, and the report shows the
worst inputs first with their issues readable (DOM order and a screenshot, in Chromium).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support import CHROMIUM, celery_worker, chromium, doc_commands, duet_signature, wait_for

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = ROOT / "docs" / "walkthrough.md"
#: The sections of the docs page this test runs (the last is test_resume_interrupted's).
SECTIONS = ("Before: the fleet's rate limits", "Submit and follow", "Triage")
WALK_DB = int(os.environ.get("DUET_WALK_REDIS_DB", "11"))
N_FILES = 77
PRICE = "price = { input_per_mtok = 3.0, output_per_mtok = 15.0 }"
CONFIG = f"""\
[actor]
instructions = "Fix every bug in the file; reply with the whole corrected file."
model = "sim?latency_ms=40"
{PRICE}

[critic]
instructions = "Review the file for bugs. Reply with JSON: score, issues, summary."
model = "sim:critic?latency_ms=40"
{PRICE}

[loop]
max_rounds = 2
approval_threshold = 0.9
# The stand-in critic scores by the first line it sees: the file, so outcomes vary.
critique_template = "Review of: {{prompt}}\\n\\n{{output}}"
"""
#: What a person must never see in what ``duet`` prints.
TRACEBACK = "Traceback (most recent call last)"
ELLIPSIS = "…"


def _tree(root: Path) -> None:
    """77 Python files in a package with subpackages, plus what a real checkout holds and
    review must not read: ``__pycache__`` (small and large ``.pyc``), a large binary."""
    for i in range(N_FILES):
        sub = root / "pkg" / ("core" if i % 3 == 0 else "util" if i % 3 == 1 else "")
        sub.mkdir(parents=True, exist_ok=True)
        body = "".join(
            f"def f{i}_{j}(x):\n    return eval(x) + {j}  # TODO: check input\n\n"
            for j in range(i % 7 + 1)
        )
        (sub / f"mod_{i:02d}.py").write_text(f'"""Module {i}."""\n\n{body}')
    cache = root / "pkg" / "__pycache__"
    cache.mkdir()
    (cache / "mod_00.cpython-311.pyc").write_bytes(b"\xa7\r\r\n" + b"\x00" * 200)
    (cache / "big.cpython-311.pyc").write_bytes(b"\xa7\r\r\n" + os.urandom(300_000))
    (root / "pkg" / "blob.bin").write_bytes(b"\x00\x01" * 200_000)


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DUET_BROKER_URL",)}
    # 80 columns, and piped: where ids used to be cut.
    return {**env, "DUET_REDIS_URL": url, "COLUMNS": "80", "PYTHONUNBUFFERED": "1"}


#: What this test ran, as :func:`duet_signature` (checked against the docs page).
RAN: list[tuple[str, ...]] = []


def _duet(*args: str | Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    RAN.append(duet_signature([str(a) for a in args]))
    done = subprocess.run(
        [sys.executable, "-m", "duet", *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    for stream in (done.stdout, done.stderr):
        assert TRACEBACK not in stream, (args, stream[-3000:])
        assert ELLIPSIS not in stream, (args, stream[-3000:])
        for line in stream.splitlines():
            # One dollar figure a line, and it says what it is.
            figures = re.findall(r"\$\d", line)
            assert len(figures) <= 1, (args, line)
    return done


@pytest.fixture
def cluster(redis_url: str) -> Iterator[str]:
    """An empty db of its own and two worker processes on it."""
    import redis

    url = f"{redis_url.rpartition('/')[0]}/{WALK_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    with (
        celery_worker(url, name="walk1", concurrency=16),
        celery_worker(url, name="walk2", concurrency=16),
    ):
        yield url
    client.flushdb()
    client.close()


class _Inputs(HTMLParser):
    """The report's input blocks in order, with the text of each."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.text: dict[str, list[str]] = {}
        self._current: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        got = dict(attrs)
        if tag == "details" and "input" in (got.get("class") or "").split():
            self._current = str(got.get("data-id"))
            self.ids.append(self._current)
            self.text[self._current] = []

    def handle_data(self, data: str) -> None:
        if self._current is not None:
            self.text[self._current].append(data)


def test_a_77_file_tree_from_submit_to_report_on_two_workers(cluster: str, tmp_path: Path) -> None:
    env = _env(cluster)
    tree = tmp_path / "tree"
    _tree(tree)
    config = tmp_path / "review.toml"
    config.write_text(CONFIG)

    # A limit an earlier config left in the fleet shows, with who set it; cleared, it is gone.
    old = _duet("limits", "set", "sim", "--rpm", "2", env=env, cwd=tmp_path)
    assert old.returncode == 0, old.stderr
    shown = _duet("limits", "show", env=env, cwd=tmp_path)
    assert "sim:sim" in shown.stdout and "duet limits set" in shown.stdout, shown.stdout
    assert _duet("limits", "clear", env=env, cwd=tmp_path).returncode == 0
    shown = _duet("limits", "show", env=env, cwd=tmp_path)
    assert shown.stdout.startswith("no rate limits"), shown.stdout

    submitted = _duet("submit", config, "-i", tree, env=env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    batch = submitted.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", batch), submitted.stdout
    # The large binary is skipped and counted, not rejected; __pycache__ is not read.
    assert "skipped 1 file(s)" in submitted.stderr and "1 binary" in submitted.stderr
    assert f"queued {N_FILES} run(s)" in submitted.stderr

    # While it runs: duet ls, at 80 columns and piped, shows an id that works as a prefix,
    # and the batch's cost never falls.
    costs: list[float] = []

    def listed_done() -> bool:
        rows = [
            json.loads(ln)
            for ln in _duet("ls", "--json", env=env, cwd=tmp_path).stdout.splitlines()
        ]
        row = next(r for r in rows if r["batch_id"] == batch)
        costs.append(row["usd"])
        return row["done"] == row["total"]

    wait_for(listed_done, 50, "the batch to finish (duet ls)", interval=0)
    assert costs == sorted(costs) and costs[-1] > 0, costs
    table = _duet("ls", env=env, cwd=tmp_path).stdout
    line = next(ln for ln in table.splitlines() if batch[:8] in ln)
    prefix = re.search(r"\b([0-9a-f]{8,32})\b", line).group(1)  # type: ignore[union-attr]
    assert batch.startswith(prefix) and f"${costs[-1]:.4f}" in line, line
    assert "cost" in table  # the figure's label: the column's header

    watched = _duet("watch", prefix, env=env, cwd=tmp_path)
    assert watched.returncode in (0, 1), watched.stderr
    assert f"{N_FILES}/{N_FILES} done" in watched.stderr
    assert f"spent ${costs[-1]:.4f}" in watched.stderr
    assert "rate limit" not in watched.stderr  # the limit cleared above held nothing up

    out = tmp_path / "results.jsonl"
    assert _duet("results", prefix, "-o", out, env=env, cwd=tmp_path).returncode in (0, 1)
    records = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(records) == N_FILES
    assert not any("__pycache__" in r["id"] or r["id"].endswith((".pyc", ".bin")) for r in records)
    statuses = {r["status"] for r in records}
    assert "approved" in statuses and statuses - {"approved"}, statuses  # some fail review
    # The batch's figure is what its runs spent: not a cent lost or counted twice.
    assert sum(r["usage"]["usd"] for r in records) == pytest.approx(costs[-1], abs=1e-3)

    from duet.report.triage import final_issues, worst_first

    # The inputs to look at, each as its run finishes (here: all finished).
    not_approved = {r["run_id"] for r in records if r["status"] == "max_rounds_reached"}
    matched = _duet("results", prefix, "--status", "max_rounds_reached", env=env, cwd=tmp_path)
    assert {json.loads(ln)["run_id"] for ln in matched.stdout.splitlines()} == not_approved

    page = tmp_path / "report.html"
    reported = _duet("report", prefix, "-o", page, env=env, cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr  # written: a success, whatever the runs did
    worst = worst_first(records)
    shown_run = _check_report(page, tmp_path, [r["id"] for r in worst], final_issues(worst[0]))
    # The run id the report shows for the worst input is one `duet show` takes.
    shown = _duet("show", shown_run, env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert worst[0]["run_id"] in shown.stdout and worst[0]["id"] in shown.stdout
    # docs/walkthrough.md says what this test ran: each of its commands was run here.
    for section in SECTIONS:
        for command in doc_commands(WALKTHROUGH, section):
            assert command in RAN, (section, command, RAN)


def _check_report(page: Path, tmp: Path, worst: list[str], first_issues: list[str]) -> str:
    """The report, rendered by Chromium: inputs not approved worst first, the worst one's
    final issues in its block, and a screenshot that is a rendered page. Returns the run
    id (or prefix) the worst input's block shows."""
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"no {CHROMIUM}: install Debian's chromium to check the report in a browser")
    dumped = chromium(tmp, "--dump-dom", page.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = _Inputs()
    dom.feed(dumped.stdout)
    assert dom.ids == worst
    text = " ".join(dom.text[worst[0]])
    assert first_issues and all(issue in text for issue in first_issues), (first_issues, text)
    run = re.search(r"\brun\s+([0-9a-f]{8,32})\b", text)
    assert run, text
    shot = tmp / "report.png"
    done = chromium(tmp, f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000  # text, tables and colour: not a blank page
    return run.group(1)
