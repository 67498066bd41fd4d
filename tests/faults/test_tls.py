"""Duet on a TLS Redis with an ACL user and the default user off, all real processes: a
worker and a batch, the CLI and Flower's Broker page all through one ``rediss://`` URL
(CA file, client certificate), the password shown nowhere.

The test makes its own CA, server and client certificates (``openssl``) and starts a
redis-server that listens on TLS only and requires a client certificate.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest
import redis

from duet.embedded.server import find_server_binary, free_port
from tests.faults.conftest import serve_a_batch
from tests.reliability import CLIENTS, Reliability, lost_of
from tests.support import (
    TLS_SERVER_OPTIONS,
    assert_flower_shows_empty_queues,
    make_certificates,
    pings,
    stock_libraries,
    wait_for,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

RUNS = 20
USER, PASSWORD = "duet-app", "tls-ACL-pw-9f3k2"


@dataclass
class TlsRedis:
    port: int
    dir: Path

    @property
    def url(self) -> str:
        query = urlencode(
            {
                "ssl_ca_certs": self.dir / "ca.crt",
                "ssl_certfile": self.dir / "client.crt",
                "ssl_keyfile": self.dir / "client.key",
            }
        )
        return f"rediss://{USER}:{PASSWORD}@127.0.0.1:{self.port}/0?{query}"


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    """A redis-server on TLS only (client certificate required), one ACL user, the default
    user off."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make certificates with")
    make_certificates(tmp_path)
    (tmp_path / "users.acl").write_text(
        f"user default off\nuser {USER} on >{PASSWORD} ~* &* +@all\n"
    )
    server = TlsRedis(free_port(), tmp_path)
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            find_server_binary(),
            "--port",
            "0",
            "--tls-port",
            str(server.port),
            "--bind",
            "127.0.0.1",
            *TLS_SERVER_OPTIONS,
            "--aclfile",
            "users.acl",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
            "--loglevel",
            "warning",
        ],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=2)
        wait_for(lambda: proc.poll() is not None or pings(client), 30, "the TLS Redis")
        if proc.poll() is not None:
            text = (tmp_path / "server.log").read_text(errors="replace")
            if "tls" in text.lower() and "not" in text.lower():
                pytest.skip(f"this redis-server has no TLS: {text[-300:]}")
            raise AssertionError(f"the TLS redis-server exited: {text[-1000:]}")
        client.close()
        yield server
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("transport", ["duet", "stock"])
def test_worker_cli_and_flower_on_tls_with_an_acl_user(
    tls_redis: TlsRedis, tmp_path: Path, reliability: Reliability, transport: str
) -> None:
    """On Duet's broker transport, and on kombu's stock one (``DUET_FAST_PATHS=off``)."""
    url = tls_redis.url
    flower_log = tmp_path / "flower.log"
    with stock_libraries() if transport == "stock" else contextlib.nullcontext():
        served = serve_a_batch(url, flower_log, RUNS, name="tls")
    statuses, listed, worker_log = served.statuses, served.listed, served.worker_log
    (lengths_status, lengths), (broker_status, page) = served.lengths, served.broker
    approved = statuses.count("approved")
    shown = {
        "worker log": worker_log,
        "duet ls": listed.stdout + listed.stderr,
        "Flower /api/queues/length": lengths.decode(errors="replace"),
        "Flower /broker": page.decode(errors="replace"),
        "Flower's log": flower_log.read_text(errors="replace"),
    }
    leaked = sorted(where for where, text in shown.items() if PASSWORD in text)
    print(
        f"TLS + ACL ({transport}): {approved}/{RUNS} approved; duet ls exit {listed.returncode}; Flower "
        f"/api/queues/length {lengths_status}, /broker {broker_status}; password in "
        f"{leaked or 'nothing'}"
    )
    reliability.record(
        section=CLIENTS,
        fault="`rediss://` with a CA file and a client certificate, an ACL user and the default "
        "user off (a real TLS-only redis-server): a worker, a batch, `duet ls`, Flower's Broker "
        "page and `/api/queues/length`"
        + (
            ", with `DUET_FAST_PATHS=off` (kombu's stock transport)" if transport == "stock" else ""
        ),
        load=f"{RUNS} one-round runs on 1 worker × 8 threads",
        lost=f"{lost_of(RUNS - approved, RUNS, 'runs unfinished')}: `duet ls` exit "
        f"{listed.returncode}, Flower's Broker page {broker_status} and `/api/queues/length` "
        f"{lengths_status}; the password in {', '.join(leaked) or 'no log, output or page'}",
        before="issue 23: Flower's Broker page and `/api/queues/length` answered 500 (the "
        "transport alias turned `rediss` into plain `redis`, without TLS)",
    )
    assert statuses == ["approved"] * RUNS
    assert listed.returncode == 0, listed.stderr
    assert_flower_shows_empty_queues(served.lengths, served.broker)
    assert leaked == []
