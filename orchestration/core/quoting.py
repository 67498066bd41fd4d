"""The per-run boundary around the output a critic reviews, and reading quotes out. Pure.

The critique prompt puts the output under review between two marker lines that hold a
random token drawn once per run (``<<<DUET-OUTPUT-{token}>>>`` ...
``<<<END-DUET-OUTPUT-{token}>>>``). The reviewed text cannot close the fence early: it
cannot know the token, and any marker-like text in it is defanged. A critic that quotes
between the same markers is quoting, so :func:`unquoted` drops those parts of its reply
before the verdict is looked for.
"""

from __future__ import annotations

import re

#: Random bytes in a run's token (written as twice as many hex digits).
TOKEN_BYTES = 8
#: What stands in a critic's reply where it quoted between the markers.
QUOTED = "[quoted output]"

# Anything that starts like a marker, whatever its token: "<<<" loses a character.
_MARKER_LIKE = re.compile(r"<<<(?=(?:END-)?DUET-OUTPUT-)", re.IGNORECASE)


def opening(token: str) -> str:
    """The line that opens the output under review."""
    return f"<<<DUET-OUTPUT-{token}>>>"


def closing(token: str) -> str:
    """The line that closes the output under review."""
    return f"<<<END-DUET-OUTPUT-{token}>>>"


def defang(text: str) -> str:
    """``text`` with every marker-like string broken (``<<<`` becomes ``<< <``), so text
    shown inside the boundary cannot end it or open another."""
    return _MARKER_LIKE.sub("<< <", text)


def unquoted(reply: str, token: str | None) -> str:
    """``reply`` with every part between the run's markers replaced by :data:`QUOTED`.

    A closing marker with no opening one is dropped; an opening one never closed quotes
    the rest of the reply. With no token (a custom flow, a run without one) the reply is
    returned as it is.
    """
    if not token:
        return reply
    start, end = opening(token), closing(token)
    parts: list[str] = []
    pos = 0
    while True:
        at = reply.find(start, pos)
        if at < 0:
            parts.append(reply[pos:])
            break
        parts.append(reply[pos:at])
        # Spaces, not line breaks: a quote inside a JSON string leaves the string valid.
        parts.append(f" {QUOTED} ")
        stop = reply.find(end, at + len(start))
        if stop < 0:
            pos = len(reply)
            break
        pos = stop + len(end)
    return "".join(parts).replace(end, "")
