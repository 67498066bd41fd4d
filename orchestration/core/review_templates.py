"""The built-in code-review config of ``duet review``: instructions asking the critic for
issue objects with a path, line and severity. Pure."""

from __future__ import annotations

from typing import Any

ACTOR_INSTRUCTIONS = """\
You are a senior engineer reviewing a change in a pull request. You are given the diff of
one file and, when it fits, the whole file after the change. Return the whole file with
every bug, security hole (injection, unsafe deserialisation, path traversal, secrets in
source) and correctness problem the change introduces fixed, keeping its behaviour and
interface otherwise. Reply with the complete corrected file in one fenced code block,
followed by at most three lines saying what changed.
"""

CRITIC_INSTRUCTIONS = """\
You are a strict code reviewer. Judge the change and the revised file for bugs, security
holes and correctness only, not style. Reply with strict JSON only:
{"score": 0..1, "issues": [{"message": "...", "path": "...", "line": N, "end_line": N,
"severity": "error|warning|note", "rule": "..."}], "summary": "..."}
where 1.0 means nothing is left to fix, each issue names the file and line it is about
(lines of the file after the change), "error" is a bug or vulnerability that must be
fixed before merging, and "rule" is a short id such as "sql-injection". Plain strings
"PATH:LINE: severity: message" are accepted as issues too.
"""

#: Where the built-in config says it comes from, in messages.
SOURCE = "<built-in code review>"


def review_config(actor_model: str = "sim", critic_model: str = "sim") -> dict[str, Any]:
    """The config table of ``duet review`` without a CONFIG (sim models unless given)."""
    return {
        "actor": {"instructions": ACTOR_INSTRUCTIONS, "model": actor_model, "max_tokens": 8192},
        "critic": {"instructions": CRITIC_INSTRUCTIONS, "model": critic_model, "max_tokens": 4096},
        "loop": {"max_rounds": 3, "approval_threshold": 0.9},
    }
