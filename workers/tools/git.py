"""Git as the tools run it: a fixed environment, no prompts, no helpers from the repository.

Reading runs ignore the system and user configuration (a worker's ``~/.gitconfig`` must
not change what a tool returns) and never run an external diff or text conversion a
repository's attributes ask for. Fetching keeps the worker's configuration (its
credential helpers and SSH keys reach private repositories) but only over the protocols in
:data:`PROTOCOLS`: ``ext::`` would run a command named by the URL.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from workers import secrets
from workers.tools import process
from workers.tools.errors import ToolError

#: Transports a fetch may use.
PROTOCOLS = "file:git:http:https:ssh"
#: Options every git run gets on its command line (protected configuration: a repository's
#: own config cannot undo them).
SAFE_OPTIONS = (
    "-c",
    "safe.directory=*",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "protocol.ext.allow=never",
    "--literal-pathspecs",
    "--no-pager",
)


def read_env(ceiling: Path | None = None) -> dict[str, str]:
    """The environment of a reading git: no user or system config, no prompt, C locale."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_ALLOW_PROTOCOL": PROTOCOLS,
    }
    if ceiling is not None:
        # No repository above the tree is found and read (grep runs outside any).
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    return env


def fetch_env() -> dict[str, str]:
    """The worker's environment for a fetch, held to :data:`PROTOCOLS` and never prompting."""
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": PROTOCOLS}


def git(
    args: Sequence[str],
    *,
    git_dir: Path | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 30.0,
    max_bytes: int = 1 << 20,
    what: str = "git",
) -> process.Finished:
    """Run git with :data:`SAFE_OPTIONS`; a failure or a timeout is a :class:`ToolError`."""
    argv = ["git", *SAFE_OPTIONS]
    if git_dir is not None:
        argv.append(f"--git-dir={git_dir}")
    argv.extend(args)
    done = process.run(
        argv,
        cwd=cwd,
        env=env if env is not None else read_env(),
        timeout_s=timeout_s,
        max_bytes=max_bytes,
    )
    if done.timed_out:
        raise ToolError(f"{what}: took longer than {timeout_s:g} s and was stopped")
    if done.returncode != 0:
        detail = done.errors.decode("utf-8", "replace").strip().splitlines()
        last = detail[-1] if detail else f"exit {done.returncode}"
        # A fetch error may quote a URL with its credentials.
        raise ToolError(secrets.redact(f"{what}: {last}")[:300])
    return done
