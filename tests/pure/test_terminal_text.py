"""Untrusted text (ids, prompts, metadata, model output) printed by ``duet`` is shown, never
obeyed: no Rich markup, no terminal control sequences."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from duet.commands.support import clean, plain
from orchestration.logjson import JsonFormatter, json_line
from tests.reliability import MODEL_OUTPUT, Reliability, lost_of

_ACTED_ON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

HOSTILE = [
    "[/b]",
    "[link=https://evil.example]click[/link]",
    "[bold red]fake error[/]",
    "\x1b[2J\x1b]8;;https://evil.example\x07x\x1b]8;;\x07",
    "line\rOVERWRITE",
    "\u202egnp.exe",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_prints_as_itself_on_a_terminal(text: str) -> None:
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, color_system="truecolor", width=200)
    console.print(plain(text))
    shown = sink.getvalue()
    assert "\x1b]8;" not in shown, "no hyperlink escape reaches the terminal"
    assert "\x1b[2J" not in shown and "\r" not in shown and "\u202e" not in shown
    if text.startswith("["):
        assert text in shown, "markup is shown literally"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_property_clean_leaves_no_control_character(text: str) -> None:
    cleaned = clean(text)
    assert all(c in "\n\t" or (ord(c) >= 0x20 and not 0x7F <= ord(c) <= 0x9F) for c in cleaned)
    assert not any(0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 for c in cleaned)
    if cleaned == text:
        assert plain(text).plain == text


C1 = ["\x9b2J", "\x9d8;;https://evil.example\x07x", "\x90q\x9c", "\x85", "\u202e", "\x7f"]


def _text_log_line(message: str, *args: object) -> str:
    """What a worker's text log handler writes for one line with a traceback."""
    from workers.logs import use_terminal_safe_text

    sink = io.StringIO()
    logger = logging.getLogger("tests.terminal_text")
    logger.handlers[:] = [logging.StreamHandler(sink)]
    logger.propagate = False
    use_terminal_safe_text(logger)
    try:
        raise RuntimeError("vendor said " + " ".join(map(str, args)))
    except RuntimeError:
        logger.exception(message, *args)
    return sink.getvalue()


def test_c1_controls_are_escaped_in_terminal_text_and_json_lines(
    reliability: Reliability,
) -> None:
    values = [f"id {c} end" for c in C1]
    shown = [clean(v) for v in values] + [json_line({"id": v}) for v in values]
    record = logging.LogRecord("duet", logging.INFO, __file__, 1, "%s", (values,), None)
    shown.append(JsonFormatter().format(record))
    shown += [_text_log_line("run failed: %s", v) for v in values]
    raw = [s for s in shown if _ACTED_ON.search(s)]
    reliability.record(
        section=MODEL_OUTPUT,
        fault="C1 controls to terminal",
        load=f"{len(C1)} ids with 8-bit CSI, OSC, DCS/ST, NEL, a bidi override and DEL, "
        "through `clean`, `duet results` JSON lines, JSON logs and text logs (tracebacks too)",
        lost=lost_of(len(raw), len(shown), "printed texts kept a raw control"),
        before="`duet results` and JSON log lines printed C1 controls raw",
    )
    assert not raw
    assert [json.loads(json_line({"id": v}))["id"] for v in values] == values, "same value"
    assert "\\u009b2J" in json_line(values[0]) and "\\x9b2J" in clean(values[0])
    line = _text_log_line("run failed: %s", values[0])
    assert line.count("id \\x9b2J end") == 2 and "RuntimeError: vendor said" in line
    assert json_line("naïve ☃ 日本") == '"naïve ☃ 日本"', "other text stays readable"
    lone = json_line("a lone \ud800")
    assert lone.encode("utf-8") and json.loads(lone) == "a lone \ud800", "a UTF-8 file holds it"
