"""Code review from the terminal: ``--git`` inputs for ``duet run`` / ``duet review``, and
``duet results -f sarif|rdjson|github|markdown`` / ``--patch`` for CI."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from duet.commands.support import connect, note
from orchestration.core.errors import ConfigError

if TYPE_CHECKING:
    from duet.commands.results import Intake
    from duet.config import ReviewConfig
    from duet.intake.git import GitChanges

FORMATS = ("sarif", "rdjson", "github", "markdown")
FAIL_ON = ("error", "warning", "never")

GitOpt = Annotated[
    str | None,
    typer.Option(
        "--git",
        metavar="BASE..HEAD",
        show_default=False,
        help="Review the files changed between two commits (BASE...HEAD: from their merge "
        "base) instead of --input: one input per changed file (or hunk).",
    ),
]
RepoOpt = Annotated[
    Path, typer.Option("--repo", file_okay=False, help="The git repository of --git.")
]
UnitOpt = Annotated[
    str, typer.Option("--unit", help="--git: one input per changed 'file' or per 'hunk'.")
]
ContextOpt = Annotated[
    int, typer.Option("--context", min=0, help="--git: lines of context around each change.")
]
FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        "-f",
        show_default=False,
        help="Write the findings as sarif (GitHub code scanning), rdjson (reviewdog), "
        "github (workflow annotations) or markdown (a PR comment).",
    ),
]
AllOpt = Annotated[
    bool,
    typer.Option("--all", help="-f: every round's issues of every input, approved ones too."),
]
FailOnOpt = Annotated[
    str,
    typer.Option(
        "--fail-on",
        help="-f: exit 1 when a finding is at least this severe (error, warning, never).",
    ),
]
PatchOpt = Annotated[
    bool,
    typer.Option("--patch", help="Write the approved revisions as a unified diff (for git apply)."),
]
RootOpt = Annotated[
    Path,
    typer.Option(
        "--root",
        file_okay=False,
        help="Where the reviewed files are (their ids' base): --patch diffs against them, "
        "-f checks findings' lines against them.",
    ),
]


@dataclass(frozen=True)
class GitSource:
    """The ``--git`` options of ``duet run`` / ``duet review``."""

    spec: str | None
    repo: Path = Path(".")
    unit: str = "file"
    context: int = 10

    def reader(self, cfg: ReviewConfig, intake: Intake) -> GitChanges:
        from duet.commands.intake import prompt_limit
        from duet.intake.git import GitChanges

        assert self.spec is not None
        return GitChanges(
            self.repo,
            self.spec,
            unit=self.unit,
            context=self.context,
            max_prompt_chars=prompt_limit(cfg),
            on_problem=intake.on_problem,
        )


def input_source(input: Path | None, git: GitSource | None) -> Path:
    """The path inputs are named after: ``--input``, or ``review`` for a ``--git`` range."""
    has_git = git is not None and git.spec
    if input is not None and has_git:
        raise ConfigError("give --input or --git, not both")
    if input is None and not has_git:
        raise ConfigError("no inputs: give --input FILE|DIR or --git BASE..HEAD")
    return input if input is not None else Path("review")


def _records(batch: str, timeout: float | None) -> list[dict[str, Any]]:
    from duet.commands.batch import batch_handle, batch_records
    from duet.commands.results import read_records
    from duet.report.records import by_index

    if Path(batch).is_file():
        return list(by_index(read_records(Path(batch))))
    connect()
    return list(batch_records(batch_handle(batch), timeout))


def _reader(root: Path) -> Any:
    def read(path: str) -> str | None:
        file = (root / path).resolve()
        if not file.is_relative_to(root.resolve()) or not file.is_file():
            return None
        return file.read_text(encoding="utf-8", errors="surrogateescape")

    return read


def write_findings(
    batch: str,
    fmt: str | None,
    output: Path | None,
    *,
    everything: bool,
    fail_on: str,
    patch: bool,
    root: Path,
    timeout: float | None,
) -> None:
    """``duet results BATCH -f FORMAT`` / ``--patch``: write, then exit by ``--fail-on``."""
    from duet.formats.findings import at_least, findings, in_files
    from duet.formats.patch import build_patch
    from duet.formats.sarif import sarif_log
    from duet.formats.text import github_annotations, markdown_summary, rdjson

    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    if patch and fmt is not None:
        raise ConfigError("give --patch or --format, not both")
    records = _records(batch, timeout)
    found = list(in_files(findings(records, everything=everything), _reader(root)))
    if patch:
        made = build_patch(records, _reader(root))
        text = made.text
        for why, n in sorted(made.left_out.items()):
            note(f"left out of the patch: {n} approved input(s): {why}")
        if made.not_approved:
            note(f"left out of the patch: {made.not_approved} input(s) not approved")
        note(f"patch: {made.files} file(s)")
    elif fmt == "sarif":
        text = json.dumps(sarif_log(found, version=_version()), indent=2) + "\n"
    elif fmt == "rdjson":
        text = json.dumps(rdjson(found), indent=2) + "\n"
    elif fmt == "github":
        text = github_annotations(found)
    else:
        text = markdown_summary(records, found)
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        output.write_text(text, encoding="utf-8")
    if fail_on != "never" and any(at_least(f.severity, fail_on) for f in found):
        raise typer.Exit(1)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from duet import DISTRIBUTION

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0"
