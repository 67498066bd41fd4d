"""What GitHub code scanning refuses in a SARIF upload, as documented ("SARIF support for
code scanning" and "SARIF results exceed limit"), as one checker the tests share: the
OASIS schema says what SARIF is, this says what GitHub takes."""

from __future__ import annotations

import gzip
import json
import re
from typing import Any

#: GitHub's hard limits on one upload.
MAX_GZIPPED_BYTES = 10 * 1024 * 1024
MAX_RUNS = 20
MAX_RESULTS_PER_RUN = 25_000
MAX_RULES_PER_RUN = 25_000
MAX_LOCATIONS_PER_RESULT = 1_000
MAX_TAGS_PER_RULE = 20
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def upload_problems(log: dict[str, Any]) -> list[str]:
    """Why GitHub would refuse ``log`` (or a part of it), or [] when it takes it whole."""
    problems = []
    size = len(gzip.compress(json.dumps(log).encode()))
    if size > MAX_GZIPPED_BYTES:
        problems.append(f"{size:,} bytes gzipped, over 10 MB")
    runs = log.get("runs") or []
    if not 1 <= len(runs) <= MAX_RUNS:
        problems.append(f"{len(runs)} runs: GitHub takes 1 to {MAX_RUNS} (422 on none)")
    categories = [(r.get("automationDetails") or {}).get("id") for r in runs]
    if len(set(categories)) != len(categories):
        problems.append("two runs of one category in one upload")
    for n, run in enumerate(runs):
        results = run.get("results")
        if results is None:
            problems.append(f"run {n}: no results array")
            continue
        if len(results) > MAX_RESULTS_PER_RUN:
            problems.append(f"run {n}: {len(results):,} results")
        rules = run["tool"]["driver"].get("rules") or []
        if len(rules) > MAX_RULES_PER_RUN:
            problems.append(f"run {n}: {len(rules):,} rules")
        for rule in rules:
            tags = (rule.get("properties") or {}).get("tags") or []
            if len(tags) > MAX_TAGS_PER_RULE:
                problems.append(f"rule {rule['id']}: {len(tags)} tags")
        for m, result in enumerate(results):
            problems += _result_problems(f"run {n} result {m}", result)
    return problems


def _result_problems(where: str, result: dict[str, Any]) -> list[str]:
    problems = []
    locations = result.get("locations") or []
    if not 1 <= len(locations) <= MAX_LOCATIONS_PER_RESULT:
        problems.append(f"{where}: {len(locations)} locations (GitHub needs at least one)")
    if not (result.get("message") or {}).get("text"):
        problems.append(f"{where}: no message text")
    if not result.get("ruleId"):
        problems.append(f"{where}: no ruleId")
    if not result.get("partialFingerprints"):
        problems.append(f"{where}: no partialFingerprints")
    for location in locations:
        physical = location.get("physicalLocation") or {}
        uri = (physical.get("artifactLocation") or {}).get("uri")
        if not isinstance(uri, str) or not uri:
            problems.append(f"{where}: a location without an artifact uri")
        elif uri.startswith("/") or _SCHEME.match(uri) or ".." in uri.split("/"):
            problems.append(f"{where}: uri {uri!r} is not relative to the repository")
        region = physical.get("region")
        if region is not None:
            start = region.get("startLine")
            if not isinstance(start, int) or start < 1:
                problems.append(f"{where}: startLine {start!r}")
            end = region.get("endLine", start)
            if isinstance(start, int) and (not isinstance(end, int) or end < start):
                problems.append(f"{where}: endLine {end!r} before startLine {start}")
    return problems
