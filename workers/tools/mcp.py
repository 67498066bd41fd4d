"""MCP servers as tool sources: list a server's tools, call one, from synchronous code.

A server is reached over streamable HTTP (``url``, with a bearer key read from the
worker's environment variable ``key_env``: the spec holds the name, never the key) or as
a local command over stdio (``command``; the SDK gives it a minimal environment, not the
worker's). Each worker process holds one session per server open, on an event loop of its
own in a background thread, and the worker's threads call through it: a stdio server is
started once, not once a call. A held session that has not answered for a second is pinged
before the next call; if it does not answer it is closed and a new one opened, so a server
that restarted between calls costs nothing. Anything that goes wrong — the server down, a timeout, a tool
that reports an error — is a :class:`ToolError` with a short message, cleaned of the key;
a session a call failed on (other than by the tool's own error) is closed, never reused.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import anyio
import httpx2

from workers import secrets

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup
from workers.providers.sdk import install_hint
from workers.tools.errors import ToolError

if TYPE_CHECKING:
    import mcp_types as types
    from mcp import ClientSession

T = TypeVar("T")

#: Pages of tools/list read before giving up on a server that never stops paginating.
MAX_PAGES = 50
#: What an HTTP refusal most likely means, added to its message.
_HINTS = {401: ": a missing or wrong key", 403: ": the key may not use this server"}
#: Seconds after an answer in which a held session is trusted without a ping (so a burst
#: of calls from many threads does not queue behind one ping each).
FRESH_S = 1.0
#: Seconds a held session has to answer a ping before a call, else a new one is opened.
PING_TIMEOUT_S = 5.0
#: Seconds past a call's own limit the calling thread waits for the session loop.
GRACE_S = 5.0
#: Seconds the process waits at exit for its stdio servers to stop.
CLOSE_TIMEOUT_S = 5.0
#: The longest message of a failure kept in a ToolError.
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class McpServer:
    """One MCP server: ``url`` (streamable HTTP) with an optional ``key_env``, or ``command``.

    Attributes:
        url: the server's streamable HTTP endpoint (``https://host/mcp``).
        key_env: the worker environment variable holding the bearer key for ``url``.
        command: the program and arguments of a local server spoken to over stdio.
    """

    url: str | None = None
    key_env: str | None = None
    command: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.command is not None:
            object.__setattr__(self, "command", tuple(self.command))
        if (self.url is None) == (self.command is None):
            raise ToolError("an MCP server needs exactly one of url and command")
        if self.url is not None and urlsplit(self.url).scheme not in ("http", "https"):
            raise ToolError(f"MCP server url must be http(s)://, not {self.url[:80]!r}")
        if self.command is not None and not (self.command and all(self.command)):
            raise ToolError("an MCP server's command must name a program")
        if self.key_env is not None and self.url is None:
            raise ToolError("key_env is for an MCP server reached by url")

    @property
    def label(self) -> str:
        """How messages name the server: its URL without query, or its program."""
        if self.url is not None:
            parts = urlsplit(self.url)
            return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
        assert self.command is not None
        return os.path.basename(self.command[0])


def list_tools(server: McpServer, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The server's tools: each ``{"name", "description", "inputSchema"}``."""

    _require_sdk()
    import mcp_types as types

    async def listing(session: ClientSession) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
            tools += [
                {
                    "name": tool.name,
                    "description": tool.description or "",
                    "inputSchema": tool.input_schema,
                }
                for tool in page.tools
            ]
            cursor = page.next_cursor
            if not cursor:
                return tools
        raise ToolError(f"MCP server {server.label}: more than {MAX_PAGES} pages of tools")

    return _run(server, "list tools", listing, timeout_s)


