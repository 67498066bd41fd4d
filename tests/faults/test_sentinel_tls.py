"""Sentinels and a primary on TLS only, as managed services run them, all real processes:
a worker (``celery -A workers worker``), a batch, ``duet ls`` and Flower's Broker page
given one ``sentinels://...?ssl_ca_certs=...`` URL; and every entry point (``duet ls``,
``duet worker``, ``celery -A workers worker``) refusing a CA that did not sign the
servers' certificates in one line that names TLS, exit 2, before Celery starts.

The servers listen on TLS only (``port 0``) and require a client certificate, so any
connection made without TLS (to a sentinel or to the primary) fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.faults.conftest import SentinelSet, serve_a_batch
from tests.reliability import CLIENTS, Reliability, lost_of
from tests.support import ROOT, assert_flower_shows_empty_queues, make_ca

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

RUNS = 10


def command(argv: list[str], url: str, **more: str) -> subprocess.CompletedProcess[str]:
    """``argv`` run with ``DUET_REDIS_URL=url`` (and ``more`` variables), its output
    captured."""
    env = {**os.environ, "DUET_REDIS_URL": url, "DUET_REDIS_CONNECT_TIMEOUT_S": "3", **more}
    env.pop("DUET_BROKER_URL", None)
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=90, env=env)


DUET_LS = [sys.executable, "-m", "duet", "ls"]
DUET_WORKER = [sys.executable, "-m", "duet", "worker", "--concurrency", "2"]
CELERY_WORKER = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-c", "2"]


def test_a_worker_serves_a_batch_through_tls_sentinels(
    tls_sentinels: SentinelSet, tmp_path: Path, reliability: Reliability
) -> None:
    url = tls_sentinels.url
    assert url.startswith("sentinels://")
    served = serve_a_batch(url, tmp_path / "flower.log", RUNS, name="tlssentinel", timeout=120)
    # The same TLS as redis-py and kombu spell it: ssl_* parameters on sentinel://.
    spelled = url.replace("sentinels://", "sentinel://")
    listed_too = command(DUET_LS, spelled)
    statuses, listed = served.statuses, served.listed
    (lengths_status, _), (broker_status, _) = served.lengths, served.broker
    approved = statuses.count("approved")
    print(
        f"TLS sentinels: {approved}/{RUNS} approved; duet ls exit {listed.returncode} "
        f"(sentinel://?ssl_*: {listed_too.returncode}); "
        f"Flower /api/queues/length {lengths_status}, /broker {broker_status}"
    )
    reliability.record(
        section=CLIENTS,
        fault="`DUET_REDIS_URL=sentinels://…?ssl_ca_certs=…&ssl_certfile=…&ssl_keyfile=…`: "
        "3 sentinels, a primary and its replica all on TLS only with client certificates "
        "(real servers): a worker, a batch, `duet ls`, Flower's Broker page and "
        "`/api/queues/length`; `duet ls` again with `sentinel://…?ssl_…`",
        load=f"{RUNS} one-round runs on 1 worker × 8 threads",
        lost=f"{lost_of(RUNS - approved, RUNS, 'runs unfinished')}: `duet ls` exit "
        f"{listed.returncode} (with `sentinel://…?ssl_…` {listed_too.returncode}), Flower's Broker page {broker_status} and "
        f"`/api/queues/length` {lengths_status}",
        before="issue 37: `sentinels://` refused (a 63-line traceback from `duet worker` "
        "before that); `?ssl_ca_certs=` on `sentinel://` silently ignored, every command "
        "blaming sentinels 'all down'",
    )
    assert statuses == ["approved"] * RUNS, served.worker_log[-3000:]
    assert listed.returncode == 0, listed.stderr
    assert listed_too.returncode == 0, listed_too.stderr
    assert_flower_shows_empty_queues(served.lengths, served.broker)


def test_a_wrong_ca_or_no_tls_is_one_line_naming_the_cause(
    tls_sentinels: SentinelSet, reliability: Reliability
) -> None:
    """A CA that signed nothing of theirs: every entry point exits 2 in one line naming
    the TLS handshake; ``sentinel://`` (no TLS) against TLS-only sentinels names
    ``sentinels://`` as the likely fix; a primary's name they do not watch is named."""
    directory = Path(tls_sentinels.dir)
    make_ca(directory, "other-ca")
    parts = ";".join(f"sentinels://127.0.0.1:{p}" for p in tls_sentinels.sentinel_ports)
    wrong = f"{parts}/0?{urlencode(tls_sentinels.tls_files(ca='other-ca.crt'))}"
    plain = ";".join(f"sentinel://127.0.0.1:{p}" for p in tls_sentinels.sentinel_ports) + "/0"
    said = {
        "duet ls": command(DUET_LS, wrong),
        "duet worker": command(DUET_WORKER, wrong),
        "celery -A workers worker": command(CELERY_WORKER, wrong),
    }
    without_tls = command(DUET_LS, plain)
    no_such = command(DUET_LS, tls_sentinels.url, DUET_REDIS_SENTINEL_MASTER="not-theirs")
    for name, done in said.items():
        print(f"{name} with a wrong CA: exit {done.returncode}: {done.stderr.strip()[-600:]}")
    print(f"duet ls without TLS: exit {without_tls.returncode}: {without_tls.stderr.strip()}")
    print(f"duet ls, no such master: exit {no_such.returncode}: {no_such.stderr.strip()}")

    def clear(done: subprocess.CompletedProcess[str]) -> bool:
        # (Celery warns of a worker run as root first: not Duet's line.)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        return (
            done.returncode == 2
            and len(errors) == 1
            and "TLS handshake with the sentinels failed" in errors[0]
            and "CERTIFICATE_VERIFY_FAILED" in errors[0]
            and "Traceback" not in done.stderr
        )

    unclear = sorted(name for name, done in said.items() if not clear(done))
    reliability.record(
        section=CLIENTS,
        fault="TLS-only sentinels and primary given a CA that signed none of their "
        "certificates (`ssl_ca_certs=`), to `duet ls`, `duet worker` and `celery -A workers "
        "worker`; then `duet ls` with `sentinel://` (no TLS), and with the right CA but a "
        "primary's name the sentinels do not watch",
        load="3 sentinels, a primary and its replica (real servers)",
        lost=f"{lost_of(len(unclear), len(said), 'entry points without a one-line TLS error')}"
        f": exit codes {', '.join(str(d.returncode) for d in said.values())}; without TLS "
        f"exit {without_tls.returncode}, naming `sentinels://`; no such primary exit "
        f"{no_such.returncode}, naming it",
        before="issue 37: every command blamed 'no sentinel named a primary ... all down'; "
        "`duet worker` retried ~100 times instead of exiting",
    )
    assert unclear == [], {n: d.stderr[-2000:] for n, d in said.items()}
    assert without_tls.returncode == 2, without_tls.stderr
    assert len(without_tls.stderr.strip().splitlines()) == 1, without_tls.stderr
    assert "sentinels://" in without_tls.stderr
    assert no_such.returncode == 2, no_such.stderr
    assert "none watches a primary named 'not-theirs'" in no_such.stderr, no_such.stderr
