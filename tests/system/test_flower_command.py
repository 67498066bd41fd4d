"""``duet flower``, the documented way to start Flower: on loopback unless told otherwise,
and never with a placeholder or missing login."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from duet.embedded.server import free_port
from tests.reliability import FILES, Reliability, lost_of
from tests.support import wait_for

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
DUET = [sys.executable, "-m", "duet"]
GOOD = "ops:7Hq-flower-login-x2"


def _listening(port: int) -> set[str]:
    """The local addresses a socket listens on at ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def _status(port: int, login: str | None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/workers")
    if login is not None:
        import base64

        request.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _documented() -> list[str]:
    """Every line of the docs, Makefile and deploy/ that starts Flower."""
    files = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").glob("*.md")]
    files += [p for p in (ROOT / "deploy").rglob("*") if p.is_file()]
    lines = []
    for file in files:
        if file.name == "RELIABILITY.md":
            continue
        for line in file.read_text(errors="replace").splitlines():
            if re.search(r"\bflower\b", line) and re.search(r"celery .*flower|duet flower", line):
                lines.append(f"{file.relative_to(ROOT)}: {line.strip()}")
    return lines


PLACEHOLDERS = ["ops:CHANGE-ME", "admin:changeme", "ops:", "ops:password", "ops:short", ""]


def test_duet_flower_binds_to_loopback_and_refuses_a_placeholder_login(
    system_redis_url: str, reliability: Reliability, tmp_path: Path
) -> None:
    env = {**os.environ, "DUET_REDIS_URL": system_redis_url}
    env.pop("FLOWER_AUTH", None)
    started = []
    for login in PLACEHOLDERS:
        done = subprocess.run(
            [*DUET, "flower", "--port", str(free_port())],
            env={**env, "FLOWER_BASIC_AUTH": login},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 2 or "FLOWER_BASIC_AUTH" not in done.stderr:
            started.append(login)
    port = free_port()
    with (tmp_path / "flower.log").open("wb") as log:
        flower = subprocess.Popen(
            [*DUET, "flower", "--port", str(port)],
            env={**env, "FLOWER_BASIC_AUTH": GOOD},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: flower.poll() is not None or _listening(port), 60, "Flower to listen")
        addresses = _listening(port)
        anonymous = _status(port, None)
        logged_in = wait_for(lambda: _status(port, GOOD) == 200, 30, "Flower to answer a login")
    finally:
        flower.terminate()
        flower.wait(timeout=30)
    documented = _documented()
    unsafe = [d for d in documented if "CHANGE-ME" in d or "--basic-auth=" in d]
    reliability.record(
        section=FILES,
        fault="the documented Flower command: all interfaces, the literal `ops:CHANGE-ME`",
        load=f"`duet flower` with {len(PLACEHOLDERS)} placeholder or empty logins, then with a "
        f"real one; {len(documented)} documented Flower lines (README, docs, Makefile, deploy/)",
        lost=lost_of(
            len(started) + len(unsafe) + (addresses != {"0100007F"}),
            len(PLACEHOLDERS) + len(documented) + 1,
            "placeholders accepted, documented lines with a login in them, or a bind beyond "
            "loopback",
        ),
        before="README's line listened on all interfaces with the literal `ops:CHANGE-ME`",
    )
    assert not started, started
    assert addresses == {"0100007F"}, f"listens on {addresses} (0100007F is 127.0.0.1)"
    assert anonymous == 401 and logged_in
    assert not unsafe, unsafe
    assert any("duet flower" in d for d in documented if d.startswith("README.md"))
