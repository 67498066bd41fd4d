"""Which files a review leaves out, and why: one set of rules for ``--git`` and directories.

A file is skipped and counted (never failed) when it is excluded by a glob, a lock file, a
generated file (``linguist-generated`` or ``-diff`` in ``.gitattributes``), minified, or
holds a private key or credentials. Secrets are found by ``detect-secrets`` (its default
plugins and filters) plus names that are keys by convention (``*.pem``, ``id_rsa``): such a
file is never put in a prompt, since a prompt goes to a model vendor, unless the caller
says ``--include-secrets``. Pure but for the secret scan's temporary file.
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

#: Dependency lock files: written by a tool, thousands of lines no reviewer reads.
LOCK_FILES = frozenset(
    {
        "uv.lock",
        "poetry.lock",
        "pdm.lock",
        "Pipfile.lock",
        "package-lock.json",
        "npm-shrinkwrap.json",
        "yarn.lock",
        "pnpm-lock.yaml",
        "bun.lockb",
        "bun.lock",
        "Cargo.lock",
        "Gemfile.lock",
        "composer.lock",
        "go.sum",
        "mix.lock",
        "pubspec.lock",
        "Podfile.lock",
        "Package.resolved",
        "flake.lock",
        "packages.lock.json",
        "gradle.lockfile",
        "conda-lock.yml",
        "deno.lock",
    }
)
#: Names that hold keys or credentials by convention, whatever their content.
KEY_GLOBS = (
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.ppk",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    ".netrc",
    ".pypirc",
    ".npmrc",
    ".env",
    ".env.*",
)
#: Minified code by name.
MINIFIED_GLOBS = ("*.min.js", "*.min.css", "*.min.mjs", "*-min.js", "*.bundle.js")
#: A text this long whose lines average more than :data:`MINIFIED_MEAN_LINE` is minified.
MINIFIED_MIN_CHARS = 2_000
MINIFIED_MEAN_LINE = 300

#: Reasons, as counted in ``skipped_by`` and printed.
EXCLUDED, LOCK, GENERATED, MINIFIED, SECRET = (
    "excluded",
    "lock file",
    "generated",
    "minified",
    "key or credentials",
)


def matches(path: str, globs: Sequence[str]) -> bool:
    """Whether ``path`` (``/``-separated, relative) or a folder above it matches a glob:
    ``*`` crosses ``/``, ``**/`` may match no folder, a glob without ``/`` also matches a
    name alone, and one ending in ``/`` matches folders only."""
    parts = path.split("/")
    for glob in globs:
        bare = glob.rstrip("/")
        if not bare:
            continue
        for n in range(1, len(parts) + 1):
            if glob.endswith("/") and n == len(parts):
                continue
            here = "/".join(parts[:n])
            if (
                fnmatch.fnmatchcase(here, bare)
                or fnmatch.fnmatchcase(here, bare.replace("**/", ""))
                or ("/" not in bare and fnmatch.fnmatchcase(parts[n - 1], bare))
            ):
                return True
    return False


def generated(attributes: Mapping[str, str]) -> bool:
    """Whether ``git check-attr`` values mark a file generated: ``linguist-generated`` set
    (or true), or ``diff`` unset (``-diff``: git itself shows no diff of it)."""
    return attributes.get("linguist-generated") in ("set", "true") or (
        attributes.get("diff") == "unset"
    )


def minified(path: str, text: str) -> bool:
    """Minified by name (``app.min.js``) or by shape: long text on few, very long lines."""
    name = PurePosixPath(path).name
    if any(fnmatch.fnmatchcase(name, g) for g in MINIFIED_GLOBS):
        return True
    if len(text) < MINIFIED_MIN_CHARS:
        return False
    return len(text) / max(1, text.count("\n") + 1) > MINIFIED_MEAN_LINE


def key_file(path: str) -> bool:
    """Whether ``path``'s name holds keys or credentials by convention (``*.pem``)."""
    name = PurePosixPath(path).name
    return any(fnmatch.fnmatchcase(name, g) for g in KEY_GLOBS)


def secrets_in(path: str, text: str) -> list[str]:
    """The kinds of secret ``detect-secrets`` finds in ``text`` (e.g. ``Private Key``),
    with its default plugins and filters; ``path``'s name picks the filters as for a file
    of that name."""
    from detect_secrets import SecretsCollection
    from detect_secrets.settings import default_settings

    name = PurePosixPath(path).name or "file"
    with tempfile.TemporaryDirectory(prefix="duet-scan-") as folder:
        file = Path(folder, name)
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as out:
            out.write(text)
        found = SecretsCollection(root=folder)
        with default_settings():
            found.scan_file(name)
        return sorted({s.type for secrets in found.data.values() for s in secrets})


@dataclass(frozen=True)
class SkipRules:
    """What to leave out of a review: ``exclude`` globs, and secrets unless
    ``include_secrets``. Lock, generated and minified files are always left out."""

    exclude: tuple[str, ...] = ()
    include_secrets: bool = False

    def by_name(self, path: str) -> str | None:
        """Why ``path`` is skipped before it is read, or None."""
        if self.exclude and matches(path, self.exclude):
            return EXCLUDED
        if PurePosixPath(path).name in LOCK_FILES:
            return LOCK
        if not self.include_secrets and key_file(path):
            return SECRET
        return None

    def by_content(self, path: str, text: str) -> str | None:
        """Why ``path`` holding ``text`` is skipped, or None: minified, or a secret."""
        if minified(path, text):
            return MINIFIED
        if not self.include_secrets and secrets_in(path, text):
            return SECRET
        return None
