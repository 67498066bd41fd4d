"""How long reading a git range takes (``duet review --git``), and where the time goes.

    python -m bench.git_intake [--files 500] [--repeat 3]

Builds a repository in a temporary folder: ``--files`` Python files of about 90 lines,
committed on ``main``, then one line changed in each on ``feature``. Times, medians of
``--repeat``: the whole intake of ``main..feature`` as ``duet review`` reads it
(:class:`duet.intake.git.GitChanges`), and its parts: the two ``git diff`` runs (names, then
the patch with 10 lines of context), parsing the patch with ``unidiff``, and reading each
changed file at HEAD, one ``git show`` process per file as the intake does, against one
``git cat-file --batch`` process for them all.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from unidiff import PatchSet

from duet.intake.git import GitChanges
from duet.intake.gitproc import git


def make_repo(root: Path, files: int) -> list[str]:
    """A repository whose ``feature`` branch changes one line in each of ``files`` files."""
    run = lambda *a: subprocess.run(["git", "-C", str(root), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q", "-b", "main")
    run("config", "user.email", "bench@example.com")
    run("config", "user.name", "bench")
    body = "".join(f"# line {n}\n" for n in range(80))
    paths = [f"src/d{i % 20}/m{i}.py" for i in range(files)]
    for i, path in enumerate(paths):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(f"def f{i}(x):\n    return x + {i}\n\n{body}")
    run("add", "-A")
    run("commit", "-qm", "base")
    run("checkout", "-qb", "feature")
    for i, path in enumerate(paths):
        text = (root / path).read_text().replace(f"return x + {i}\n", f"return x * {i}\n")
        (root / path).write_text(text)
    run("commit", "-qam", "change")
    return paths


def _timed(repeat: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cat_file_batch(repo: Path, paths: list[str]) -> int:
    request = "".join(f"feature:{p}\n" for p in paths).encode()
    done = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "--batch"],
        input=request,
        capture_output=True,
        check=True,
    )
    return len(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="duet-bench-git-") as tmp:
        repo = Path(tmp)
        paths = make_repo(repo, args.files)
        diff = ["diff", "--no-ext-diff", "--no-textconv", "--no-color", "-M"]
        patch = git(repo, *diff, "-U10", "main", "feature").decode()
        figures = {
            "whole intake (GitChanges)": _timed(
                args.repeat, lambda: sum(1 for _ in GitChanges(repo, "main..feature"))
            ),
            "git diff --name-status": _timed(
                args.repeat, lambda: git(repo, *diff, "--name-status", "-z", "main", "feature")
            ),
            "git diff -U10": _timed(
                args.repeat, lambda: git(repo, *diff, "-U10", "main", "feature")
            ),
            "unidiff parse of the patch": _timed(args.repeat, lambda: PatchSet(patch)),
            "read the files: git show each": _timed(
                args.repeat, lambda: [git(repo, "show", f"feature:{p}") for p in paths]
            ),
            "read the files: one git cat-file --batch": _timed(
                args.repeat, lambda: _cat_file_batch(repo, paths)
            ),
        }
    print(f"{args.files} changed files, medians of {args.repeat}:")
    print("| step | total ms | ms per changed file |")
    print("|---|---|---|")
    for step, seconds in figures.items():
        print(f"| {step} | {seconds * 1000:.0f} | {seconds * 1000 / args.files:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
