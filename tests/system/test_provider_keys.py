"""Which credential each server gets: the vendor's key only goes to the vendor's host.

A tiny local server records the headers of every model call made through the real SDK
adapters (``provider_for``, as workers get them): a ``base_url`` that is not the vendor's
own gets no ``Authorization`` / ``x-api-key`` unless the agent names ``api_key_env``.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import workers.providers as providers
from orchestration.core.agents import Agent
from orchestration.core.completion import Message
from orchestration.core.errors import ProviderError
from tests.reliability import SECRETS, Reliability
from workers.providers import provider_for

pytestmark = pytest.mark.system

OPENAI_KEY = "duet-vendor-openai-key-7c1e"
ANTHROPIC_KEY = "duet-vendor-anthropic-key-3b9d"
OWN_KEY = "duet-gateway-own-key-55a0"
OWN_KEY_ENV = "DUET_TEST_GATEWAY_KEY"
TASK: list[Message] = [{"role": "user", "content": "Write a parser."}]
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")
_REPLIES = {
    "/v1/chat/completions": {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    },
    "/v1/messages": {
        "id": "m1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    },
}


class _Server(ThreadingHTTPServer):
    status = 200
    seen: list[dict[str, str]]
    #: Where to redirect every call (307), if anywhere.
    location: str | None = None


class _Recorder(BaseHTTPRequestHandler):
    """Answers every model call (with ``server.status``) and keeps its headers."""

    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append({k.lower(): v for k, v in self.headers.items()})
        if self.server.location is not None:
            self.send_response(307)
            self.send_header("Location", self.server.location + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status = self.server.status
        body = (
            _REPLIES.get(self.path, {})
            if status == 200
            else {
                "type": "error",
                "error": {"type": "authentication_error", "message": "key needed"},
            }
        )
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return None


def _serve() -> _Server:
    httpd = _Server(("127.0.0.1", 0), _Recorder)
    httpd.seen = []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Server]:
    """The recording server, vendor keys in the environment, a fresh adapter registry."""
    httpd = _serve()
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv(OWN_KEY_ENV, OWN_KEY)
    for var in (
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
        "OPENAI_CUSTOM_HEADERS",
        "ANTHROPIC_CUSTOM_HEADERS",
    ):
        monkeypatch.delenv(var, raising=False)
    adapters: dict[Any, Any] = {}
    monkeypatch.setattr(providers, "_adapters", adapters)
    try:
        yield httpd
    finally:
        for adapter in adapters.values():
            adapter.close()
        httpd.shutdown()
        httpd.server_close()


def _agent(provider: str, server: _Server, **kwargs: Any) -> Agent:
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}" + ("/v1" if provider == "openai" else "")
    return Agent("Answer.", model=f"{provider}:m", base_url=url, **kwargs)


def _credentials(headers: dict[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in CREDENTIAL_HEADERS if name in headers}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_third_party_base_url_gets_no_key_unless_api_key_env_names_one(
    server: _Server, provider: str, reliability: Reliability
) -> None:
    keyless = _agent(provider, server)
    assert keyless.spec.api_key_env is None
    for _ in range(2):  # the first call goes through the SDK, the next one past it
        assert provider_for(keyless.spec).complete(keyless.spec, TASK).text == "ok"
    sent_without = [_credentials(h) for h in server.seen]
    server.seen.clear()
    named = _agent(provider, server, api_key_env=OWN_KEY_ENV)
    for _ in range(2):
        provider_for(named.spec).complete(named.spec, TASK)
    sent_with = [_credentials(h) for h in server.seen]
    vendor_key = OPENAI_KEY if provider == "openai" else ANTHROPIC_KEY
    if provider == "openai":
        reliability.record(
            section=SECRETS,
            fault="Key to a third-party host: `openai:NAME` / `anthropic:NAME` with a "
            "`base_url` of another server and no `api_key_env`, the vendors' keys set on the "
            "worker; then the same with `api_key_env` naming the server's own key",
            load="2 calls per agent and vendor SDK (the first through the SDK, the next on "
            "its learned endpoint), a local server recording every header",
            lost=f"nothing: no credential header on the calls without `api_key_env` "
            f"({sent_without}); the named key, and only it, with it",
            before="the vendor's key (`OPENAI_API_KEY` / `ANTHROPIC_API_KEY`) went to the "
            "other server as its bearer token",
        )
    assert sent_without == [{}, {}]
    assert len(sent_with) == 2
    assert all(OWN_KEY in " ".join(c.values()) for c in sent_with), sent_with
    assert not any(vendor_key in json.dumps(h) for h in server.seen)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("call", ["first", "later"])
def test_a_server_wanting_a_key_none_was_named_for_says_set_api_key_env(
    server: _Server, provider: str, status: int, call: str
) -> None:
    """The first call goes through the SDK (its exception is classified), a later one
    past it (the status read off the reply): both say what to do."""
    keyless = _agent(provider, server)
    adapter = provider_for(keyless.spec)
    if call == "later":
        adapter.complete(keyless.spec, TASK)
    server.status = status
    with pytest.raises(ProviderError) as info:
        adapter.complete(keyless.spec, TASK)
    assert info.value.kind == ("auth" if status == 401 else "permission")
    assert f"no key was sent to {keyless.spec.base_url}" in str(info.value)
    assert "set api_key_env" in str(info.value)
    assert [_credentials(h) for h in server.seen] == [{}] * len(server.seen)
    named = _agent(provider, server, api_key_env=OWN_KEY_ENV)
    with pytest.raises(ProviderError) as info:
        provider_for(named.spec).complete(named.spec, TASK)
    assert "api_key_env" not in str(info.value)  # a key was sent: it is the key's fault


def test_the_vendor_host_keeps_its_default_key() -> None:
    assert Agent("a", model="gpt-4o").spec.api_key_env == "OPENAI_API_KEY"
    vendor = Agent("a", model="openai:gpt-4o", base_url="https://API.openai.com/v1")
    assert vendor.spec.api_key_env == "OPENAI_API_KEY"
    claude = Agent("a", model="anthropic:claude-x", base_url="https://api.anthropic.com")
    assert claude.spec.api_key_env == "ANTHROPIC_API_KEY"
    look_alikes = [
        "https://api.openai.com.evil.example/v1",
        "http://api.openai.com/v1",
        "https://api.anthropic.com/v1",
        "api.openai.com/v1",
    ]
    for url in look_alikes:  # another host, plain HTTP, the other vendor, no scheme
        assert Agent("a", model="openai:m", base_url=url).spec.api_key_env is None, url


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_base_url_credentials_go_to_its_host_and_not_to_a_redirect(
    server: _Server, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``USER:${VAR}@`` in a ``base_url``: the worker's value goes as basic auth, on the
    SDK's first call and on the learned endpoint after it, never to another host."""
    monkeypatch.setenv("DUET_TEST_GW_PASS", "gw-pass-71c0")
    basic = "Basic " + base64.b64encode(b"bot:gw-pass-71c0").decode()
    port = server.server_address[1]
    path = "/v1" if provider == "openai" else ""
    agent = Agent(
        "Answer.",
        model=f"{provider}:m",
        base_url=f"http://bot:${{DUET_TEST_GW_PASS}}@127.0.0.1:{port}{path}",
    )
    adapter = provider_for(agent.spec)
    for _ in range(2):
        assert adapter.complete(agent.spec, TASK).text == "ok"
    assert [_credentials(h) for h in server.seen] == [{"authorization": basic}] * 2
    elsewhere = _serve()
    try:
        server.location = f"http://localhost:{elsewhere.server_address[1]}"
        assert adapter.complete(agent.spec, TASK).text == "ok"  # followed to the other host
        # (The learned endpoint hands a redirect to the client, which posts again.)
        assert [_credentials(h) for h in server.seen[2:]] == [{"authorization": basic}] * (
            len(server.seen) - 2
        )
        assert [_credentials(h) for h in elsewhere.seen] == [{}]
    finally:
        elsewhere.shutdown()
        elsewhere.server_close()
