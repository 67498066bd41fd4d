"""Every way to start a worker refuses to without a cluster, with one message: ``duet
worker``, ``celery -A workers worker`` and the image's command. Celery's own default
broker is ``amqp://guest@localhost``: a worker that fell back to it declared queues in
whatever RabbitMQ answered there. Each runs in a network namespace of its own (``unshare
-n``: no interface but a loopback that is down), so a mistake reaches no broker."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support import ROOT
from workers.app import NO_CLUSTER

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]


def _isolated() -> list[str]:
    """The prefix that runs a command without network, or skip where it cannot."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run([unshare, "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -n is not allowed here: {probe.stderr.decode()[-200:]}")
    return [unshare, "-n"]


def _image_command() -> list[str]:
    """The worker command of deploy/Dockerfile (its ``CMD``, exec form)."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    found = re.search(r"^CMD (\[.*?\])\s*$", text.replace("\\\n", ""), re.M | re.S)
    assert found, "deploy/Dockerfile has no CMD in exec form"
    argv: list[str] = json.loads(found.group(1))
    assert argv[:4] == ["celery", "-A", "workers", "worker"]
    return [sys.executable, "-m", *argv]


COMMANDS = {
    "duet worker": [sys.executable, "-m", "duet", "worker"],
    "celery -A workers worker": [sys.executable, "-m", "celery", "-A", "workers", "worker"],
    "the image": None,
}


@pytest.mark.parametrize("entry", list(COMMANDS))
def test_a_worker_without_a_cluster_refuses_to_start(entry: str) -> None:
    argv = COMMANDS[entry] or _image_command()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUET_", "CELERY_", "AMQP"))}
    try:
        done = subprocess.run(
            [*_isolated(), *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,  # a worker that tries a broker keeps retrying: this fails it
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{entry} did not refuse: it kept running ({str(exc.stderr)[-1500:]})")
    assert done.returncode != 0, done.stderr[-1500:]
    assert f"error: {NO_CLUSTER}" in done.stderr, done.stderr[-1500:]
    assert "amqp://" not in done.stderr + done.stdout
