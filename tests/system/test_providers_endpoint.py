"""Calls after the first, posted straight on the SDK client's connection pool
(``workers.providers.endpoint``): what the SDK's HTTP client gave them, they keep.

A recording HTTP proxy between the adapters and the stand-in server shows what went out
(and on which connection): it is set in the environment, as the SDKs' clients read it,
and can compress a reply, answer with a redirect or close the connection after a reply
(saying so, or not).
"""

from __future__ import annotations

import gzip
import http.client
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest

from duet.standin.server import FakeLLM
from orchestration.core.errors import ProviderError
from orchestration.state import fastpaths
from tests.system import test_providers_http as base
from tests.system.test_providers_http import ANTHROPIC_KEY, OPENAI_KEY, PROVIDERS, agent, call
from workers.providers import provider_for
from workers.providers.endpoint import PER_REQUEST_HEADERS

llm = base.llm  # the stand-in server, the SDKs pointed at it (a fixture)
KEYS = {"openai": OPENAI_KEY, "anthropic": ANTHROPIC_KEY}


class Proxy(ThreadingHTTPServer):
    """A forward HTTP proxy noting each request (its target and headers)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.ports: list[int] = []  # the client's port of each request: its connection
        self.gzip = False  # compress the replies
        self.close = False  # close each connection after its reply
        self.hang_up = False  # close it after its reply without saying so (kept alive)
        self.closed = 0  # connections closed so far (on self.changed)
        self.changed = threading.Condition()
        self.redirects = 0  # answer this many requests with a 307 to the same URL
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        with self.changed:
            self.closed += 1
            self.changed.notify_all()

    def wait_closed(self, n: int) -> None:
        """Wait until ``n`` connections have been closed."""
        with self.changed:
            assert self.changed.wait_for(lambda: self.closed >= n, timeout=10), self.closed


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Proxy

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        self.server.ports.append(self.client_address[1])
        if self.server.redirects:
            self.server.redirects -= 1
            self.send_response(307)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        target = urlsplit(self.path)
        upstream = http.client.HTTPConnection(target.netloc, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-connection"}
        upstream.request("POST", target.path, body=body, headers=headers)
        reply = upstream.getresponse()
        data = reply.read()
        upstream.close()
        self.send_response(reply.status)
        for key, value in reply.getheaders():
            if key.lower() not in ("content-length", "connection", "date", "server"):
                self.send_header(key, value)
        if self.server.gzip:
            data = gzip.compress(data)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        if self.server.close:
            self.send_header("Connection", "close")
        if self.server.close or self.server.hang_up:
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def proxy(llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxy]:
    server = Proxy()
    for var in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    monkeypatch.setenv("http_proxy", server.url)
    yield server
    server.shutdown()
    server.server_close()


def _lean(provider: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Make the first call (through the SDK); the requests the SDK's client sends from
    then on (none if later calls go straight to its pool). Skips where the endpoint
    fast path is off (DUET_FAST_PATHS, or an untested httpx2)."""
    if not fastpaths.enabled("endpoint"):
        pytest.skip("the endpoint fast path is off here")
    assert call(agent(provider)).stop_reason == "end"
    adapter = provider_for(agent(provider).spec)
    assert adapter._endpoint is not None and adapter._endpoint.pool is not None
    sent: list[Any] = []
    send = httpx2.Client.send

    def counting(self: httpx2.Client, request: httpx2.Request, **kwargs: Any) -> Any:
        sent.append(request)
        return send(self, request, **kwargs)

    monkeypatch.setattr(httpx2.Client, "send", counting)
    return sent


