"""The code-review toolset: read, list and grep the reviewed tree; git log, blame and show.

Every tool reads the repository at the reviewed commit and nothing else: file tools the
tree :func:`~workers.tools.workspace.checkout` made (``ToolContext.root``), paths held
inside it (:mod:`workers.tools.paths`); git tools the object store that tree came from,
at the reviewed commit or one of its ancestors only. Results are capped in size; a
refusal or a failure is a :class:`ToolError` whose message is the result the model sees.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from workers.tools import git as gitcli
from workers.tools import process
from workers.tools.context import ToolContext, reviewed_tree
from workers.tools.errors import ToolError
from workers.tools.paths import confine, relative, shown
from workers.tools.registry import tool
from workers.tools.workspace import origin

#: The most characters one tool result holds; past it the result says what was cut.
MAX_RESULT_CHARS = 40_000
#: The largest file read_file opens, in bytes.
MAX_FILE_BYTES = 4 << 20
#: The most lines one read_file or git_blame call returns.
MAX_LINES = 500
#: The most paths list_files returns.
MAX_FILES = 500
#: The most matching lines grep returns, and the longest line it shows.
MAX_MATCHES = 300
MAX_MATCH_CHARS = 400
#: The longest grep pattern, and the seconds a grep may run.
MAX_PATTERN_CHARS = 500
GREP_TIMEOUT_S = 10.0
#: The most commits git_log lists.
MAX_COMMITS = 50
#: A revision git_show takes: HEAD (the reviewed commit) or a commit id, then ~N / ^N steps.
REVISION = re.compile(r"^(?:HEAD|[0-9a-fA-F]{4,64})(?:[~^][0-9]{0,4})*$")


def _capped(text: str, hint: str = "narrow the request") -> str:
    if len(text) <= MAX_RESULT_CHARS:
        return text
    return (
        text[:MAX_RESULT_CHARS]
        + f"\n[... {len(text) - MAX_RESULT_CHARS} more characters cut: {hint}]"
    )


def _binary(data: bytes) -> bool:
    return b"\0" in data[:8192]


@tool(pure=True, timeout_s=10.0, reads=reviewed_tree)
def read_file(ctx: ToolContext, path: str, start_line: int = 1, end_line: int | None = None) -> str:
    """Read lines of a file in the repository, numbered.

    Args:
        path: the file, relative to the top of the repository.
        start_line: the first line to read (1 is the first line of the file).
        end_line: the last line to read (default: up to 500 lines from start_line).
    """
    target = confine(ctx.root, path, what="read_file")
    assert ctx.root is not None
    if not target.is_file():
        raise ToolError(f"read_file: {path!r} is not a file in the repository")
    if target.stat().st_size > MAX_FILE_BYTES:
        raise ToolError(f"read_file: {path!r} is larger than {MAX_FILE_BYTES >> 20} MiB; grep it")
    data = target.read_bytes()
    if _binary(data):
        raise ToolError(f"read_file: {path!r} is a binary file")
    lines = data.decode("utf-8", "replace").splitlines()
    first = max(1, start_line)
    last = min(len(lines), end_line if end_line is not None else first + MAX_LINES - 1)
    last = min(last, first + MAX_LINES - 1)
    if first > max(len(lines), 1):
        raise ToolError(
            f"read_file: {path!r} has {len(lines)} lines; start_line {first} is past its end"
        )
    width = len(str(last))
    body = "\n".join(f"{n:>{width}}  {lines[n - 1]}" for n in range(first, last + 1))
    head = f"{shown(ctx.root, target)} (lines {first}-{last} of {len(lines)})"
    return _capped(f"{head}\n{body}", "ask for fewer lines")


@tool(pure=True, timeout_s=10.0, reads=reviewed_tree)
def list_files(ctx: ToolContext, path: str = ".", pattern: str = "*") -> str:
    """List the files under a folder of the repository, one path per line.

    Args:
        path: the folder to list, relative to the top of the repository ("." for all).
        pattern: a glob the file name or its path must match, such as "*.py" or "src/*/test_*".
    """
    target = confine(ctx.root, path, what="list_files")
    assert ctx.root is not None
    top = ctx.root.resolve()
    if target.is_file():
        return shown(top, target)
    if not target.is_dir():
        raise ToolError(f"list_files: {path!r} is not a folder in the repository")
    found: list[str] = []
    total = 0
    for folder, dirs, files in os.walk(target):
        dirs.sort()
        # os.walk lists a symlink to a folder among dirs but does not enter it.
        names = sorted(files + [d for d in dirs if os.path.islink(os.path.join(folder, d))])
        for name in names:
            rel = Path(folder, name).relative_to(top).as_posix()
            if fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(rel, pattern):
                total += 1
                if len(found) < MAX_FILES:
                    found.append(rel)
    if not found:
        return f"no files match {pattern!r} under {shown(top, target) or '.'}"
    more = (
        f"\n[... {total - len(found)} more: narrow the path or pattern]"
        if total > len(found)
        else ""
    )
    return _capped("\n".join(found) + more)


@tool(pure=True, timeout_s=GREP_TIMEOUT_S + 5, reads=reviewed_tree)
def grep(ctx: ToolContext, pattern: str, path: str = ".", ignore_case: bool = False) -> str:
    """Search the repository's text files for a regular expression (POSIX extended).

    Args:
        pattern: the regular expression, such as "def add\\(" or "TODO|FIXME".
        path: the folder or file to search, relative to the top of the repository.
        ignore_case: match letters in either case.
    """
    if not pattern or len(pattern) > MAX_PATTERN_CHARS:
        raise ToolError(f"grep: the pattern must have 1 to {MAX_PATTERN_CHARS} characters")
    target = confine(ctx.root, path, what="grep")
    assert ctx.root is not None
    top = ctx.root.resolve()
    argv = ["git", *gitcli.SAFE_OPTIONS, "grep", "--no-index", "--no-color", "-n", "-I", "-E"]
    if ignore_case:
        argv.append("-i")
    argv += ["-e", pattern, "--", shown(top, target) or "."]
    # git grep --no-index reads no symlink (it only opens regular files), so a link out
    # of the tree is never followed; the time limit stops a pattern that backtracks.
    done = process.run(
        argv,
        cwd=top,
        env=gitcli.read_env(ceiling=top.parent),
        timeout_s=GREP_TIMEOUT_S,
        max_bytes=MAX_RESULT_CHARS * 4,
    )
    if done.timed_out:
        raise ToolError(
            f"grep: the search took longer than {GREP_TIMEOUT_S:g} s; simplify the pattern"
        )
    if done.returncode == 1:
        return f"no match for {pattern!r}"
    if done.returncode != 0:
        why = done.errors.decode("utf-8", "replace").strip().splitlines()
        raise ToolError(f"grep: {why[-1] if why else 'failed'}"[:300])
    lines = done.output.decode("utf-8", "replace").splitlines()
    kept = [
        line if len(line) <= MAX_MATCH_CHARS else line[:MAX_MATCH_CHARS] + " [...]"
        for line in lines[:MAX_MATCHES]
    ]
    if len(lines) > MAX_MATCHES or done.cut:
        kept.append("[... more matches cut: narrow the pattern or path]")
    return _capped("\n".join(kept))


def _history(ctx: ToolContext, what: str) -> tuple[Path, str]:
    if ctx.root is None:
        raise ToolError(f"{what}: no repository is open for this run")
    found = origin(ctx.root)
    return found.git_dir, found.commit


def _pathspec(path: str, what: str) -> list[str]:
    rel = relative(path, what=what)
    return [] if str(rel) == "." else ["--", str(rel)]


@tool(pure=True, timeout_s=30.0, reads=reviewed_tree)
def git_log(ctx: ToolContext, path: str = ".", n: int = 10) -> str:
    """The newest commits (up to the reviewed one) that touched a path: id, date, author, subject.

    Args:
        path: the file or folder, relative to the top of the repository ("." for all).
        n: how many commits to list (at most 50).
    """
    git_dir, commit = _history(ctx, "git_log")
    count = max(1, min(n, MAX_COMMITS))
    done = gitcli.git(
        [
            "log",
            "--no-color",
            "--date=short",
            "--format=%h %ad %an%n    %s",
            f"-n{count}",
            commit,
            *_pathspec(path, "git_log"),
        ],
        git_dir=git_dir,
        what="git_log",
    )
    text = done.output.decode("utf-8", "replace").strip()
    return _capped(text or f"no commits touch {path!r}")


@tool(pure=True, timeout_s=30.0, reads=reviewed_tree)
def git_blame(ctx: ToolContext, path: str, start_line: int = 1, end_line: int | None = None) -> str:
    """Who last changed each line of a file, and in which commit, at the reviewed commit.

    Args:
        path: the file, relative to the top of the repository.
        start_line: the first line (1 is the first line of the file).
        end_line: the last line (default: up to 500 lines from start_line).
    """
    git_dir, commit = _history(ctx, "git_blame")
    spec = _pathspec(path, "git_blame")
    if not spec:
        raise ToolError("git_blame: name a file")
    first = max(1, start_line)
    last = max(first, min(end_line or first + MAX_LINES - 1, first + MAX_LINES - 1))
    done = gitcli.git(
        ["blame", "--date=short", f"-L{first},{last}", commit, *spec],
        git_dir=git_dir,
        what="git_blame",
    )
    return _capped(done.output.decode("utf-8", "replace").rstrip())


@tool(pure=True, timeout_s=30.0, reads=reviewed_tree)
def git_show(ctx: ToolContext, rev: str = "HEAD", path: str | None = None) -> str:
    """A commit's message and diff, or a file as it was at that commit.

    Args:
        rev: HEAD (the reviewed commit), a commit id, or either followed by ~N or ^N;
            only the reviewed commit and its ancestors can be shown.
        path: a file to show as it was at rev, relative to the top of the repository
            (default: the commit's message and diff).
    """
    git_dir, commit = _history(ctx, "git_show")
    text = (rev or "HEAD").strip()
    if not REVISION.match(text):
        raise ToolError(
            f"git_show: {rev[:80]!r} is not a revision (HEAD, a commit id, then ~N or ^N)"
        )
    if text.startswith("HEAD"):
        text = commit + text[4:]
    try:
        sha = (
            gitcli.git(
                ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{text}^{{commit}}"],
                git_dir=git_dir,
            )
            .output.decode()
            .strip()
        )
    except ToolError as e:
        raise ToolError(f"git_show: no commit {rev!r} in the history") from e
    ancestor = process.run(
        [
            "git",
            *gitcli.SAFE_OPTIONS,
            f"--git-dir={git_dir}",
            "merge-base",
            "--is-ancestor",
            sha,
            commit,
        ],
        env=gitcli.read_env(),
        timeout_s=30.0,
        max_bytes=4096,
    )
    if ancestor.returncode != 0:
        raise ToolError(f"git_show: {rev!r} is not the reviewed commit or one of its ancestors")
    if path is None:
        args = [
            "show",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--format=fuller",
            "--stat",
            "--patch",
            sha,
        ]
    else:
        rel = relative(path, what="git_show")
        args = ["show", "--no-color", "--no-textconv", f"{sha}:{'' if str(rel) == '.' else rel}"]
    done = gitcli.git(args, git_dir=git_dir, max_bytes=MAX_RESULT_CHARS * 4, what="git_show")
    if path is not None and _binary(done.output):
        raise ToolError(f"git_show: {path!r} is a binary file at {rev}")
    body = done.output.decode("utf-8", "replace")
    if done.cut:
        body += "\n[... output cut: show one path at a time]"
    return _capped(body, "show one path at a time")