def call_tool(
    server: McpServer, name: str, arguments: Mapping[str, Any], timeout_s: float = 60.0
) -> str:
    """Call tool ``name``; its text content joined, or a :class:`ToolError` it reported."""

    async def calling(session: ClientSession) -> str:
        result = await session.call_tool(name, dict(arguments), read_timeout_seconds=timeout_s)
        text = _text(result)
        if result.is_error:
            raise ToolError(f"{name}: {text or 'the tool reported an error'}"[:MAX_ERROR_CHARS])
        return text

    return _run(server, f"call {name}", calling, timeout_s)


def _text(result: types.CallToolResult) -> str:
    """The text blocks of a result, joined; other blocks named; structured content as JSON."""
    import mcp_types as types

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, sort_keys=True))
    return "\n".join(parts)


def _run(
    server: McpServer,
    doing: str,
    work: Callable[[ClientSession], Awaitable[T]],
    timeout_s: float,
) -> T:
    """Do ``work`` on the process's session with ``server``, within ``timeout_s``."""
    _require_sdk()
    key = _key(server)
    statuses: list[int] = []
    held = _held_sessions()
    future = asyncio.run_coroutine_threadsafe(
        held.use(server, key, work, timeout_s, statuses), held.loop
    )
    try:
        return future.result(timeout_s + GRACE_S)
    except Exception as e:  # the SDK's and the transport's errors, often grouped
        future.cancel()
        leaf = _leaf(e)
        if isinstance(leaf, ToolError):
            message = str(leaf)
        elif isinstance(leaf, (TimeoutError, concurrent.futures.TimeoutError)):
            message = f"MCP server {server.label}: {doing} took longer than {timeout_s:g} s"
        else:
            message = f"MCP server {server.label}: cannot {doing}: {_reason(leaf)}"
            # The SDK reports an HTTP refusal as a generic error; the status says more.
            if refused := [s for s in statuses if s >= 400]:
                message += f" (HTTP {refused[-1]}{_HINTS.get(refused[-1], '')})"
        raise ToolError(_clean(message, key)) from None


@dataclass
class _Held:
    """One open session and the task that owns its transport (it ends when that dies)."""

    session: ClientSession
    owner: asyncio.Task[None]
    closing: asyncio.Event
    #: When the server last answered on it (loop time): a session that answered within
    #: :data:`FRESH_S` is used without a ping.
    answered: float = 0.0

    def close(self) -> None:
        self.closing.set()


@dataclass
class _Sessions:
    """The sessions one worker process holds, by server and key, on a loop of their own."""

    pid: int = field(default_factory=os.getpid)
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    held: dict[tuple[McpServer, str | None], _Held] = field(default_factory=dict)
    opening: dict[tuple[McpServer, str | None], asyncio.Lock] = field(default_factory=dict)

    def __post_init__(self) -> None:
        threading.Thread(target=self.loop.run_forever, name="duet-mcp", daemon=True).start()

    async def use(
        self,
        server: McpServer,
        key: str | None,
        work: Callable[[ClientSession], Awaitable[T]],
        timeout_s: float,
        statuses: list[int],
    ) -> T:
        with anyio.fail_after(timeout_s):
            held = await self._session(server, key, statuses)
            try:
                done = await work(held.session)
            except ToolError:  # the tool's own error: the session is fine
                held.answered = self.loop.time()
                raise
            except BaseException:
                # A transport error, a timeout or a cancelled call: never reuse the session
                # (closing a stdio one also stops a tool still running in it).
                self._drop(server, key, held)
                raise
            held.answered = self.loop.time()
            return done

    async def _session(self, server: McpServer, key: str | None, statuses: list[int]) -> _Held:
        lock = self.opening.setdefault((server, key), asyncio.Lock())
        async with lock:
            held = self.held.get((server, key))
            if held is not None and not held.owner.done():
                if self.loop.time() - held.answered < FRESH_S:
                    return held
                try:
                    with anyio.fail_after(PING_TIMEOUT_S):
                        await held.session.send_ping()
                    held.answered = self.loop.time()
                    return held
                except Exception:  # gone since its last call: open another
                    pass
            if held is not None:
                self._drop(server, key, held)
            held = await self._open(server, key, statuses)
            held.answered = self.loop.time()
            self.held[(server, key)] = held
            return held

    async def _open(self, server: McpServer, key: str | None, statuses: list[int]) -> _Held:
        ready: asyncio.Future[ClientSession] = self.loop.create_future()
        closing = asyncio.Event()

        async def own() -> None:
            # The transport's task groups are entered and left in this one task, as anyio
            # requires; calls from other tasks go through the session's streams.
            try:
                async with _session(server, key, statuses) as session:
                    await session.initialize()
                    ready.set_result(session)
                    await closing.wait()
            except BaseException as e:  # noqa: BLE001 - reported to the opener, or the end
                if not ready.done():
                    ready.set_exception(e if isinstance(e, Exception) else RuntimeError(str(e)))

        owner = self.loop.create_task(own())
        try:
            session = await ready
        except BaseException:
            owner.cancel()
            raise
        return _Held(session, owner, closing)

    def _drop(self, server: McpServer, key: str | None, held: _Held) -> None:
        held.close()
        if self.held.get((server, key)) is held:
            del self.held[(server, key)]

    async def close_all(self) -> None:
        """Close every session (a stdio server stops with its session)."""
        owners = [held.owner for held in self.held.values()]
        for held in self.held.values():
            held.close()
        self.held.clear()
        if owners:
            await asyncio.wait(owners, timeout=CLOSE_TIMEOUT_S)


