"""Every ``duet`` command against a dead, frozen or refusing Redis: one line, exit 2, fast.

Real ``duet`` processes with ``DUET_REDIS_URL`` pointing at a port nothing listens on, at
a SIGSTOP'd redis-server (it accepts connections and never answers), and at a server
that wants a password the URL does not have. Each must print one line naming the variable
and the URL with its password hidden, exit with code 2 (a configuration problem, not
"some runs failed"), and do so within the connect timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from duet.embedded.server import EmbeddedRedis, free_port
from orchestration.settings import Settings
from orchestration.state.broker import broker_config
from tests.reliability import CLIENTS, Reliability
from tests.support import ROOT, cli_start_s

pytestmark = pytest.mark.system

#: The connect timeout the commands run with, seconds.
TIMEOUT_S = 1.0


def startup_s() -> float:
    """Time allowed to start Python and import the CLI: three times what it measured here
    just now (tests.support.cli_start_s), and never under 8 s."""
    return max(8.0, 3 * cli_start_s())


PASSWORD = "hunter2-not-shown"

CONFIG = ROOT / "examples" / "review.toml"
INPUTS = ROOT / "examples" / "inputs.jsonl"
BATCH = "0" * 32
ALL_COMMANDS = {
    "run": ["run", str(CONFIG), "-i", str(INPUTS), "-o", "{tmp}/out.jsonl"],
    "submit": ["submit", str(CONFIG), "-i", str(INPUTS)],
    "watch": ["watch", BATCH],
    "results": ["results", BATCH],
    "show": ["show", BATCH],
    "report": ["report", BATCH, "-o", "{tmp}/report.html"],
    "cancel": ["cancel", BATCH],
    "resume": ["resume", BATCH],
    "budget show": ["budget", "show"],
    "budget set": ["budget", "set", "global:x", "--max-usd", "5"],
    "metrics": ["metrics", "--port", str(free_port())],
    "sweep": ["sweep"],
}
SOME_COMMANDS = ["run", "submit", "watch", "budget show"]


def duet(args: list[str], url: str, tmp_path: Path) -> tuple[int, str, str, float]:
    env = {**os.environ, "DUET_REDIS_URL": url, "DUET_REDIS_CONNECT_TIMEOUT_S": str(TIMEOUT_S)}
    env.pop("DUET_BROKER_URL", None)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "duet", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started


def check_one_line(
    url: str, shown: str, command: str, tmp_path: Path, row: tuple[Reliability, str, str]
) -> str:
    """Run ``duet command`` against ``url``; record the row (reliability, fault, before
    the fix) with what went wrong, if anything; then check."""
    code, out, err, took = duet(ALL_COMMANDS[command], url, tmp_path)
    lines = err.strip().splitlines()
    prefix = f"error: cannot use Redis at DUET_REDIS_URL={shown}: "
    wrong = [
        what
        for what, bad in [
            (f"exit {code}", code != 2),
            (f"{len(lines)} lines on stderr", len(lines) != 1),
            ("the line does not name the variable and the URL", not err.startswith(prefix)),
            ("the password printed", PASSWORD in out + err),
            ("output on stdout", out != ""),
            (
                f"{took:.1f} s, over the {TIMEOUT_S + startup_s():g} s bound",
                took >= TIMEOUT_S + startup_s(),
            ),
        ]
        if bad
    ]
    reliability, fault, before = row
    reliability.record(
        section=CLIENTS,
        fault=fault,
        load=f"`duet {command}`",
        lost="; ".join(wrong)
        if wrong
        else "nothing: one line `error: cannot use Redis at "
        f"DUET_REDIS_URL=…: …`, exit 2, within the {TIMEOUT_S:g} s connect timeout "
        "(+ interpreter start); the password never printed",
        before=before,
    )
    assert code == 2, (code, err[-2000:])
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith(prefix), lines
    assert PASSWORD not in out + err
    assert out == ""
    assert took < TIMEOUT_S + startup_s(), took
    return lines[0]


@pytest.mark.parametrize("command", list(ALL_COMMANDS))
def test_a_dead_port(command: str, tmp_path: Path, reliability: Reliability) -> None:
    port = free_port()
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    row = (
        reliability,
        "`DUET_REDIS_URL` on a port nothing listens on (URL with a password)",
        "170–400-line tracebacks, exit 1",
    )
    line = check_one_line(url, f"redis://:***@127.0.0.1:{port}/0", command, tmp_path, row)
    assert "refused" in line.lower()


@pytest.fixture(scope="module")
def frozen_redis() -> Iterator[str]:
    """A redis-server stopped with SIGSTOP: the kernel still accepts connections."""
    with EmbeddedRedis() as server:
        client = redis.Redis(port=server.port)
        pid = int(client.info("server")["process_id"])
        client.close()
        os.kill(pid, signal.SIGSTOP)
        try:
            yield server.url
        finally:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("command", SOME_COMMANDS)
def test_a_frozen_server(
    command: str, frozen_redis: str, tmp_path: Path, reliability: Reliability
) -> None:
    row = (
        reliability,
        "A frozen Redis (`SIGSTOP`: connections accepted, never answered)",
        "`duet submit` hung for minutes",
    )
    line = check_one_line(frozen_redis, frozen_redis, command, tmp_path, row)
    assert line.endswith("did not answer in time")


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[EmbeddedRedis]:
    """A redis-server that wants a password."""
    with EmbeddedRedis() as server:
        client = redis.Redis(port=server.port)
        client.config_set("requirepass", "the-right-one")
        client.close()
        yield server


@pytest.mark.parametrize("command", SOME_COMMANDS)
@pytest.mark.parametrize("password", [None, PASSWORD])
def test_a_server_refusing_the_credentials(
    command: str,
    password: str | None,
    locked_redis: EmbeddedRedis,
    tmp_path: Path,
    reliability: Reliability,
) -> None:
    auth = f":{password}@" if password else ""
    url = f"redis://{auth}127.0.0.1:{locked_redis.port}/0"
    shown = url.replace(PASSWORD, "***")
    row = (
        reliability,
        "A Redis that wants a password: URL without one, and with a wrong one",
        None,
    )
    line = check_one_line(url, shown, command, tmp_path, row)
    assert "auth" in line.lower() or "password" in line.lower(), line


def test_redis_freezing_mid_command(tmp_path: Path, reliability: Reliability) -> None:
    """`duet watch` polling a batch when Redis freezes: the socket timeout ends it, one
    error line (after what the progress display had shown), exit 2."""
    from orchestration import Agent, Team
    from tests.support import client_pointed_at, wait_for

    socket_timeout = 6
    with EmbeddedRedis() as server, client_pointed_at(server.url):
        admin = redis.Redis(port=server.port)
        team = Team.actor_critic(actor=Agent("a", model="sim"), critic=Agent("c", model="sim"))
        batch = team.submit_batch(["no worker will take this"])  # stays queued
        env = {
            **os.environ,
            "DUET_REDIS_URL": server.url,
            "DUET_REDIS_SOCKET_TIMEOUT_S": str(socket_timeout),
        }
        err = tmp_path / "stderr.txt"
        with err.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "duet", "watch", batch.batch_id],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=sink,
            )
        try:
            baseline = int(admin.info("stats")["total_commands_processed"])
            wait_for(
                lambda: int(admin.info("stats")["total_commands_processed"]) > baseline + 20,
                30,
                "duet watch to poll the batch",
            )
            pid = int(admin.info("server")["process_id"])
            os.kill(pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                code = proc.wait(socket_timeout + 30)
                took = time.monotonic() - started
            finally:
                os.kill(pid, signal.SIGCONT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = err.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    expected = f"error: cannot use Redis at DUET_REDIS_URL={server.url}: did not answer in time"
    wrong = [
        what
        for what, bad in [
            (f"exit {code}", code != 2),
            ("a traceback", "Traceback" in text),
            (f"last line {lines[-1:]}", lines[-1:] != [expected]),
            (f"{took:.1f} s, over the bound", took >= socket_timeout * 4 + startup_s()),
        ]
        if bad
    ]
    reliability.record(
        section=CLIENTS,
        fault=f"Redis frozen while `duet watch` polls a batch (socket timeout {socket_timeout} s)",
        load="one `duet watch`",
        lost="; ".join(wrong)
        if wrong
        else f"nothing: after its progress lines, one line "
        f"`error: cannot use Redis at DUET_REDIS_URL=…: did not answer in time`, exit 2 "
        f"{took:.0f} s after the freeze, no traceback",
    )
    assert code == 2, text[-2000:]
    assert "Traceback" not in text
    assert (
        lines[-1]
        == f"error: cannot use Redis at DUET_REDIS_URL={server.url}: did not answer in time"
    )
    assert took < socket_timeout * 4 + startup_s(), took


def _rabbit_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=0.3):
            return True
    except OSError:
        return False


AMQP_FAULT = (
    "A separate AMQP broker (`DUET_BROKER_URL`, RabbitMQ) on a dead port, refusing "
    "the password, or frozen (connections accepted, never answered)"
)


@pytest.mark.parametrize(
    ("broker", "why"),
    [
        (f"amqp://guest:{PASSWORD}@127.0.0.1:{free_port()}//", "refused"),
        pytest.param(
            f"amqp://guest:{PASSWORD}@127.0.0.1:5672//",
            "ACCESS_REFUSED",
            marks=pytest.mark.skipif(not _rabbit_up(), reason="no RabbitMQ on 5672"),
        ),
    ],
    ids=["dead-port", "wrong-password"],
)
def test_an_unusable_amqp_broker(
    broker: str, why: str, tmp_path: Path, reliability: Reliability
) -> None:
    """A separate broker (RabbitMQ) that is down or refuses the credentials: one line
    naming DUET_BROKER_URL, exit 2, and nothing written to Redis."""
    load = "a dead port" if why == "refused" else "RabbitMQ, with a wrong password"
    check_broker_line(broker, why, reliability, load)


def test_a_frozen_amqp_broker(reliability: Reliability) -> None:
    """A listener that accepts connections and never answers (a frozen broker, as the
    kernel shows it): the AMQP handshake is bounded by the connect timeout."""
    with socket.create_server(("127.0.0.1", 0)) as listener:  # never accepts: the kernel does
        port = listener.getsockname()[1]
        broker = f"amqp://guest:{PASSWORD}@127.0.0.1:{port}//"
        check_broker_line(broker, "timed out", reliability, "a listener that never answers")


def check_broker_line(broker: str, why: str, reliability: Reliability, load: str) -> None:
    """``duet submit`` with ``broker`` as DUET_BROKER_URL: record the row, then check for
    one line naming the variable (password hidden) and ``why``, exit 2, within the connect
    timeout, and nothing written to Redis."""
    with EmbeddedRedis() as server:
        env = {
            **os.environ,
            "DUET_REDIS_URL": server.url,
            "DUET_BROKER_URL": broker,
            "DUET_REDIS_CONNECT_TIMEOUT_S": str(TIMEOUT_S),
        }
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "duet", "submit", str(CONFIG), "-i", str(INPUTS)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
        client = redis.Redis(port=server.port)
        written = client.dbsize()
        client.close()
    lines = proc.stderr.strip().splitlines()
    shown = broker.replace(PASSWORD, "***")
    prefix = f"error: cannot use the broker at DUET_BROKER_URL={shown}: "
    bound = TIMEOUT_S + startup_s()
    wrong = [
        what
        for what, bad in [
            (f"exit {proc.returncode}", proc.returncode != 2),
            (f"{len(lines)} lines on stderr", len(lines) != 1),
            ("the line does not name the variable and the URL", not proc.stderr.startswith(prefix)),
            ("the password printed", PASSWORD in proc.stdout + proc.stderr),
            (f"{written} keys written to Redis", written != 0),
            (f"{took:.1f} s, over the {bound:g} s bound", took >= bound),
        ]
        if bad
    ]
    reliability.record(
        section=CLIENTS,
        fault=AMQP_FAULT,
        load=f"`duet submit` against {load}",
        lost="; ".join(wrong)
        if wrong
        else "nothing: one line `error: cannot use the broker at "
        f"DUET_BROKER_URL=amqp://guest:***@…: …`, exit 2, within the {TIMEOUT_S:g} s connect "
        "timeout (+ interpreter start), and nothing written to Redis (the broker is checked "
        "before any run is recorded)",
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(prefix)
    assert why in lines[0]
    assert PASSWORD not in proc.stdout + proc.stderr
    assert written == 0  # no run record was left waiting for a message never sent
    assert took < bound, took


class FreezingProxy:
    """A TCP proxy to a port on 127.0.0.1 that can stop passing bytes, both ways, while
    keeping every connection open: to its clients, a server that froze mid-conversation."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.frozen = threading.Event()
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                return
            server.settimeout(None)
            self._socks += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
                if not data or self.frozen.is_set():
                    self._closed.wait()  # frozen: hold what came, answer nothing
                    return
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._socks:
            sock.close()


