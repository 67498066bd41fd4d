"""Findings are hostile in every output format: a PR comment shows no image and no link and
keeps each path in its code span; ``-f github`` / ``-f markdown`` print no control
character a terminal acts on; a SARIF ``uri`` is a relative reference under the root."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import jsonschema
from markdown_it import MarkdownIt

from duet.formats.findings import Finding, findings
from duet.formats.sarif import sarif_log
from duet.formats.text import github_annotations, markdown_summary
from tests.reliability import FILES, Reliability, lost_of

SCHEMA = json.loads((Path(__file__).parents[1] / "data/sarif-schema-2.1.0.json").read_text())
#: What a terminal acts on: C0 but newline, DEL, C1, and the bidi overrides.
_ACTED_ON = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _finding(message: str, path: str | None = "app.py", line: int | None = 3) -> Finding:
    return Finding("in-1", message, path, line, None, "error", "duet/review", "sim")


MARKDOWN_TRAPS = [
    "![x](https://evil.example/pixel.png?u=1)",
    "[click me](https://evil.example/login)",
    "![ref][p]\n\n[p]: https://evil.example/p.png",
    "<img src=https://evil.example/x>",
    "<https://evil.example/auto>",
    "see https://evil.example/bare and www.evil.example",
    "`` ` `` escape ``` then ![y](http://evil.example/z)",
    "&#33;[x](https://evil.example/entity)",
    "\\![x](https://evil.example/escaped-bang)",
]
PATH_TRAPS = [
    "a`b.py",
    "x`` ![p](https://evil.example/p) ``.py",
    "`![p](https://evil.example/p)`",
    "trail`",
]


def _html(markdown: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(markdown)


def test_a_pr_comment_has_no_image_no_link_and_paths_stay_in_their_spans(
    reliability: Reliability,
) -> None:
    hostile = [_finding(m) for m in MARKDOWN_TRAPS] + [_finding("m", p) for p in PATH_TRAPS]
    text = markdown_summary([], hostile)
    html = _html(text)
    rows = [r for r in text.splitlines() if r.startswith("| error |")]
    broken = [r for r in rows if any(t in _html(r) for t in ("<img", "<a ", "href="))]
    # Outside code spans no text is left that a renderer would make a link of.
    messages = [r for r in rows if not r.endswith("| m |")]
    broken += [r for r in messages if re.search(r"://|www\.", r)]
    # Each path renders as exactly one code span holding the whole path.
    spans = re.findall(r"<code>(.*?)</code>", html, re.S)
    lost_paths = [p for p in PATH_TRAPS if f"{p}:3".replace("&", "&amp;") not in spans]
    reliability.record(
        section=FILES,
        fault="PR comment: a finding `![x](https://evil/...)`, links, raw HTML, autolinks; "
        "a backtick in a critic-given path",
        load=f"{len(MARKDOWN_TRAPS)} hostile messages and {len(PATH_TRAPS)} hostile paths, "
        "rendered as CommonMark with tables",
        lost=lost_of(
            len(broken) + len(lost_paths),
            len(hostile),
            "rows rendered an image, a link or a URL, or let a path out of its code span",
        ),
        before="the comment rendered a tracking image; a backtick broke out of the code span",
    )
    assert not broken and "<img" not in html and "<a " not in html
    assert not lost_paths, spans
    assert len(rows) == len(hostile), "one table row per finding"
    assert "evil.example" in text, "the text itself is kept, as text"


TERMINAL_TRAPS = [
    "\x1b]52;c;ZWNobyBwd25lZA==\x07",  # OSC 52: write the clipboard
    "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",  # OSC 8 hyperlink
    "\x9b2J\x9b31m",  # C1 CSI
    "\u202egnp.exe",  # RLO
    "\x9d8;;https://evil.example\x07x",  # C1 OSC
    "bell\x07 del\x7f nul\x00 bs\x08",
]


def test_github_and_markdown_output_print_no_terminal_control(reliability: Reliability) -> None:
    hostile = [_finding(m, path=f"p{m}.py") for m in TERMINAL_TRAPS]
    shown = [github_annotations([f]) for f in hostile] + [
        markdown_summary([{"status": "max_rounds\x1b[2J"}], [f]) for f in hostile
    ]
    raw = [s for s in shown if _ACTED_ON.search(s.replace("\n", ""))]
    reliability.record(
        section=FILES,
        fault="`-f github` / `-f markdown` on a terminal: OSC 52, OSC 8, C1 CSI, RLO, BEL, DEL",
        load=f"{len(TERMINAL_TRAPS)} messages and paths, each as an annotation and a comment",
        lost=lost_of(len(raw), len(shown), "outputs kept a raw control"),
        before="OSC 52 (clipboard), OSC 8, C1 CSI and RLO passed raw",
    )
    assert not raw
    assert "\\x1b]52;c;" in github_annotations(hostile[:1]), "shown, as a visible escape"
    assert "\\u202egnp.exe" in markdown_summary([], hostile[3:4])


URI_TRAPS = {
    "../../../../etc/passwd": None,
    "/etc/shadow": None,
    "file:///etc/passwd": None,
    "src/../../x.py": None,
    "C:/Windows/win.ini": None,
    "C:\\Windows\\win.ini": None,
    "src\\..\\..\\x.py": None,
    "//evil.example/share/x.py": None,
    "https://evil.example/x.py": None,
    "./a.py": None,
    "a//b.py": None,
    "nul\x00.py": None,
    "spaced name.py": "spaced%20name.py",
    "new\nline.py": "new%0Aline.py",
    "colon:x.py": "colon%3Ax.py",
    "dir/q#frag?.py": "dir/q%23frag%3F.py",
    "100%.py": "100%25.py",
    "ünï.py": "%C3%BCn%C3%AF.py",
    "src/ok.py": "src/ok.py",
}


def test_sarif_uris_are_relative_references_under_the_root(reliability: Reliability) -> None:
    records = [
        {
            "id": "r",
            "status": "max_rounds",
            "models": {"critic": "sim"},
            "findings": [{"message": f"m{n}", "path": p, "line": 1}],
        }
        for n, p in enumerate(URI_TRAPS)
    ]
    log = sarif_log(findings(records))
    results = log["runs"][0]["results"]
    got = {}
    by_message = {r["message"]["text"]: r for r in results}
    for n, path in enumerate(URI_TRAPS):
        # No place in the repository: left out of the log (GitHub refuses a result with no
        # location) and counted.
        result = by_message.get(f"m{n}")
        locations = result["locations"] if result else []
        got[path] = (
            locations[0]["physicalLocation"]["artifactLocation"]["uri"] if locations else None
        )
    unplaced = sum(u is None for u in URI_TRAPS.values())
    assert log["runs"][0]["tool"]["driver"]["properties"]["unlocatedResults"] == unplaced
    wrong = {p: u for p, u in got.items() if u != URI_TRAPS[p]}
    # Whatever is written resolves under the root and back to the reviewed path.
    for path, uri in got.items():
        if uri is None:
            continue
        parts = urlsplit(uri)
        assert not parts.scheme and not parts.netloc and not uri.startswith("/"), uri
        assert unquote(parts.path) == path and not parts.query and not parts.fragment
    reliability.record(
        section=FILES,
        fault="SARIF locations: `../../../../etc/passwd`, `/etc/shadow`, `file:///...`, "
        "a drive, a UNC path, unencoded spaces, newlines, `#` and `?`",
        load=f"{len(URI_TRAPS)} finding paths (7 good ones among them)",
        lost=lost_of(len(wrong), len(URI_TRAPS), "paths written other than encoded or dropped"),
        before="every path was written verbatim as the uri",
    )
    assert not wrong
    jsonschema.validate(log, SCHEMA)
    assert "m0" not in by_message  # counted in unlocatedResults; the comment still shows it
