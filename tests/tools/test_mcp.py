"""The MCP client against the SDK's own server, over streamable HTTP and stdio."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.tools import mcp as mcp_client
from workers.tools.errors import ToolError
from workers.tools.mcp import McpServer, call_tool, list_tools

ROOT = Path(__file__).resolve().parents[2]
KEY = "mcp-test-bearer-key-5f2c9a"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(*args: str) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.tools.mcp_server", "http", str(port), *args], cwd=ROOT
    )
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the MCP test server did not start") from None
                time.sleep(0.05)  # polling for the port to open, not hiding a race
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        # uvicorn waits for requests in flight (a slow tool's) before it stops: no waiting here.
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    yield from _serve()


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    yield from _serve(KEY)


STDIO = McpServer(
    command=(sys.executable, str(ROOT / "tests" / "tools" / "mcp_server.py"), "stdio")
)


@pytest.fixture(params=["http", "stdio"])
def server(request: pytest.FixtureRequest) -> McpServer:
    if request.param == "stdio":
        return STDIO
    return McpServer(url=request.getfixturevalue("http_url"))


def test_list_tools_gives_names_descriptions_and_schemas(server: McpServer) -> None:
    tools = {tool["name"]: tool for tool in list_tools(server)}
    assert sorted(tools) == ["add", "broken", "echo", "pid", "slow"]
    assert tools["add"]["description"] == "Add two integers."
    schema = tools["add"]["inputSchema"]
    assert schema["type"] == "object" and sorted(schema["properties"]) == ["a", "b"]
    assert sorted(schema["required"]) == ["a", "b"]


def test_call_tool_returns_the_text(server: McpServer) -> None:
    assert call_tool(server, "add", {"a": 2, "b": 40}, timeout_s=30) == "42"
    assert call_tool(server, "echo", {"text": "ünïcode"}, timeout_s=30) == "ünïcode"


def test_a_tool_error_is_a_tool_error(server: McpServer) -> None:
    with pytest.raises(ToolError, match="broken: .*the tool broke on purpose"):
        call_tool(server, "broken", {}, timeout_s=30)
    with pytest.raises(ToolError, match="nope"):
        call_tool(server, "nope", {}, timeout_s=30)


def test_a_slow_tool_times_out(server: McpServer) -> None:
    with pytest.raises(ToolError, match="took longer than 1 s"):
        call_tool(server, "slow", {"seconds": 5}, timeout_s=1)


def test_the_bearer_key_is_read_from_the_workers_environment(
    keyed_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_MCP_KEY", KEY)
    keyed = McpServer(url=keyed_url, key_env="TEST_MCP_KEY")
    assert call_tool(keyed, "add", {"a": 1, "b": 1}, timeout_s=30) == "2"
    # Without the key, or with a wrong one, the server refuses: a clear error, no key in it.
    with pytest.raises(ToolError, match="401") as refused:
        list_tools(McpServer(url=keyed_url), timeout_s=30)
    assert KEY not in str(refused.value)
    monkeypatch.setenv("TEST_MCP_KEY", "wrong-key-value-123456")
    with pytest.raises(ToolError, match="401") as refused:
        list_tools(keyed, timeout_s=30)
    assert "wrong-key-value-123456" not in str(refused.value)


def test_an_unset_key_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_MCP_KEY", raising=False)
    server = McpServer(url="http://127.0.0.1:1/mcp", key_env="TEST_MCP_KEY")
    with pytest.raises(ToolError, match="key variable TEST_MCP_KEY is not set"):
        list_tools(server)


def test_a_server_that_is_down_is_a_clear_tool_error() -> None:
    down = McpServer(url=f"http://127.0.0.1:{_free_port()}/mcp")
    with pytest.raises(
        ToolError, match=r"MCP server http://127\.0\.0\.1:\d+/mcp: cannot list tools"
    ):
        list_tools(down, timeout_s=20)
    with pytest.raises(ToolError, match="MCP server no-such-mcp-server: cannot call add"):
        call_tool(McpServer(command=("no-such-mcp-server",)), "add", {}, timeout_s=20)
    with pytest.raises(ToolError, match="MCP server false: cannot list tools"):
        list_tools(McpServer(command=("false",)), timeout_s=20)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of url and command"),
        ({"url": "http://x/mcp", "command": ("x",)}, "exactly one of url and command"),
        ({"url": "file:///etc/passwd"}, "must be http"),
        ({"command": ()}, "must name a program"),
        ({"command": ("srv",), "key_env": "K"}, "key_env is for"),
    ],
)
def test_a_bad_server_description_is_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ToolError, match=message):
        McpServer(**kwargs)  # type: ignore[arg-type]


def test_calls_from_worker_threads_at_once(server: McpServer) -> None:
    # The worker runs each tool call in a thread of its own pool: one event loop each.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        sums = list(pool.map(lambda n: call_tool(server, "add", {"a": n, "b": 1}, 60), range(4)))
    assert sums == ["1", "2", "3", "4"]


def _stdio(tmp_path: Path) -> McpServer:
    """A stdio server of this test's own (a distinct command: a session of its own)."""
    script = tmp_path / "server.py"
    script.write_text((ROOT / "tests" / "tools" / "mcp_server.py").read_text())
    return McpServer(command=(sys.executable, str(script), "stdio"))