@pytest.mark.skipif(not _rabbit_up(), reason="no RabbitMQ on 5672")
def test_an_amqp_broker_freezing_after_the_handshake(reliability: Reliability) -> None:
    """RabbitMQ (through a proxy) stops answering once a connection is open: the next
    request on it (opening a channel, as a producer does first) fails within the socket
    timeout, with the transport options every Duet process gets (``broker_config``)."""
    import kombu

    socket_timeout = 6.0
    settings = Settings(redis_socket_timeout_s=socket_timeout, redis_connect_timeout_s=TIMEOUT_S)
    proxy = FreezingProxy(5672)
    config = broker_config(f"amqp://guest:guest@127.0.0.1:{proxy.port}//", settings)
    conn = kombu.Connection(  # type: ignore[no-untyped-call]
        config["broker_url"],
        connect_timeout=config["broker_connection_timeout"],
        transport_options=config["broker_transport_options"],
    )
    outcome: list[str] = []
    try:
        conn.connect()  # type: ignore[no-untyped-call]
        proxy.frozen.set()

        def open_channel() -> None:
            try:
                conn.channel()  # type: ignore[no-untyped-call]
                outcome.append("opened")
            except Exception as exc:  # noqa: BLE001 - any error ends the wait: what we want
                outcome.append(type(exc).__name__)

        started = time.monotonic()
        opener = threading.Thread(target=open_channel, daemon=True)
        opener.start()
        opener.join(socket_timeout * 3)
        took = time.monotonic() - started
    finally:
        proxy.close()  # also ends a wait that never timed out
        conn.collect()  # type: ignore[no-untyped-call]  # its socket, without a goodbye
    failed_in_time = bool(outcome) and outcome[0] != "opened"
    reliability.record(
        section=CLIENTS,
        fault="An AMQP broker (RabbitMQ, through a proxy) that stops answering after the "
        "connection is open",
        load=f"opening a channel on a Duet broker connection (socket timeout {socket_timeout:g} s)",
        lost=f"nothing: the request failed with `{outcome[0]}` after {took:.1f} s"
        if failed_in_time
        else f"1 of 1 requests still waiting after {took:.0f} s ({outcome or 'no answer'})",
        before="no socket timeout on AMQP connections (only the connect timeout and the "
        "heartbeat): the request was still waiting at the test's bound (18 s); nothing ends it",
    )
    assert failed_in_time, outcome
    assert took < socket_timeout * 2, took