@pytest.mark.parametrize("provider", PROVIDERS)
def test_later_calls_go_through_the_env_proxy_with_the_same_headers(
    proxy: Proxy, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _lean(provider, monkeypatch)
    for _ in range(2):
        assert call(agent(provider)).stop_reason == "end"
    assert sent == []  # not through the client
    assert len(proxy.seen) == 3  # the SDK's call and both later ones went via the proxy
    (first_url, first), *later = proxy.seen
    auth = first.get("x-api-key") or first["authorization"]
    assert KEYS[provider] in auth
    for url, headers in later:
        assert url == first_url
        assert auth in (headers.get("x-api-key"), headers.get("authorization"))
        # The first call's headers but those the SDK sets per request (its timeout and
        # retry count among them: a later call's may differ).
        per_request = {h.decode() for h in PER_REQUEST_HEADERS}
        assert "x-stainless-timeout" not in headers, "the first call's timeout sent again"
        assert {k: v for k, v in headers.items() if k != "content-length"} == {
            k: v for k, v in first.items() if k not in per_request
        }


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_compressed_reply_is_decoded(
    proxy: Proxy, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _lean(provider, monkeypatch)
    proxy.gzip = True
    assert call(agent(provider)).text.startswith("[revision 0] Answer to:")
    assert sent == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_redirect_is_followed_through_the_client(
    proxy: Proxy, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _lean(provider, monkeypatch)
    proxy.redirects = 2  # the call, and the client's sending it again
    assert call(agent(provider)).stop_reason == "end"
    assert len(sent) == 1  # sent again through the client, which followed the redirect
    assert len(proxy.seen) == 4  # the first call, the two redirected, the one followed


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_timeout_is_each_calls_own(
    llm: FakeLLM, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lean(provider, monkeypatch)
    llm.set_faults(delays_ms=[700, 700])
    assert call(agent(provider, timeout_s=5)).stop_reason == "end"
    with pytest.raises(ProviderError) as info:
        call(agent(provider, timeout_s=0.3))
    assert (info.value.kind, info.value.transient) == ("timeout", True)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_refused_connection_is_a_connection_error(
    llm: FakeLLM, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lean(provider, monkeypatch)
    llm.stop()
    with pytest.raises(ProviderError) as info:
        call(agent(provider))
    assert (info.value.kind, info.value.transient) == ("connection", True)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_each_thread_keeps_a_connection_of_its_own(
    proxy: Proxy, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _lean(provider, monkeypatch)
    ports: dict[str, list[int]] = {}
    barrier = threading.Barrier(2)

    def calls(name: str) -> None:
        for _ in range(3):
            barrier.wait(timeout=10)  # both threads' calls are in flight together
            before = len(proxy.ports)
            assert call(agent(provider)).stop_reason == "end"
            ports.setdefault(name, []).append(len(proxy.ports) - before)

    threads = [threading.Thread(target=calls, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sent == [] and len(proxy.ports) == 7  # the SDK's first call and 2 x 3 later
    later = proxy.ports[1:]
    assert len(set(later)) == 2, f"two threads, two connections: {later}"
    assert proxy.ports[0] not in later  # the SDK's client keeps its own


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_connection_the_server_closes_is_made_anew(
    proxy: Proxy, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _lean(provider, monkeypatch)
    proxy.close = True  # every reply closes its connection
    for _ in range(3):
        assert call(agent(provider)).stop_reason == "end"
    proxy.close = False
    for _ in range(2):
        assert call(agent(provider)).stop_reason == "end"
    assert sent == []
    later = proxy.ports[1:]
    assert len(later) == 5
    assert len(set(later[:4])) == 4, f"a new connection after each closed one: {later}"
    assert later[4] == later[3]  # kept alive again: the same connection


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_kept_alive_connection_the_server_drops_is_made_anew(
    proxy: Proxy, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server closes an idle connection it said it would keep (a keep-alive timeout):
    httpcore2 < 2.17 reports it as expired, 2.17 as not available when a request is
    sent on it; either way the call goes out on a new one."""
    sent = _lean(provider, monkeypatch)
    proxy.hang_up = True
    for n in range(1, 4):
        assert call(agent(provider)).stop_reason == "end"
        proxy.wait_closed(n)  # the server's end is closed before the next call
    assert sent == []
    later = proxy.ports[1:]
    assert len(later) == 3 and len(set(later)) == 3, f"a new connection each call: {later}"


@pytest.fixture
def untested_httpx2(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``DUET_FAST_PATHS=auto`` with httpx2 reporting 2.14.0 (what Python 3.10 resolves)."""
    real = fastpaths.installed_version
    monkeypatch.setenv(fastpaths.SWITCH, "auto")
    monkeypatch.setattr(
        fastpaths, "installed_version", lambda p: "2.14.0" if p == "httpx2" else real(p)
    )
    fastpaths.reset()
    yield
    fastpaths.reset()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_untested_httpx2_posts_every_call_through_the_sdk_with_one_notice(
    llm: FakeLLM,
    untested_httpx2: None,
    provider: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if not isinstance(provider_for(agent(provider).spec).client()._client, httpx2.Client):
        pytest.skip("the installed SDK posts with httpx, not httpx2: no endpoint fast path")
    sent: list[Any] = []
    send = httpx2.Client.send

    def counting(self: httpx2.Client, request: httpx2.Request, **kwargs: Any) -> Any:
        sent.append(request)
        return send(self, request, **kwargs)

    monkeypatch.setattr(httpx2.Client, "send", counting)
    with caplog.at_level(logging.INFO, logger=fastpaths.__name__):
        for _ in range(3):
            assert call(agent(provider)).stop_reason == "end"
    assert len(sent) == 3  # each through the SDK's client
    assert provider_for(agent(provider).spec)._endpoint is None
    notices = [r.getMessage() for r in caplog.records if r.name == fastpaths.__name__]
    tested = fastpaths.FAST_PATHS["endpoint"].tested
    assert notices == [
        f"fast path endpoint off: httpx2 2.14.0 is outside its tested {tested}; "
        "running the stock library"
    ]