def test_a_stdio_server_is_started_once_per_process(tmp_path: Path) -> None:
    server = _stdio(tmp_path)
    first = call_tool(server, "pid", {}, timeout_s=60)
    assert [call_tool(server, "pid", {}, timeout_s=60) for _ in range(3)] == [first] * 3
    assert call_tool(server, "add", {"a": 1, "b": 2}, timeout_s=60) == "3"


def test_a_server_gone_between_calls_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A session that answered less than FRESH_S ago is trusted without a ping: not here.
    monkeypatch.setattr(mcp_client, "FRESH_S", 0.0)
    server = _stdio(tmp_path)
    first = int(call_tool(server, "pid", {}, timeout_s=60))
    os.kill(first, signal.SIGKILL)
    # The held session no longer answers its ping: a new one is opened for the call.
    second = int(call_tool(server, "pid", {}, timeout_s=60))
    assert second != first


def test_a_session_a_call_timed_out_on_is_not_reused(tmp_path: Path) -> None:
    server = _stdio(tmp_path)
    first = call_tool(server, "pid", {}, timeout_s=60)
    with pytest.raises(ToolError, match="took longer than 1 s"):
        call_tool(server, "slow", {"seconds": 30}, timeout_s=1)
    assert call_tool(server, "pid", {}, timeout_s=60) != first
    # A tool's own error leaves the session as it was.
    now = call_tool(server, "pid", {}, timeout_s=60)
    with pytest.raises(ToolError, match="broke on purpose"):
        call_tool(server, "broken", {}, timeout_s=60)
    assert call_tool(server, "pid", {}, timeout_s=60) == now


def _call_in_child(server: McpServer, out: Any) -> None:
    out.put(call_tool(server, "add", {"a": 20, "b": 22}, timeout_s=60))


def test_a_forked_worker_opens_sessions_of_its_own(tmp_path: Path) -> None:
    server = _stdio(tmp_path)
    assert call_tool(server, "add", {"a": 1, "b": 1}, timeout_s=60) == "2"
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_call_in_child, args=(server, out))
    child.start()
    assert out.get(timeout=90) == "42"
    child.join(30)
    assert child.exitcode == 0


def test_a_worker_without_the_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # what an import of a missing package meets
    with pytest.raises(ToolError, match=r"pip install 'duet-review\[mcp\] @ git\+"):
        list_tools(STDIO)
    with pytest.raises(ToolError, match=r"pip install 'duet-review\[mcp\] @ git\+"):
        call_tool(STDIO, "add", {"a": 1, "b": 2})
