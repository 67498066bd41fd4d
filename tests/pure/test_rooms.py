"""``duet/`` is a house of rooms: each subpackage says what it holds, and no module repeats
its room's name as a prefix (``duet/report/report_html.py``) or stands flat beside the
rooms with a room's name as its prefix (``duet/cli_inspect.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

DUET = Path(__file__).resolve().parents[2] / "duet"
ROOMS = sorted(p.parent for p in DUET.glob("*/__init__.py"))
#: What the old flat folder used as room names in module prefixes.
OLD_PREFIXES = ("cli_", "fake_", "report_", "git_", "run_")


def test_the_rooms_are_there() -> None:
    names = {p.name for p in ROOMS}
    assert {"commands", "intake", "formats", "report", "standin", "embedded"} <= names


def test_each_room_says_what_it_holds_in_one_line() -> None:
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text()))
        assert doc, f"{room.relative_to(DUET.parent)}/__init__.py has no docstring"


def test_no_module_is_prefixed_by_its_rooms_name() -> None:
    bad = [
        str(path.relative_to(DUET.parent))
        for room in ROOMS
        for path in room.glob("*.py")
        if path.stem.startswith(room.name.rstrip("s") + "_") or path.stem.startswith(room.name)
    ]
    bad += [
        str(path.relative_to(DUET.parent))
        for path in DUET.glob("*.py")
        if path.stem.startswith(OLD_PREFIXES)
    ]
    assert not bad, f"modules named after a room instead of inside it: {bad}"
