"""Code review from the terminal: ``--git`` inputs for ``duet run`` / ``duet review``, and
``duet results -f sarif|rdjson|github|markdown`` / ``--patch`` for CI."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
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
        help="Exit 1 when a finding is at least this severe (error, warning, never), with "
        "any output: -f, --patch or records.",
    ),
]
CategoryOpt = Annotated[
    str | None,
    typer.Option(
        "--category",
        show_default=False,
        help="-f sarif: the code scanning category (automationDetails.id). Default: the "
        "config's [loop] name, else 'duet'; never the model, so alerts outlive a model change.",
    ),
]
LinkOpt = Annotated[
    str | None,
    typer.Option(
        "--link",
        metavar="URL",
        show_default=False,
        help="-f markdown: where the findings that do not fit the comment are listed "
        "(the code scanning page, the run's report).",
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
    #: ``--exclude`` globs, added to the config's ``[inputs] exclude``.
    exclude: tuple[str, ...] = ()
    include_secrets: bool = False
    #: ``--since SHA``: only what changed after the last reviewed commit.
    since: str | None = None
    #: ``--with-sarif``: other tools' findings, handed to the critic with their files.
    with_sarif: tuple[Path, ...] = ()

    def reader(self, cfg: ReviewConfig, intake: Intake) -> GitChanges:
        from duet.commands.intake import prompt_limit
        from duet.intake.context import analyser_findings
        from duet.intake.git import GitChanges
        from duet.intake.skips import SkipRules

        assert self.spec is not None
        analysed: dict[str, list[str]] = {}
        for log in self.with_sarif:
            for path, lines in analyser_findings(log).items():
                analysed.setdefault(path, []).extend(lines)
        changes = GitChanges(
            self.repo,
            self.spec,
            unit=self.unit,
            context=self.context,
            max_prompt_chars=prompt_limit(cfg),
            on_problem=intake.on_problem,
            skips=SkipRules(
                exclude=(*cfg.inputs.exclude, *self.exclude), include_secrets=self.include_secrets
            ),
            since=self.since,
            analysed=analysed,
        )
        for line in changes.notes:
            note(line)
        return changes


def input_source(input: Path | None, git: GitSource | None) -> Path:
    """The path inputs are named after: ``--input``, or ``review`` for a ``--git`` range."""
    has_git = git is not None and git.spec
    if input is not None and has_git:
        raise ConfigError("give --input or --git, not both")
    if input is None and not has_git:
        raise ConfigError("no inputs: give --input FILE|DIR or --git BASE..HEAD")
    return input if input is not None else Path("review")


#: Suffixes of results files: an argument ending so is a file, never a batch id.
RESULTS_SUFFIXES = (".jsonl", ".json", ".csv", ".ndjson")


def check_results_file(batch: str) -> None:
    """A results file named that is not there: "no such file", not a cluster's error (a
    batch id is hex; a name with a folder or a results suffix is a file)."""
    path = Path(batch)
    if path.is_file():
        return
    if path.exists():
        raise ConfigError(f"{batch}: not a file")
    if "/" in batch or "\\" in batch or path.suffix.lower() in RESULTS_SUFFIXES:
        raise ConfigError(f"{batch}: no such file")


def records_of(batch: str, timeout: float | None) -> list[dict[str, Any]]:
    """The records of a results file or a batch id, in input order."""
    from duet.commands.batch import batch_handle, batch_records
    from duet.commands.results import read_records
    from duet.report.records import by_index

    check_results_file(batch)
    if Path(batch).is_file():
        return list(by_index(read_records(Path(batch))))
    connect()
    return list(batch_records(batch_handle(batch), timeout))


def fails(records: list[dict[str, Any]], fail_on: str, *, everything: bool) -> bool:
    """Whether a finding of ``records`` is at least ``fail_on`` (``--fail-on``)."""
    from duet.formats.findings import at_least, findings

    if fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    if fail_on == "never":
        return False
    return any(at_least(f.severity, fail_on) for f in findings(records, everything=everything))


def category_of(records: list[dict[str, Any]]) -> str:
    """The config's ``[loop] name`` the records were run with, else ``duet``."""
    from duet.formats.sarif import DEFAULT_CATEGORY

    for record in records:
        loop = record.get("loop")
        if isinstance(loop, dict) and isinstance(loop.get("name"), str) and loop["name"]:
            return str(loop["name"])
    return DEFAULT_CATEGORY


def reviewed_reader(root: Path) -> Callable[[str], str | None]:
    """Read a reviewed file by its repository path under ``root``, following no symlink
    on the way (OSError ``ELOOP``): a link is never read through its target."""
    from duet.formats.outputs import read_inside

    def read(path: str) -> str | None:
        try:
            return read_inside(root, path)
        except FileNotFoundError:
            return None

    return read


def _lenient(read: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """``read``, with a file it cannot read treated as absent (for checking lines)."""

    def lenient(path: str) -> str | None:
        try:
            return read(path)
        except (OSError, ValueError):
            return None

    return lenient


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
    category: str | None = None,
    link: str | None = None,
) -> None:
    """``duet results BATCH -f FORMAT`` / ``--patch``: write, then exit by ``--fail-on``."""
    from duet.formats.findings import at_least, critics, findings, in_files, simulated
    from duet.formats.patch import build_patch
    from duet.formats.sarif import sarif_log
    from duet.formats.text import github_annotations, markdown_summary, rdjson

    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if fail_on not in FAIL_ON:
        raise ConfigError(f"--fail-on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    if patch and fmt is not None:
        raise ConfigError("give --patch or --format, not both")
    records = records_of(batch, timeout)
    read = reviewed_reader(root)
    found = list(in_files(findings(records, everything=everything), _lenient(read)))
    models = critics(records)
    sim = any(simulated(m) for m in models)
    if patch:
        made = build_patch(records, read)
        text = made.text
        for why, n in sorted(made.left_out.items()):
            note(f"left out of the patch: {n} approved input(s): {why}")
        if made.not_approved:
            note(f"left out of the patch: {made.not_approved} input(s) not approved")
        note(f"patch: {made.files} file(s)")
    elif fmt == "sarif":
        log = sarif_log(
            found,
            version=_version(),
            category=category or category_of(records),
            critics=models,
            simulated=sim,
            read=_lenient(read),
        )
        text = json.dumps(log, indent=1) + "\n"
    elif fmt == "rdjson":
        text = json.dumps(rdjson(found), indent=2) + "\n"
    elif fmt == "github":
        text = github_annotations(found)
    else:
        text = markdown_summary(records, found, simulated=sim, link=link)
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
