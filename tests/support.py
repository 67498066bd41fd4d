"""Helpers shared by tests: waiting on a condition, a real worker process."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
#: The smallest review config: actor and critic on the offline simulator.
SIM_CONFIG = """\
[actor]
instructions = "Fix the code."
model = "sim"

[critic]
instructions = "Find security bugs."
model = "sim"
"""

#: ``celery -A workers`` with this interpreter.
CELERY = (sys.executable, "-m", "celery", "-A", "workers")


def pings(client: redis.Redis) -> bool:
    """Whether the server behind ``client`` answers a ping now (not yet: False)."""
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


@functools.cache
def cli_start_s() -> float:
    """Seconds ``python -m duet --version`` takes here and now (the slower of two): how long
    starting the interpreter and importing the CLI costs on this machine under its load, so
    a bound on a command's wall time allows for it instead of guessing."""
    taken = []
    for _ in range(2):
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "duet", "--version"], capture_output=True, timeout=120
        )
        taken.append(time.monotonic() - started)
    return max(taken)


def wait_for(condition, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``condition`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def _answers(probe: Any, hostname: str) -> bool:
    try:
        return bool(probe.control.ping(destination=[hostname], timeout=0.5))
    except redis.exceptions.RedisError:
        return False


@contextlib.contextmanager
def celery_worker(
    redis_url: str,
    *,
    concurrency: int = 32,
    env: dict[str, str] | None = None,
    queues: str = "actor,critic,coordinator,tools",
    name: str = "w1",
    broker_url: str | None = None,
    loglevel: str = "WARNING",
    gossip: bool = False,
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``celery -A workers worker`` subprocess, ready when this yields (``gossip``:
    with Celery's heartbeat, mingle and gossip on, as a worker runs by default).

    Its log (stdout and stderr) is the file ``proc.log_path`` (removed afterwards).
    """
    full_env = {**os.environ, "DUET_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("DUET_BROKER_URL", None)
    if broker_url:
        full_env["DUET_BROKER_URL"] = broker_url
    log = open(ROOT / f".pytest-worker-{name}-{os.getpid()}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            *CELERY,
            "worker",
            "--pool",
            "threads",
            "-c",
            str(concurrency),
            "-Q",
            queues,
            "--loglevel",
            loglevel,
            *([] if gossip else ["--without-heartbeat", "--without-mingle", "--without-gossip"]),
            "-n",
            f"{name}-{os.getpid()}@%h",
        ],
        cwd=ROOT,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    proc.log_path = ROOT / log.name  # type: ignore[attr-defined]
    from celery import Celery

    from orchestration.state import sentinel, tlsquery
    from orchestration.state.keys import BROKER_PREFIX

    target = broker_url or redis_url
    login = sentinel.parse(target) if sentinel.is_sentinel(target) else None
    probe = Celery("probe", broker=login.canonical() if login else target, set_as_current=False)
    # The workers' broker keys (and so their control channels) are under Duet's prefix,
    # on Duet's transport and kombu's stock one alike.
    prefix = f"{env['DUET_KEY_PREFIX']}." if env and env.get("DUET_KEY_PREFIX") else BROKER_PREFIX
    probe.conf.broker_transport_options = {"global_keyprefix": prefix}
    if login is not None:  # the primary's name; the sentinels' own password and TLS
        probe.conf.broker_transport_options["master_name"] = full_env.get(
            "DUET_REDIS_SENTINEL_MASTER", "mymaster"
        )
        asking = dict(login.tls_kwargs())
        if full_env.get("DUET_REDIS_SENTINEL_PASSWORD"):
            asking["password"] = full_env["DUET_REDIS_SENTINEL_PASSWORD"]
        if asking:
            probe.conf.broker_transport_options["sentinel_kwargs"] = asking
        if login.tls is not None:
            probe.conf.broker_use_ssl = tlsquery.client_kwargs(login.tls)
    hostname = f"{name}-{os.getpid()}@{socket.gethostname()}"
    try:
        # This worker's own answer (another worker of the test may answer first); a Redis
        # that refuses the ping's reply queue (a fault test) is "not yet".
        wait_for(
            lambda: proc.poll() is not None or _answers(probe, hostname),
            60,
            "the worker to answer a ping",
        )
        if proc.poll() is not None:
            raise AssertionError(f"worker exited: {(ROOT / log.name).read_text()[-2000:]}")
        yield proc
    finally:
        probe.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)


@contextlib.contextmanager
def stock_libraries() -> Iterator[dict[str, str]]:
    """This process's client on the stock libraries (``DUET_FAST_PATHS=off``) until the
    block ends; yields the variable, for the workers' environment."""
    from orchestration.state import fastpaths

    saved = os.environ.get(fastpaths.SWITCH)
    os.environ[fastpaths.SWITCH] = "off"
    fastpaths.reset()
    try:
        yield {fastpaths.SWITCH: "off"}
    finally:
        if saved is None:
            os.environ.pop(fastpaths.SWITCH, None)
        else:
            os.environ[fastpaths.SWITCH] = saved
        fastpaths.reset()


@contextlib.contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """``values`` in this process's environment (None: unset) and its settings read anew,
    until the block ends; then as before."""
    from orchestration.settings import get_settings

    saved = {k: os.environ.get(k) for k in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    get_settings.cache_clear()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        get_settings.cache_clear()


def finish_run(run_id: str, status: str = "approved", usage: dict[str, Any] | None = None) -> None:
    """Finish an open run by the transition a worker's coordinator makes (for tests that
    run no worker); ``usage`` is what its calls cost."""
    from orchestration.client.handles import store
    from orchestration.state.events import event_json

    st = store()
    record, _ = st.load_run(run_id)
    made = st.record_finish(
        record,
        int(record.get("seq", 0)),
        status,
        reason=None,
        error=None,
        usage=usage or {"input_tokens": 1, "output_tokens": 1, "calls": 1, "usd": 0.0},
        events=[event_json("run.finished", run_id, status=status)],
    )
    assert made == 1, f"run {run_id} was not open"


@contextlib.contextmanager
def collecting(batch: Any, out: Path, run_index: list[int]) -> Iterator[tuple[Any, Any]]:
    """``duet run``'s collector writing ``batch``'s records to ``out`` in a thread: yields
    ``(thread, results file)``; on the way out the thread is stopped and the file ended."""
    import threading

    from duet.commands.results import ResultsFile, collect

    sink = ResultsFile(out)
    stop = threading.Event()
    worker = threading.Thread(target=collect, args=(batch, sink, run_index, None, stop))
    worker.start()
    try:
        yield worker, sink
    finally:
        stop.set()
        worker.join(timeout=10)
        sink.finish()


@contextlib.contextmanager
def client_pointed_at(redis_url: str, broker_url: str | None = None) -> Iterator[str]:
    """Point this process's client API (settings, Redis pool, producer) at ``redis_url``,
    and back to nothing afterwards."""
    from orchestration.state import connection

    with environment({"DUET_REDIS_URL": redis_url, "DUET_BROKER_URL": broker_url or None}):
        connection.use_redis(redis_url)
        try:
            yield redis_url
        finally:
            connection.reset()


def stored_usage(redis_url: str, run_ids: list[str]) -> dict[str, int]:
    """The usage the stored step results of ``run_ids`` account for: ``calls`` (one per
    step that called the model, whatever its outcome), ``input_tokens``, ``output_tokens``."""
    import json

    import redis

    from orchestration.state import keys

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    fields = ("calls", "input_tokens", "output_tokens")
    try:
        pipe = client.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hvals(keys.run_steps(run_id))
        steps = [json.loads(raw) for found in pipe.execute() for raw in found]
        return {f: sum(int(step.get(f, 0)) for step in steps) for f in fields}
    finally:
        client.close()


def stored_calls(redis_url: str, run_ids: list[str]) -> int:
    """Model calls the stored step results of ``run_ids`` account for."""
    return stored_usage(redis_url, run_ids)["calls"]


def swept_runs(logs: list[str]) -> int:
    """Runs the periodic sweep sent on, from the workers' logs (its WARNING lines)."""
    import re

    return sum(int(n) for log in logs for n in re.findall(r"sweep: (\d+) runs had stopped", log))


#: The login :func:`flower` starts Flower with.
FLOWER_LOGIN = "ops:flower-login-7q"


def flower_get(port: int, path: str) -> tuple[int, bytes]:
    """Flower's answer to ``GET path`` (status, body), logged in; (0, b"") unreachable."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    token = base64.b64encode(FLOWER_LOGIN.encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def start_flower(env: Mapping[str, str], out: Any = subprocess.DEVNULL) -> tuple[Any, int]:
    """``celery -A workers flower`` on a free loopback port with ``env``, its output to
    ``out``: the process and the port (the caller waits for it and ends it)."""
    from duet.embedded.server import free_port

    port = free_port()
    proc = subprocess.Popen(
        [*CELERY, "flower", f"--port={port}", "--address=127.0.0.1"],
        cwd=ROOT,
        env=dict(env),
        stdout=out,
        stderr=subprocess.STDOUT if out is not subprocess.DEVNULL else subprocess.DEVNULL,
    )
    return proc, port


@contextlib.contextmanager
def flower(url: str, log_path: Path) -> Iterator[int]:
    """``celery -A workers flower`` on ``url`` (as deploy/compose.yaml starts it), its port."""

    env = {**os.environ, "DUET_REDIS_URL": url, "FLOWER_BASIC_AUTH": FLOWER_LOGIN}
    env.pop("DUET_BROKER_URL", None)
    with open(log_path, "wb") as log:
        proc, port = start_flower(env, log)
    try:
        wait_for(
            lambda: proc.poll() is not None or flower_get(port, "/healthcheck")[0] == 200,
            30,
            "Flower to answer",
        )
        assert proc.poll() is None, log_path.read_text(errors="replace")[-2000:]
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def assert_flower_shows_empty_queues(
    lengths: tuple[int, bytes], broker_page: tuple[int, bytes]
) -> None:
    """Flower's ``/api/queues/length`` and ``/broker`` answers (:func:`flower_get`) show
    Duet's three queues, empty."""
    import json

    status, body = lengths
    assert status == 200, body[:500]
    queues = {q["name"]: q["messages"] for q in json.loads(body)["active_queues"]}
    assert queues == {"actor": 0, "critic": 0, "coordinator": 0, "tools": 0}, queues
    status, page = broker_page
    assert status == 200, page[-1000:]
    assert b"<td>coordinator</td>" in page


def duet_cli(
    url: str, *args: str, check: bool = False, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m duet *args`` given ``DUET_REDIS_URL=url`` (and ``env``, wide columns),
    its output captured; ``check``: a non-zero exit raises."""
    return subprocess.run(
        [sys.executable, "-m", "duet", *args],
        cwd=ROOT,
        env={**os.environ, "DUET_REDIS_URL": url, "COLUMNS": "500", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


@contextlib.contextmanager
def tools_worker(
    redis_url: str, name: str, tool_log: str, stand_in: Any = None, **env: str
) -> Iterator[str]:
    """``redis_url`` emptied, one worker on it that knows the test toolset (its calls
    logged to ``tool_log``) and, given a stand-in, reaches it as both vendors; the client
    pointed at it."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
    vendors = {}
    if stand_in is not None:
        vendors = {
            "OPENAI_API_KEY": f"sk-test-{name}",
            "OPENAI_BASE_URL": stand_in.url,
            "ANTHROPIC_API_KEY": f"ant-test-{name}",
            "ANTHROPIC_BASE_URL": stand_in.anthropic_url,
        }
    env = {
        "DUET_TOOL_MODULES": "tests.toolsets.sample",
        "DUET_TEST_TOOL_LOG": tool_log,
        **vendors,
        **env,
    }
    with celery_worker(redis_url, env=env, name=name), client_pointed_at(redis_url):
        yield redis_url


#: ``duet`` commands that take a subcommand (``duet limits show``).
DUET_GROUPS = ("limits", "budget", "cache", "dead")


def duet_signature(argv: list[str]) -> tuple[str, ...]:
    """What a ``duet`` command line does, without its ids and paths: the command (and
    subcommand) and the options it gives (``results 88ead305 --status x`` -> ``results
    --status``)."""
    head = argv[:2] if argv and argv[0] in DUET_GROUPS else argv[:1]
    return (*head, *sorted({a.split("=")[0] for a in argv[len(head) :] if a.startswith("-")}))


def doc_commands(document: Path, section: str) -> list[tuple[str, ...]]:
    """The signatures (:func:`duet_signature`) of the ``duet`` lines in the bash blocks of
    ``section`` (a ``## `` heading) of a docs page, in order."""
    import re
    import shlex

    text = document.read_text(encoding="utf-8")
    part = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```$", part, flags=re.S | re.M)
    return [
        duet_signature(shlex.split(line)[1:])
        for block in blocks
        for line in block.splitlines()
        if line.startswith("duet ")
    ]


def stand_in_batch(
    tmp_path: Path, base_url: str, *, price: tuple[float, float], max_usd: float, n: int = 8
) -> tuple[Path, Path]:
    """A config on the stand-in server (a critic that never approves, 2 rounds: 5 calls a
    run; ``price`` per million input and output tokens, a batch budget of ``max_usd``)
    and ``n`` inputs; their paths."""
    agent = f'base_url = "{base_url}"\nprice = {{ input_per_mtok = {price[0]}, output_per_mtok = {price[1]} }}'
    config = tmp_path / "stand-in.toml"
    config.write_text(
        f'[actor]\ninstructions = "Fix the code."\nmodel = "openai:sim"\n{agent}\n\n'
        f'[critic]\ninstructions = "Find security bugs."\n'
        f'model = "openai:sim:critic?scores=0.1"\n{agent}\n\n'
        f"[loop]\nmax_rounds = 2\n\n[budget]\nmax_usd = {max_usd}\n"
    )
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(
        "".join(json.dumps({"id": f"s{i}", "prompt": f"os.system(x{i})"}) + "\n" for i in range(n))
    )
    return config, inputs


#: Debian's headless-capable Chromium (CI installs it; the browser tests skip without it).
CHROMIUM = "/usr/bin/chromium"


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on a 1280x2000 window, its profile under ``tmp``."""
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp / 'profile'}",
            "--window-size=1280,2000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def peak_in_flight(run_ids: list[str]) -> int:
    """Most of ``run_ids`` started and not finished at one moment, from their
    ``run.started`` / ``run.finished`` events (the client pointed at their Redis)."""
    from orchestration.client.handles import RunHandle
    from orchestration.core import events as ev

    edges = []
    for run_id in run_ids:
        events = list(RunHandle(run_id).events(follow=False))
        edges.append((min(e.ts for e in events if e.type == ev.RUN_STARTED), 1))
        edges.append((max(e.ts for e in events if e.type == ev.RUN_FINISHED), -1))
    peak = now = 0
    for _, step in sorted(edges):
        now += step
        peak = max(peak, now)
    return peak


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


#: The options that have a redis-server present the certificates of
#: :func:`make_certificates` and require a client certificate signed by its CA.
TLS_SERVER_OPTIONS = (
    "--tls-cert-file",
    "server.crt",
    "--tls-key-file",
    "server.key",
    "--tls-ca-cert-file",
    "ca.crt",
    "--tls-auth-clients",
    "yes",
)


def make_ca(directory: Path, name: str = "ca") -> Path:
    """A self-signed CA good for a day in ``directory`` (``{name}.crt`` / ``.key``, named
    ``duet-test-{name}``); its certificate."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        "-days",
        "1",
        "-subj",
        f"/CN=duet-test-{name}",
        cwd=directory,
    )
    return directory / f"{name}.crt"


def make_certificates(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, signed by it, in
    ``directory`` (``ca.crt``, ``server.crt`` / ``.key``, ``client.crt`` / ``.key``)."""
    make_ca(directory)
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, extra in (("server", ["-extfile", "san.cnf"]), ("client", [])):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN=duet-test-{name}",
            cwd=directory,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "1",
            *extra,
            cwd=directory,
        )