_sessions: _Sessions | None = None
_sessions_lock = threading.Lock()


def _held_sessions() -> _Sessions:
    """This process's sessions (a forked child starts its own: the loop thread stays behind)."""
    global _sessions
    with _sessions_lock:
        if _sessions is None or _sessions.pid != os.getpid():
            _sessions = _Sessions()
        return _sessions


@atexit.register
def _close_at_exit() -> None:
    held = _sessions
    if held is None or held.pid != os.getpid() or not held.held:
        return
    future = asyncio.run_coroutine_threadsafe(held.close_all(), held.loop)
    # At exit a server that will not stop is left to the end of its stdin.
    with contextlib.suppress(Exception):
        future.result(CLOSE_TIMEOUT_S + 1)


def _require_sdk() -> None:
    """The SDK comes with the ``mcp`` extra; a worker without it says so on the first call."""
    try:
        import mcp  # noqa: F401
    except ImportError as e:
        raise ToolError(
            "MCP servers need the mcp SDK on this worker: " + install_hint("mcp")
        ) from e


def _key(server: McpServer) -> str | None:
    if server.key_env is None:
        return None
    key = os.environ.get(server.key_env)
    if not key:
        raise ToolError(
            f"MCP server {server.label}: the key variable {server.key_env} is not set on this worker"
        )
    return key


@asynccontextmanager
async def _session(
    server: McpServer, key: str | None, statuses: list[int]
) -> AsyncIterator[ClientSession]:
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client

    if server.command is not None:
        params = StdioServerParameters(command=server.command[0], args=list(server.command[1:]))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            yield session
        return
    assert server.url is not None
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def seen(response: httpx2.Response) -> None:
        statuses.append(response.status_code)

    async with (
        httpx2.AsyncClient(headers=headers, event_hooks={"response": [seen]}) as http,
        streamable_http_client(server.url, http_client=http) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        yield session


def _leaf(error: BaseException) -> BaseException:
    """The first innermost error of ``error`` (anyio wraps failures in exception groups)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _reason(error: BaseException) -> str:
    text = str(error).strip()
    name = type(error).__name__
    return text if text and name in text else f"{name}: {text}" if text else name


def _clean(text: str, key: str | None) -> str:
    """``text`` without the key, or any other secret the worker knows, and short."""
    if key:
        text = text.replace(key, "[REDACTED]")
    return secrets.redact(text)[:MAX_ERROR_CHARS]


__all__: Sequence[str] = ("McpServer", "call_tool", "list_tools")
