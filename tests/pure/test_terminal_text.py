"""Untrusted text (ids, prompts, metadata, model output) printed by ``duet`` is shown, never
obeyed: no Rich markup, no terminal control sequences."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from duet.cli_support import clean, plain

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
