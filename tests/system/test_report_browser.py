"""The HTML report in a real browser: headless Chromium renders it, shows the inputs not
approved worst first, and runs none of the markup that inputs and model output carry."""

from __future__ import annotations

import hashlib
import shutil
import struct
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from duet.intake.files import InputProblem
from duet.report.html import render_report
from duet.report.records import rejected_record
from duet.report.turns import tool_turns
from orchestration.state.turns import Turn
from tests.support import CHROMIUM, chromium

#: A script in an input id and an issue, and a handler in an output: run, each would mark
#: the page, and the dumped DOM would show it.
SCRIPT_ID = "<script>document.documentElement.setAttribute('data-pwned','id')</script>"
SCRIPT_ISSUE = "<script>document.documentElement.setAttribute('data-pwned','issue')</script>"
HANDLER_OUTPUT = "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','out')\">"
#: A tool's result and a model's tool arguments that try to close the round's fold and run
#: a script, a handler or a link.
TOOL_RESULT = (
    "</pre></details></details><script>document.documentElement.setAttribute('data-pwned',"
    "'tool')</script><a href=\"javascript:document.documentElement.setAttribute('data-pwned',"
    "'link')\">open</a>"
)
TOOL_ARGS = {"path": "<svg onload=\"document.documentElement.setAttribute('data-pwned','args')\">"}

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None,
    reason=f"no {CHROMIUM}: install Debian's chromium (apt-get install chromium) to run it",
)


def _code(ident: str) -> str:
    name = "".join(c for c in ident if c.isalnum())[:20]
    return f"def {name}(x):\n    # parse what the user sent\n    return eval(x)\n"


def _run(
    ident: str, status: str, score: float | None, issues: list[str], **extra: Any
) -> dict[str, Any]:
    fixed = _code(ident).replace("eval(x)", "ast.literal_eval(x)")
    return {
        "id": ident,
        "status": status,
        "final_score": score,
        "output": extra.pop("output", f"Fixed:\n```python\nimport ast\n{fixed}```\n"),
        "rounds": [
            {"round": 1, "score": score, "issues": ["an early issue, fixed later"]},
            {"round": 2, "score": score, "issues": issues},
        ],
        "n_rounds": 2,
        "issues": issues,
        "usage": {"input_tokens": 900, "output_tokens": 300, "calls": 5, "usd": 0.0123},
        "reason": extra.pop("reason", None),
        "error": extra.pop("error", None),
        "run_id": hashlib.sha256(ident.encode()).hexdigest()[:32],
        "batch_id": "b" * 32,
        "metadata": {},
        "duration_s": 4.5,
        "created_at": "2026-12-03T10:00:00.123456+00:00",
        "finished_at": "2026-12-03T10:04:07.654321+00:00",
        **extra,
    }


def _tool_turns() -> list[dict[str, Any]]:
    """Round 1's critic read a file whose text is markup; round 2's asked again, in vain."""
    call = {"id": "c1", "name": "read_file", "arguments": TOOL_ARGS}
    done = {"name": "read_file", "result": TOOL_RESULT, "ok": True, "seconds": 0.02}
    return tool_turns(
        {
            "r1.critique": [Turn(1, {"tool_calls": [call]}, {0: done})],
            "r2.critique": [Turn(1, {"tool_calls": [call]}, {0: {**done, "ok": False}})],
        }
    )


def _batch() -> tuple[list[dict[str, Any]], list[str], dict[str, str]]:
    """Records in input order, the ids of those not approved in the order a reviewer should
    see them (written out by hand), and each input's prompt."""
    records = [
        _run("approved-one", "approved", 0.95, []),
        _run(
            "mid-score",
            "max_rounds_reached",
            0.62,
            ["SQL built with an f-string on line 3"],
            tool_turns=_tool_turns(),
        ),
        _run(SCRIPT_ID, "max_rounds_reached", 0.41, [SCRIPT_ISSUE, "No input validation"]),
        rejected_record(
            InputProblem(
                "src", None, "prompt is 61,204 characters, over the limit of 50,000", "big.py"
            )
        ),
        _run("nearly", "max_rounds_reached", 0.88, ["Missing docstring on `load`"]),
        _run("keyless", "interrupted", None, [], reason="actor:round_0:missing_key"),
        _run(
            "worst-scored",
            "max_rounds_reached",
            0.12,
            ["SQL built with an f-string on line 9", "No input validation."],
        ),
        _run(
            "handler",
            "interrupted",
            0.41,
            ["Unsafe HTML"],
            output=HANDLER_OUTPUT,
            reason="budget:batch:usd",
        ),
        _run("approved-two", "approved", 0.93, []),
        _run("keyless-later", "interrupted", None, [], reason="critic:round_2:missing_key"),
    ]
    # No score first, then by last score, ties by reason (none first, then alphabetically).
    worst = [
        "keyless",
        "keyless-later",
        "big.py",
        "worst-scored",
        SCRIPT_ID,
        "handler",
        "mid-score",
        "nearly",
    ]
    prompts = {
        str(r["id"]): f"Review and fix:\n```python\n{_code(str(r['id']))}```" for r in records
    }
    return records, worst, prompts


class _Inputs(HTMLParser):
    """The input blocks of a page in order, and anything a script could have left."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.scripts = 0
        self.pwned: list[str] = []
        #: The rounds' folded tool calls: the input they are in, and whether open.
        self.rounds: list[tuple[str, bool]] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        got = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if "data-pwned" in got:
            self.pwned.append(str(got["data-pwned"]))
        if tag == "details" and "input" in (got.get("class") or "").split():
            self.ids.append(str(got.get("data-id")))
        if tag == "details" and "round" in (got.get("class") or "").split():
            self.rounds.append((self.ids[-1], "open" in got))
        if tag == "a":
            self.links.append(str(got.get("href")))


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    tmp = tmp_path_factory.mktemp("browser")
    records, worst, prompts = _batch()
    path = tmp / "report.html"
    path.write_text(render_report(records, title="Browser check", inputs=prompts), "utf-8")
    yield path, worst


def test_the_dom_has_every_input_not_approved_worst_first_and_ran_no_script(
    page: tuple[Path, list[str]], tmp_path: Path
) -> None:
    path, worst = page
    dumped = chromium(tmp_path, "--dump-dom", path.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = _Inputs()
    dom.feed(dumped.stdout)
    assert dom.ids == worst
    assert dom.scripts == 0 and dom.pwned == []
    # the tool calls' two rounds, folded, inside their input: the markup closed nothing
    assert dom.rounds == [("mid-score", False), ("mid-score", False)]
    assert not [h for h in dom.links if not h.startswith("#")], dom.links
    assert "read_file" in dumped.stdout and "&lt;/details&gt;&lt;script&gt;" in dumped.stdout
    assert "<title>Browser check</title>" in dumped.stdout


def test_the_screenshot_is_a_rendered_page(page: tuple[Path, list[str]], tmp_path: Path) -> None:
    path, _ = page
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>", "utf-8")
    sizes = {}
    for name, target in (("report", path), ("blank", blank)):
        shot = tmp_path / f"{name}.png"
        done = chromium(tmp_path, f"--screenshot={shot}", target.as_uri())
        assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
        assert _png_size(shot) == (1280, 2000)
        sizes[name] = shot.stat().st_size
    shutil.copy(tmp_path / "report.png", path.with_suffix(".png"))  # to look at by hand
    # Text, tables and colours compress far worse than a blank page of the same size.
    assert sizes["report"] > 10 * sizes["blank"], sizes
