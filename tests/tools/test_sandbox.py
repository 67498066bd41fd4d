"""run_command: configured commands on a copy of the tree, with no network, no keys, limits.

The containment tests each have a twin with ``sandbox = "none"`` that shows the same
command *does* reach the network or the file outside when nothing contains it, so the
sandbox test fails if the sandbox is taken away.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability import MODEL_OUTPUT, Reliability, lost_of
from tests.tools.conftest import SECRET, Repo, git
from workers.tools import registry, sandbox
from workers.tools.commands import run_command
from workers.tools.context import ToolContext
from workers.tools.errors import ToolError
from workers.tools.workspace import checkout


@pytest.fixture(autouse=True)
def _bubblewrap() -> None:
    why = sandbox.unavailable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must have a working bubblewrap: {why}")
        pytest.skip(why)


def python(code: str) -> list[str]:
    return ["python", "-c", code]


def context(root: Path, kind: str = "bwrap", **commands: list[str]) -> ToolContext:
    return ToolContext(
        root=root,
        run_id="r",
        call_id="c",
        options={"commands": commands, "sandbox": kind, "limits": {"timeout_s": 60}},
    )


def test_run_command_is_registered_with_effects() -> None:
    found = registry.get("run_command")
    assert found is not None and found.spec.pure is False
    assert sorted(found.spec.parameters["properties"]) == ["name"]


def test_the_tests_of_the_tree_run_with_the_workers_python(repo: Repo, tmp_path: Path) -> None:
    (repo.path / "test_calc.py").write_text(
        "from pkg.calc import add\n\n"
        "def test_add():\n    assert add(2, 2) == 4\n\n"
        "def test_wrong():\n    assert add(2, 2) == 5\n"
    )
    git(repo.path, "add", "test_calc.py")
    git(repo.path, "commit", "--quiet", "-m", "Tests")
    root = checkout(str(repo.path), "HEAD", tmp_path / "cache")
    ctx = context(root, tests=["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"])
    result = run_command(ctx, "tests")
    assert result.startswith("tests: exit code 1\n")
    assert "1 failed, 1 passed" in result and "test_calc.py::test_wrong" in result


def test_the_command_writes_to_a_copy_that_is_thrown_away(tree: Path) -> None:
    write = python("open('README.md', 'w').write('changed'); open('new.txt', 'w').write('x')")
    look = python("import os; print(open('README.md').read()[:11], os.path.exists('new.txt'))")
    ctx = context(tree, write=write, look=look)
    assert run_command(ctx, "write") == "write: exit code 0\n"
    assert run_command(ctx, "look") == "look: exit code 0\nversion two False\n"
    assert (tree / "README.md").read_text().startswith("version two")


@pytest.fixture
def listener() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback port the test listens on, and the connections it accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()
    for conn in accepted:
        conn.close()


CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print('refused:', e)\n"
)


@pytest.mark.parametrize(("kind", "reached"), [("bwrap", False), ("none", True)])
def test_the_sandbox_has_no_network(
    tree: Path, listener: tuple[int, list[socket.socket]], kind: str, reached: bool
) -> None:
    port, accepted = listener
    ctx = context(tree, kind, connect=["python", "-c", CONNECT, str(port)])
    result = run_command(ctx, "connect")
    assert ("connected" in result.splitlines()) is reached, result
    if not reached:
        assert "refused:" in result
        assert accepted == []


@pytest.mark.parametrize("kind", ["bwrap", "none"])
def test_no_variable_of_the_worker_reaches_the_command(
    tree: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-openai-key-123456")
    monkeypatch.setenv("DEPLOY_TOKEN", "deploy-token-secret-987654")
    ctx = context(tree, kind, env=python("import os; print(sorted(os.environ.items()))"))
    result = run_command(ctx, "env")
    assert "secret" not in result and "OPENAI_API_KEY" not in result
    assert "DEPLOY_TOKEN" not in result and "'HOME'" in result


@pytest.mark.parametrize(("kind", "seen"), [("bwrap", False), ("none", True)])
def test_files_outside_the_tree_are_not_there(
    tree: Path, repo: Repo, kind: str, seen: bool
) -> None:
    read = python(
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n        print(open(path).read())\n"
        "    except OSError as e:\n        print(type(e).__name__)\n"
    )
    ctx = context(tree, kind, read=[*read, "leak", str(repo.secret)])
    result = run_command(ctx, "read")
    assert (SECRET in result) is seen, result


def test_output_over_the_cap_is_cut_from_the_middle(tree: Path) -> None:
    ctx = ToolContext(
        root=tree,
        run_id="r",
        call_id="c",
        options={
            "commands": {"loud": python("print('HEAD' + 'x' * 200000 + 'TAIL')")},
            "limits": {"output_bytes": 1000},
        },
    )
    result = run_command(ctx, "loud")
    head, _, output = result.partition("\n")
    assert head.startswith("loud: exit code 0 (output cut: ")
    assert output.startswith("HEAD") and output.rstrip().endswith("TAIL")
    assert len(output) < 1100


def _running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("kind", ["bwrap", "none"])
def test_a_command_over_the_time_limit_is_killed_with_its_children(tree: Path, kind: str) -> None:
    marker = f"sleeper-{os.getpid()}-{kind}"
    sleeper = ["sh", "-c", f"sleep 300 & sleep 301; : {marker}", marker]
    ctx = ToolContext(
        root=tree,
        run_id="r",
        call_id="c",
        options={"commands": {"slow": sleeper}, "sandbox": kind, "limits": {"timeout_s": 2}},
    )
    assert run_command(ctx, "slow").startswith("slow: killed after the time limit of 2 s")
    assert _running(marker) == []


def test_memory_over_the_limit_fails_the_command(tree: Path) -> None:
    ctx = ToolContext(
        root=tree,
        run_id="r",
        call_id="c",
        options={
            "commands": {"hog": python("b = bytearray(2 << 30); print('allocated')")},
            "limits": {"memory_mb": 512},
        },
    )
    result = run_command(ctx, "hog")
    assert result.startswith("hog: exit code 1") and "MemoryError" in result


def test_the_model_names_a_command_it_cannot_write_one(tree: Path) -> None:
    ctx = context(tree, tests=python("print('ok')"))
    with pytest.raises(ToolError, match=r"no command 'tests; rm -rf /'; configured: \['tests'\]"):
        run_command(ctx, "tests; rm -rf /")
    with pytest.raises(ToolError, match="no commands are configured"):
        run_command(ToolContext(root=tree, run_id="r", call_id="c"), "tests")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"commands": {"t": "pytest -q"}}, "must be a non-empty list of strings"),
        ({"commands": {"t": ["true"]}, "sandbox": "docker"}, "sandbox must be one of"),
        ({"commands": {"t": ["true"]}, "limits": {"ram": 1}}, "unknown limits"),
        ({"commands": {"t": ["true"]}, "limits": {"timeout_s": -1}}, "positive number"),
        ({"commands": {"t": ["true"]}, "limits": {"timeout_s": 3600}}, "at most 840"),
        ({"commands": {"t": ["no-such-program-here"]}}, "No such file or directory"),
    ],
)
def test_bad_options_are_clear_errors(tree: Path, options: dict[str, object], message: str) -> None:
    ctx = ToolContext(root=tree, run_id="r", call_id="c", options=options)
    try:
        result = run_command(ctx, "t")
    except ToolError as e:
        result = str(e)
    assert message in result


def test_without_a_sandbox_commands_are_refused_unless_none_is_said(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "unavailable", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(ToolError, match='no sandbox: bubblewrap .* set sandbox = "none"'):
        run_command(context(tree, tests=python("print('ran')")), "tests")
    assert run_command(context(tree, "none", tests=python("print('ran')")), "tests") == (
        "tests: exit code 0\nran\n"
    )
    assert sys.executable  # the worker's Python is what "python" finds in both


@pytest.mark.parametrize(("kind", "contained"), [("bwrap", True), ("none", False)])
def test_the_command_has_no_capabilities_and_little_of_etc(
    tree: Path, kind: str, contained: bool
) -> None:
    look = python(
        "import os\n"
        "caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]\n"
        "print('caps', int(caps, 16), 'shadow', os.path.exists('/etc/shadow'))\n"
    )
    result = run_command(context(tree, kind, look=look), "look")
    if contained:
        assert result.endswith("caps 0 shadow False\n"), result
    else:
        assert "shadow True" in result


def test_hostile_commands_are_contained(
    tree: Path,
    repo: Repo,
    listener: tuple[int, list[socket.socket]],
    monkeypatch: pytest.MonkeyPatch,
    reliability: Reliability,
) -> None:
    port, accepted = listener
    monkeypatch.setenv("OPENAI_API_KEY", "sk-hostile-test-key-0123456789")
    marker = f"hostile-sleeper-{os.getpid()}"
    read = "import sys\nfor p in sys.argv[1:]:\n    try: print(open(p).read())\n    except OSError: pass\n"
    commands = {
        "connect": ["python", "-c", CONNECT, str(port)],
        "env": python("import os; print(os.environ.get('OPENAI_API_KEY'))"),
        "read": ["python", "-c", read, "leak", str(repo.secret), "/etc/shadow"],
        "linger": ["sh", "-c", f"sleep 300 & sleep 301; : {marker}", marker],
    }
    ctx = ToolContext(
        root=tree,
        run_id="r",
        call_id="c",
        options={"commands": commands, "limits": {"timeout_s": 5}},
    )
    results = {name: run_command(ctx, name) for name in commands}
    escaped = [
        name
        for name, got in [
            ("connect", "connected" in results["connect"].splitlines() or bool(accepted)),
            ("env", "sk-hostile-test-key" in results["env"]),
            ("read", SECRET in results["read"] or "root:" in results["read"]),
            ("linger", bool(_running(marker))),
        ]
        if got
    ]
    reliability.record(
        section=MODEL_OUTPUT,
        fault="a configured command (the reviewed code's tests) tries the network, reads the "
        "worker's API key and files outside the tree, and outlives its time limit",
        load=f"{len(commands)} hostile commands under bubblewrap",
        lost=lost_of(len(escaped), len(commands), "commands got out"),
    )
    assert escaped == []


def test_the_private_tmp_is_capped(tree: Path) -> None:
    fill = python(
        "try:\n"
        "    with open('/tmp/fill', 'wb') as f:\n"
        "        for _ in range(64):\n            f.write(b'x' * (1 << 20))\n"
        "    print('wrote 64 MiB')\n"
        "except OSError as e:\n    print('refused:', e.strerror)\n"
    )
    ctx = ToolContext(
        root=tree,
        run_id="r",
        call_id="c",
        options={"commands": {"fill": fill}, "limits": {"tmp_mb": 16}},
    )
    assert run_command(ctx, "fill") == "fill: exit code 0\nrefused: No space left on device\n"
