"""What a reviewer is told besides the change: the repository's own review rules for a
path, and a static analyser's findings on the file.

- ``.duet/review.toml`` (read from the base commit, so a change cannot rewrite the rules it
  is reviewed by)::

      [[paths]]
      globs = ["src/db/**", "*.sql"]
      instructions = "Every query is parameterised; no string formatting of SQL."

- ``--with-sarif ruff.sarif``: each result of another tool's SARIF log, by the file it is
  on, handed to the critic as context for that file only.

Pure: the caller reads the files.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duet.intake.skips import matches
from orchestration.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Where a repository keeps its review rules.
RULES_FILE = ".duet/review.toml"
#: Findings of an analyser shown for one file, at most (the rest are counted).
MAX_FINDINGS_PER_FILE = 50


@dataclass(frozen=True)
class PathRules:
    """A repository's review instructions, each for the paths its globs match."""

    rules: tuple[tuple[tuple[str, ...], str], ...] = ()

    @classmethod
    def parse(cls, text: str, source: str) -> PathRules:
        """Rules from ``.duet/review.toml`` text (ConfigError naming ``source`` when bad)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: not TOML: {exc}") from None
        entries = data.get("paths", [])
        if not isinstance(entries, list):
            raise ConfigError(f"{source}: [[paths]] must be a list of tables")
        rules = []
        for n, entry in enumerate(entries, 1):
            globs = entry.get("globs") if isinstance(entry, dict) else None
            said = entry.get("instructions") if isinstance(entry, dict) else None
            if not (
                isinstance(globs, list)
                and globs
                and all(isinstance(g, str) and g for g in globs)
                and isinstance(said, str)
                and said.strip()
            ):
                raise ConfigError(
                    f"{source}: paths entry {n}: needs globs (a list of strings) and "
                    "instructions (text)"
                )
            rules.append((tuple(globs), said.strip()))
        return cls(tuple(rules))

    def for_path(self, path: str) -> list[str]:
        """The instructions whose globs match ``path``, in the file's order."""
        return [said for globs, said in self.rules if matches(path, globs)]


def analyser_findings(path: Path) -> dict[str, list[str]]:
    """A SARIF log's results as lines by the file they are on (``uri`` as written,
    ``file://`` and ``./`` taken off): ``line 5: E501 (error) Line too long``."""
    try:
        log = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--with-sarif {path}: cannot read a SARIF log: {exc}") from None
    if not isinstance(log, dict) or not isinstance(log.get("runs"), list):
        raise ConfigError(f"--with-sarif {path}: not a SARIF log (no runs)")
    found: dict[str, list[str]] = defaultdict(list)
    for run in log["runs"]:
        tool = _tool(run)
        for result in run.get("results") or [] if isinstance(run, dict) else []:
            if not isinstance(result, dict):
                continue
            where = _where(result)
            if where is None:
                continue
            uri, line = where
            rule = result.get("ruleId") or "?"
            level = result.get("level") or "warning"
            text = " ".join(str((result.get("message") or {}).get("text") or "").split())
            at = f"line {line}: " if line else ""
            found[uri].append(f"{at}{tool} {rule} ({level}): {text[:300]}")
    return dict(found)


def _tool(run: Any) -> str:
    try:
        return str(run["tool"]["driver"]["name"])
    except (KeyError, TypeError):
        return "analyser"


def _where(result: dict[str, Any]) -> tuple[str, int | None] | None:
    try:
        physical = result["locations"][0]["physicalLocation"]
        uri = str(physical["artifactLocation"]["uri"])
    except (KeyError, IndexError, TypeError):
        return None
    for prefix in ("file://", "./"):
        uri = uri.removeprefix(prefix)
    line = (physical.get("region") or {}).get("startLine")
    return uri, line if isinstance(line, int) else None


def context_sections(instructions: list[str], analysed: list[str]) -> str:
    """The extra parts of a file's prompt: its rules, then an analyser's findings."""
    parts = []
    if instructions:
        parts += ["## The repository's review rules for this file", ""]
        parts += [f"- {said}" for said in instructions]
        parts.append("")
    if analysed:
        shown = analysed[:MAX_FINDINGS_PER_FILE]
        parts += [
            "## A static analyser's findings on this file (context; confirm before reporting)",
            "",
        ]
        parts += [f"- {line}" for line in shown]
        if len(analysed) > len(shown):
            parts.append(f"- ... and {len(analysed) - len(shown)} more")
        parts.append("")
    return "\n".join(parts)
