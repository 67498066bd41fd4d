"""A local stand-in for the OpenAI and Anthropic HTTP APIs, answering as the sim model.

Stdlib, plus the SDKs' request types every body is held to (:mod:`duet.standin.schemas`: a
body the vendor would refuse gets its 400). Tests and benchmarks point the real ``openai``
/ ``anthropic`` SDKs at it::

    with FakeLLM() as llm:                       # http://127.0.0.1:<free port>
        OpenAI(base_url=llm.url, api_key="x")     # POST /v1/chat/completions
        Anthropic(base_url=llm.anthropic_url, api_key="x")   # POST /v1/messages
        llm.set_faults(status=429, times=2, retry_after="3")
        llm.stats()

Answers come from :func:`workers.providers.sim.simulate`. A model string ``sim``,
``sim:ROLE`` or ``sim?opts`` is used as the sim model (the role filled in when left
out); any other model name answers as ``sim:critic`` when the model name or system
prompt mentions "critic" or the system prompt or last message asks for JSON with a
"score", else as ``sim:actor``. ``max_tokens`` (or ``max_completion_tokens``) is
honoured: a cut reply has ``finish_reason: "length"`` / ``stop_reason: "max_tokens"``.
The sim's ``refuse_at`` / ``refuse`` options answer as each vendor does: a refusal is
OpenAI ``content: null`` + ``refusal`` / Anthropic ``stop_reason: "refusal"``; a content
filter is ``finish_reason: "content_filter"`` (a refusal at Anthropic, which has none); a
context overflow is OpenAI's HTTP 400 ``context_length_exceeded`` / Anthropic
``stop_reason: "model_context_window_exceeded"``. Batch results carry the same shapes.
A structured critique request — OpenAI ``response_format`` with a ``json_schema``, or an
Anthropic ``tool_choice`` forcing one of the request's ``tools`` — is answered by the
critic as plain JSON: the message content, or the forced tool's ``input`` (``stop_reason:
"tool_use"``). Tools and schemas count as prompt tokens. Prompt caching follows each
vendor's rules (see :mod:`duet.standin.prompt_cache`).

Admin API (JSON):

``POST /_admin/faults``  set a new fault plan; fields left out are off. Fields:
    ``status`` (int) HTTP error for faulted requests; applies to every matching request
    unless ``times`` (the next N) or ``every`` (every Nth) narrows it;
    ``retry_after`` / ``retry_after_ms`` (str) headers sent with it; ``message`` (str);
    ``echo_key`` (bool) end the error message with the request's credential, the way a
    careless upstream or proxy does (to test that no key leaks); ``echo_key_in_reply``
    (bool) end a successful answer's text with it, the way a model repeats a key it was
    shown; ``echo_key_in_issues`` (bool) add it to a JSON critique's issues, written as
    JSON ``\\u`` escapes (a critic quoting a key it saw); ``echo_url`` (bool) end the error
    message with the URL the request was sent to, the user and password of a basic-auth
    ``Authorization`` header written back into it (a gateway quoting its upstream);
    ``drop`` (int) close the connection without a response on the next N requests;
    ``drop_every`` (int) ...or on every Nth; ``delays_ms`` (list of numbers) extra delay
    for the next requests, one each, in order; ``path`` / ``model`` (str) only requests
    to this path or for this model are counted and faulted; ``latency_ms`` (number)
    changes the base latency of every request (kept when left out).
``GET /_admin/stats``    counts per path, per model and per status, connections accepted,
    faulted / dropped / rate-limited counts, arrival log ``[{t, path, model}]``
    (``time.time()``; ``rate_limited: true`` on those the rate limit refused),
    usage totals sent (cache reads and writes included), the last requests (``path``,
    ``model``, ``body`` and the ``authorization`` header received), the current plan.
``POST /_admin/batches`` how vendor batches behave: ``delay_s``, ``fail_match``,
    ``fail_status``, ``expire_match``, ``expire`` (see :mod:`duet.standin.batches`).
``POST /_admin/limits``  ``{"rpm": N, "tpm": N}``: enforce a rate limit from now (a fresh
    bucket; ``null`` or left out: none), as ``--rpm`` / ``--tpm`` do at start.
``POST /_admin/reset``   clear faults, stats, logs and batches; latency back to its start
    value.

The vendor batch APIs (OpenAI ``/v1/files`` + ``/v1/batches``, Anthropic
``/v1/messages/batches``) are served too: see :mod:`duet.standin.batches`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from duet.standin import toolcalls
from duet.standin.batches import BatchError, BatchStore
from duet.standin.prompt_cache import PromptCache
from duet.standin.ratelimit import VendorLimit, estimate_tokens
from duet.standin.schemas import refusal
from duet.standin.schemas import warm as warm_schemas
from orchestration.core.errors import ConfigError, ProviderError
from orchestration.core.outputs import OUTPUT_NAME
from orchestration.core.structured import CRITIQUE_NAME
from workers.providers.sim import simulate, structured_reply

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
_FAULT_FIELDS = {
    "status": int,
    "times": int,
    "every": int,
    "retry_after": str,
    "retry_after_ms": str,
    "message": str,
    "echo_key": bool,
    "echo_key_in_reply": bool,
    "echo_key_in_issues": bool,
    "echo_url": bool,
    "drop": int,
    "drop_every": int,
    "delays_ms": list,
    "path": str,
    "model": str,
}
_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    429: "rate_limit_error",
}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
#: The sim's stop reasons as each vendor says them (the rest: a plain end).
_OPENAI_STOPS = {"max_tokens": "length", "content_filter": "content_filter"}
_ANTHROPIC_STOPS = {
    "max_tokens": "max_tokens",
    "refusal": "refusal",
    "content_filter": "refusal",
    "context_window": "model_context_window_exceeded",
}
#: OpenAI's message, and error code, for a conversation that overflows the context window.
CONTEXT_MESSAGE = (
    "This model's maximum context length is 128000 tokens. "
    "Please reduce the length of the messages."
)
CONTEXT_CODE = "context_length_exceeded"
_LAST_REQUESTS = 50
#: The tool a structured critique is written with (``orchestration.core.structured``).
_CRITIQUE_TOOL = CRITIQUE_NAME
_ARRIVALS = 100_000


def sim_model_for(
    model: str, system: str, last_message: str = "", *, structured: bool = False
) -> str:
    """The sim model string the server answers ``model`` with (see module docstring).

    A ``structured`` request (a JSON schema or a forced tool) is answered by the critic
    writing plain JSON, whatever the model string's ``format`` says.
    """
    model = model or ""
    if structured:
        head, _, query = sim_model_for(model, system, last_message).partition("?")
        options = [(k, v) for k, v in parse_qsl(query) if k != "format"] + [("format", "json")]
        return "sim:critic?" + urlencode(options)
    head, sep, query = model.partition("?")
    if head.startswith("sim:"):
        return model
    low_system, low_last = system.lower(), last_message.lower()
    critic = (
        "critic" in model.lower()
        or "critic" in low_system
        or ("json" in low_system and "score" in low_system)
        or ("json" in low_last and '"score"' in low_last)
    )
    role = "critic" if critic else "actor"
    if head == "sim":
        return f"sim:{role}{sep}{query}"
    return f"sim:{role}"


def _forced_tool(body: dict[str, Any]) -> str | None:
    """The tool an Anthropic request forces the model to call, if any (it must be defined)."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") != "tool":
        return None
    names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    if choice.get("name") not in names:
        raise ValueError(f"tool_choice names tool {choice.get('name')!r}, not among the tools")
    return str(choice["name"])


def _json_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema an OpenAI request's ``response_format`` asks for, if any."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    schema = (fmt.get("json_schema") or {}).get("schema")
    if not isinstance(schema, dict):
        raise ValueError("response_format.json_schema.schema must be an object")
    return schema


def _output_schema(
    body: dict[str, Any], anthropic: bool, tool: str | None
) -> dict[str, Any] | None:
    """The schema of an actor's structured output a request asks for (OpenAI
    ``response_format``, or the Anthropic tool it forces), if it is not the critique's."""
    if anthropic:
        if tool is None or tool == _CRITIQUE_TOOL:
            return None
        found = next(t for t in body.get("tools") or [] if t.get("name") == tool)
        schema = found.get("input_schema")
        return schema if isinstance(schema, dict) else None
    schema = _json_schema(body)
    name = (body.get("response_format") or {}).get("json_schema", {}).get("name")
    return None if schema is None or name == CRITIQUE_NAME else schema


def _text(content: Any) -> str:
    """Message content as plain text: a string, or a list of ``{type: text, text}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") for part in content if isinstance(part, dict) and "text" in part
        )
    return "" if content is None else str(content)


@dataclass
class _Decision:
    """What happens to one model request."""

    delay_s: float
    drop: bool = False
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    message: str | None = None
    echo_key: bool = False
    echo_key_in_reply: bool = False
    echo_key_in_issues: bool = False
    echo_url: bool = False
    #: This request's entry in the arrival log (``rate_limited`` is set on it when the
    #: rate limit refuses it).
    arrival: dict[str, Any] = field(default_factory=dict)


class _State:
    """Fault plan and statistics, shared by the handler threads."""

    def __init__(self, latency_ms: float, cache: PromptCache, batch_delay_s: float = 0.0) -> None:
        self.lock = threading.Lock()
        #: The vendor's rate limit (None: none; see :mod:`duet.standin.ratelimit`).
        self.limit: VendorLimit | None = None
        self.cache = cache
        self.batches = BatchStore(
            lambda anthropic, body, key: _answer_one(self, anthropic, body, key), batch_delay_s
        )
        self.start_latency_ms = float(latency_ms)
        self.latency_ms = float(latency_ms)
        self.plan: dict[str, Any] = {}
        self.connections = 0
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.latency_ms = self.start_latency_ms
            self._set_plan({})
            self.requests = 0
            self.by_path: Counter[str] = Counter()
            self.by_model: Counter[str] = Counter()
            self.by_status: Counter[str] = Counter()
            self.faulted = 0
            self.dropped = 0
            self.rate_limited = 0
            self.input_tokens = 0
            self.output_tokens = 0
            self.cached_input_tokens = 0
            self.cache_write_tokens = 0
            self.responses = 0
            self.cache.clear()
            self.batches.reset()
            self.arrivals: deque[dict[str, Any]] = deque(maxlen=_ARRIVALS)
            self.last_requests: deque[dict[str, Any]] = deque(maxlen=_LAST_REQUESTS)

    def set_faults(self, plan: dict[str, Any]) -> None:
        plan = dict(plan)
        latency = plan.pop("latency_ms", None)
        unknown = set(plan) - set(_FAULT_FIELDS)
        if unknown:
            raise ValueError(
                f"unknown fault fields {sorted(unknown)}; known: {sorted(_FAULT_FIELDS)}, latency_ms"
            )
        for key, kind in _FAULT_FIELDS.items():
            value = plan.get(key)
            if value is not None and not isinstance(value, kind):
                raise ValueError(f"fault field {key!r} must be {kind.__name__}, got {value!r}")
        if plan.get("status") is not None and not 400 <= plan["status"] <= 599:
            raise ValueError(f"status must be an HTTP error code 400..599, got {plan['status']}")
        for key in ("every", "drop_every"):
            if plan.get(key) is not None and plan[key] < 1:
                raise ValueError(f"{key} must be >= 1")
        with self.lock:
            if latency is not None:
                self.latency_ms = float(latency)
            self._set_plan(plan)

    def set_limit(self, plan: dict[str, Any]) -> None:
        """Enforce ``rpm`` / ``tpm`` (ints or None) from now, in a fresh bucket."""
        unknown = set(plan) - {"rpm", "tpm"}
        if unknown:
            raise ValueError(f"unknown limit fields {sorted(unknown)}; known: rpm, tpm")
        rpm, tpm = plan.get("rpm"), plan.get("tpm")
        limit = VendorLimit(rpm, tpm) if rpm or tpm else None
        with self.lock:
            self.limit = limit

    def _set_plan(self, plan: dict[str, Any]) -> None:
        self.plan = {k: v for k, v in plan.items() if v is not None}
        self.plan_seen = 0  # matching requests since the plan was set
        self.times_left = self.plan.get("times")
        self.drops_left = self.plan.get("drop", 0)
        self.delays_left = deque(float(d) for d in self.plan.get("delays_ms", []))

    def arrive(
        self, path: str, model: str, body: Any, authorization: str | None = None
    ) -> _Decision:
        """Record a request (with the ``Authorization`` header it came with) and decide
        its fate under the current plan."""
        with self.lock:
            self.requests += 1
            self.by_path[path] += 1
            self.by_model[model] += 1
            arrival = {"t": time.time(), "path": path, "model": model}
            self.arrivals.append(arrival)
            self.last_requests.append(
                {"path": path, "model": model, "body": body, "authorization": authorization}
            )
            plan = self.plan
            delay = self.latency_ms
            if plan.get("path", path) != path or plan.get("model", model) != model:
                return _Decision(delay / 1000, arrival=arrival)
            self.plan_seen += 1
            n = self.plan_seen
            if self.delays_left:
                delay += self.delays_left.popleft()
            drop = False
            if self.drops_left > 0:
                self.drops_left -= 1
                drop = True
            elif plan.get("drop_every") and n % plan["drop_every"] == 0:
                drop = True
            status = plan.get("status")
            if status is not None and not drop:
                if self.times_left is not None:
                    if self.times_left > 0:
                        self.times_left -= 1
                    else:
                        status = None
                elif plan.get("every") is not None and n % plan["every"] != 0:
                    status = None
            else:
                status = None
            if drop:
                self.dropped += 1
            elif status is not None:
                self.faulted += 1
            headers = {}
            if status is not None:
                if plan.get("retry_after") is not None:
                    headers["Retry-After"] = plan["retry_after"]
                if plan.get("retry_after_ms") is not None:
                    headers["retry-after-ms"] = plan["retry_after_ms"]
            return _Decision(
                delay / 1000,
                drop,
                status,
                headers,
                plan.get("message"),
                bool(plan.get("echo_key")),
                bool(plan.get("echo_key_in_reply")),
                bool(plan.get("echo_key_in_issues")),
                bool(plan.get("echo_url")),
                arrival,
            )

    def record_response(
        self,
        status: int,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cached_input_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> None:
        """Count a response; ``input_tokens`` include the cache reads and writes."""
        with self.lock:
            self.by_status[str(status)] += 1
            if status == 200:
                self.responses += 1
                self.input_tokens += input_tokens
                self.output_tokens += output_tokens
                self.cached_input_tokens += cached_input_tokens
                self.cache_write_tokens += cache_write_tokens

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": self.requests,
                "by_path": dict(self.by_path),
                "by_model": dict(self.by_model),
                "by_status": dict(self.by_status),
                "connections": self.connections,
                "faulted": self.faulted,
                "dropped": self.dropped,
                "rate_limited": self.rate_limited,
                "usage": {
                    "input_tokens": self.input_tokens,
                    "output_tokens": self.output_tokens,
                    "cached_input_tokens": self.cached_input_tokens,
                    "cache_write_tokens": self.cache_write_tokens,
                    "responses": self.responses,
                },
                "arrivals": list(self.arrivals),
                "last_requests": list(self.last_requests),
                "faults": dict(self.plan),
                "batches": self.batches.stats(),
                "latency_ms": self.latency_ms,
            }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    # socketserver's default backlog of 5 resets connections when a batch opens a hundred
    # at once; a vendor's front end never does.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        self.state = state
        self.stopping = threading.Event()
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        # Without this, Nagle + delayed ACK make a small keep-alive response take ~40 ms.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.sockets_lock:
            self.open_sockets.add(sock)
        with self.state.lock:
            self.state.connections += 1
        return sock, addr

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def close_open_sockets(self) -> None:
        with self.sockets_lock:
            sockets = list(self.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):  # client went away mid-response
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeLLM/1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else {}

    def _count(self, route: str) -> None:
        state = self.server.state
        with state.lock:
            state.requests += 1
            state.by_path[route] += 1

    def _send_bytes(self, data: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _base(self) -> str:
        host = self.headers.get("Host") or f"127.0.0.1:{self.server.server_address[1]}"
        return f"http://{host}"

    def _batch_api(self, method: str, path: str) -> bool:
        """Serve a vendor batch API route (see :mod:`duet.standin.batches`); False if not one."""
        parts = path.strip("/").split("/")
        store = self.server.state.batches
        anthropic = parts[:3] == ["v1", "messages", "batches"]
        try:
            if parts == ["v1", "files"] and method == "POST":
                self._count("/v1/files")
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                self._send(200, store.upload(self.headers.get("Content-Type") or "", raw))
            elif parts[:2] == ["v1", "files"] and len(parts) in (3, 4) and method == "GET":
                meta, data = store.file(parts[2])
                if len(parts) == 4 and parts[3] == "content":
                    self._count("/v1/files/{id}/content")
                    self._send_bytes(data, "application/octet-stream")
                else:
                    self._count("/v1/files/{id}")
                    self._send(200, meta)
            elif parts == ["v1", "batches"] and method == "POST":
                self._count("/v1/batches")
                self._send(200, store.create_openai(self._read_json(), self._api_key()))
            elif parts[:2] == ["v1", "batches"] and len(parts) in (3, 4):
                cancel = len(parts) == 4 and parts[3] == "cancel" and method == "POST"
                if len(parts) == 4 and not cancel:
                    return False
                self._count("/v1/batches/{id}/cancel" if cancel else "/v1/batches/{id}")
                self._send(200, store.openai(parts[2], cancel=cancel))
            elif anthropic and len(parts) == 3 and method == "POST":
                self._count("/v1/messages/batches")
                self._send(
                    200, store.create_anthropic(self._read_json(), self._api_key(), self._base())
                )
            elif anthropic and len(parts) == 4 and method == "GET":
                self._count("/v1/messages/batches/{id}")
                self._send(200, store.anthropic(parts[3], base=self._base()))
            elif anthropic and len(parts) == 5 and parts[4] == "results" and method == "GET":
                self._count("/v1/messages/batches/{id}/results")
                self._send_bytes(store.anthropic_results(parts[3]), "application/binary")
            elif anthropic and len(parts) == 5 and parts[4] == "cancel" and method == "POST":
                self._count("/v1/messages/batches/{id}/cancel")
                self._send(200, store.anthropic(parts[3], base=self._base(), cancel=True))
            else:
                return False
        except BatchError as exc:
            self._send(exc.status, _error_payload(anthropic, exc.status, str(exc)))
        except ValueError as exc:
            self._send(400, _error_payload(anthropic, 400, f"body is not JSON: {exc}"))
        return True

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if self._batch_api("GET", self.path.split("?", 1)[0]):
            return
        if self.path == "/_admin/stats":
            self._send(200, self.server.state.snapshot())
        elif self.path in ("/", "/health", "/_admin/health"):
            self._send(200, {"ok": True})
        else:
            self._send(404, {"error": {"message": f"no route GET {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0]
        if self._batch_api("POST", path):
            return
        try:
            body = self._read_json()
        except (ValueError, UnicodeDecodeError) as exc:
            self._send(400, {"error": {"message": f"body is not JSON: {exc}"}})
            return
        state = self.server.state
        if path == "/_admin/faults":
            try:
                state.set_faults(body if isinstance(body, dict) else {"<body>": body})
            except ValueError as exc:
                self._send(400, {"error": str(exc)})
                return
            self._send(200, {"faults": state.snapshot()["faults"], "latency_ms": state.latency_ms})
        elif path == "/_admin/batches":
            try:
                state.batches.set_plan(body if isinstance(body, dict) else {"<body>": body})
            except ValueError as exc:
                self._send(400, {"error": str(exc)})
                return
            self._send(200, {"batches": state.batches.plan})
        elif path == "/_admin/limits":
            try:
                state.set_limit(body if isinstance(body, dict) else {"<body>": body})
            except (TypeError, ValueError) as exc:
                self._send(400, {"error": str(exc)})
                return
            self._send(200, {"ok": True})
        elif path == "/_admin/reset":
            state.reset()
            self._send(200, {"ok": True})
        elif path in (OPENAI_PATH, ANTHROPIC_PATH):
            self._model_call(path, body if isinstance(body, dict) else {})
        else:
            self._send(404, {"error": {"message": f"no route POST {path}"}})

    def _model_call(self, path: str, body: dict[str, Any]) -> None:
        state = self.server.state
        anthropic = path == ANTHROPIC_PATH
        model = str(body.get("model") or "")
        fate = state.arrive(path, model, body, self.headers.get("Authorization"))
        limits: dict[str, str] = {}
        limit = state.limit
        if limit is not None and not fate.drop and fate.status is None:
            size = int(self.headers.get("Content-Length") or 0)
            verdict = limit.admit(estimate_tokens(body, size), anthropic=anthropic)
            limits = verdict.headers
            if not verdict.admitted:  # refused at once, as a vendor's front end does
                with state.lock:
                    state.rate_limited += 1
                    fate.arrival["rate_limited"] = True
                self._error(anthropic, 429, "Rate limit reached for requests", limits)
                return
        drop = fate.drop
        if fate.delay_s > 0 and self.server.stopping.wait(fate.delay_s):
            drop = True  # server stopping: give up on this request
        if drop:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fate.status is not None:
            self._error(
                anthropic,
                fate.status,
                fate.message,
                fate.headers,
                echo_key=fate.echo_key,
                echo_url=fate.echo_url,
            )
            return
        refused = refusal("anthropic.messages" if anthropic else "openai.chat", body)
        if refused is not None:  # what the vendor's API would refuse (duet.standin.schemas)
            self._error(anthropic, 400, refused[0], {}, param=refused[1])
            return
        problem = (
            (toolcalls.anthropic_problem(body), None)
            if anthropic
            else toolcalls.openai_problem(body) or (None, None)
        )
        if problem[0] is not None:  # tool messages the vendor's API would refuse
            self._error(anthropic, 400, problem[0], {}, param=problem[1])
            return
        try:
            reply = _answer(state, anthropic, model, body, self._api_key())
        except ProviderError as exc:  # the sim model's own failure options
            status, failure = _sim_failure(anthropic, exc)
            state.record_response(status)
            self._send(status, failure)
            return
        except (ConfigError, ValueError, TypeError, KeyError) as exc:
            self._error(anthropic, 400, f"invalid request: {exc}", {})
            return
        payload, usage = reply
        if fate.echo_key_in_reply:
            _append_text(payload, anthropic, f"\nThe key I was given: {self._credential()}")
        if fate.echo_key_in_issues:
            _escape_key_into_issues(payload, anthropic, self._credential())
        state.record_response(200, *usage)
        request_id = uuid.uuid4().hex
        header = "request-id" if anthropic else "x-request-id"
        self._send(200, payload, {header: f"req_{request_id}", **limits})

    def _error(
        self,
        anthropic: bool,
        status: int,
        message: str | None,
        headers: dict[str, str],
        *,
        echo_key: bool = False,
        echo_url: bool = False,
        param: str | None = None,
    ) -> None:
        key = self._credential()
        if not message:
            message = f"simulated HTTP {status}"
            if status == 401:
                # Like a careless server: echo the credential, so scrubbing gets tested.
                message = f"Incorrect API key provided: {key}"
        if echo_key:
            message += f" (upstream request made with credential {key})"
        if echo_url:
            message += f" (upstream {self._url_with_credentials()})"
        self.server.state.record_response(status)
        if anthropic:
            kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            kind = _OPENAI_ERROR_TYPES.get(
                status, "server_error" if status >= 500 else "invalid_request_error"
            )
            payload = {"error": {"message": message, "type": kind, "param": param, "code": None}}
        self._send(status, payload, headers)

    def _url_with_credentials(self) -> str:
        """The URL this request was sent to, a basic-auth header's user and password
        written back into it (percent-encoded, as a URL holds them)."""
        userinfo = ""
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "basic":
            with contextlib.suppress(ValueError):
                user, _, password = base64.b64decode(token).decode().partition(":")
                userinfo = f"{quote(user, safe='')}:{quote(password, safe='')}@"
        return f"{self._base().replace('://', f'://{userinfo}', 1)}{self.path}"

    def _credential(self) -> str:
        """The caller's API key, as it sent it."""
        key = self.headers.get("x-api-key") or self.headers.get("Authorization") or ""
        return key.removeprefix("Bearer ")

    def _api_key(self) -> str:
        """The caller's credential, to keep one prompt cache per key (as vendors do per
        organisation)."""
        return self.headers.get("x-api-key") or self.headers.get("Authorization") or ""


def _answer(
    state: _State, anthropic: bool, model: str, body: dict[str, Any], key: str
) -> tuple[dict[str, Any], tuple[int, int, int, int]]:
    """One model request's reply and usage (input, output, cache read, cache write)."""
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list):
        raise ValueError("'messages' must be a list")
    if anthropic:
        if not isinstance(body.get("max_tokens"), int):
            raise ValueError("'max_tokens' is required and must be an integer")
        max_tokens = body["max_tokens"]
        system = _text(body.get("system"))
        messages = toolcalls.neutral(True, raw_messages)
    else:
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 4096
        system = "\n".join(
            _text(m.get("content"))
            for m in raw_messages
            if m.get("role") in ("system", "developer")
        )
        messages = toolcalls.neutral(False, raw_messages)
    users = [m for m in messages if m["role"] == "user"]
    last = users[-1]["content"] if users else ""
    tools = toolcalls.offered(anthropic, body)
    tool = _forced_tool(body) if anthropic else None
    if anthropic and tools and (body.get("tool_choice") or {}).get("type") == "any":
        # The critic's verdict (or an actor's output), offered among its tools: a final
        # answer calls it.
        names = {t.get("name") for t in body.get("tools") or []}
        tool = next((n for n in (_CRITIQUE_TOOL, OUTPUT_NAME) if n in names), None)
    schema = _json_schema(body) if not anthropic else None
    # An actor's output_schema (any shape but the critique's) is answered by the actor.
    output = _output_schema(body, anthropic, tool)
    structured = (tool is not None or schema is not None) and output is None
    sim_model = sim_model_for(model, system, last, structured=structured)
    done = simulate(sim_model, messages, int(max_tokens), system, tools or None)  # type: ignore[arg-type]
    if output is not None and not done.tool_calls and done.stop_reason == "end":
        reply = structured_reply(sim_model, output, done.text)
        if anthropic:  # the forced tool is always called; a broken answer is its input
            reply = reply if isinstance(reply, dict) else {"answer": reply}
        text = reply if isinstance(reply, str) else json.dumps(reply)
        done = replace(done, text=text, output_tokens=math.ceil(len(text) / 4))
    if done.stop_reason == "context_window" and not anthropic:  # OpenAI: a 400
        raise ProviderError(
            CONTEXT_MESSAGE, kind="context_window", transient=False, status_code=400
        )
    cut = done.stop_reason == "max_tokens"
    created = int(time.time())
    # Tool definitions and a response schema are part of the prompt, as vendors bill.
    extra = json.dumps(body["tools"]) if anthropic and body.get("tools") else ""
    extra += json.dumps(body["response_format"]) if schema is not None else ""
    done = replace(done, input_tokens=done.input_tokens + math.ceil(len(extra) / 4))
    cache = state.cache
    if anthropic:
        read, written = cache.anthropic(key, model, body)
    else:
        read, written = cache.openai(key, model, body), 0
    # The sim counts one token per four characters of the whole prompt; the cache
    # counts whole blocks the same way, so a prefix never exceeds the prompt.
    read = min(read, done.input_tokens)
    written = min(written, done.input_tokens - read)
    usage = (done.input_tokens, done.output_tokens, read, written)
    if anthropic:
        payload: dict[str, Any] = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": done.text}],
            "stop_reason": _ANTHROPIC_STOPS.get(done.stop_reason, "end_turn"),
            "stop_sequence": None,
            "usage": {
                "input_tokens": done.input_tokens - read - written,
                "output_tokens": done.output_tokens,
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": written,
            },
        }
    else:
        payload = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": done.text, "refusal": None},
                    "finish_reason": _OPENAI_STOPS.get(done.stop_reason, "stop"),
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": done.input_tokens,
                "completion_tokens": done.output_tokens,
                "total_tokens": done.input_tokens + done.output_tokens,
                "prompt_tokens_details": {"cached_tokens": read},
            },
        }
    if done.tool_calls:  # the turn asks for the agent's tools
        if anthropic:
            text_blocks = [{"type": "text", "text": done.text}] if done.text else []
            calls = toolcalls.anthropic_calls(done.tool_calls)
            payload.update(content=[*text_blocks, *calls], stop_reason="tool_use")
        else:
            choice = payload["choices"][0]
            choice["message"]["tool_calls"] = toolcalls.openai_calls(done.tool_calls)
            choice["finish_reason"] = "tool_calls"
    elif done.stop_reason == "refusal":
        _refused(payload, anthropic, done.text)
    elif tool is not None and not cut and done.stop_reason == "end":  # the forced tool
        # is called with the critique
        call = {
            "type": "tool_use",
            "id": f"toolu_{uuid.uuid4().hex[:24]}",
            "name": tool,
            "input": json.loads(done.text),
        }
        payload.update(content=[call], stop_reason="tool_use")
    return payload, usage


def _refused(payload: dict[str, Any], anthropic: bool, text: str) -> None:
    """Make ``payload`` a refusal, as the vendor writes one."""
    if anthropic:
        payload["stop_details"] = {"type": "refusal", "category": None, "explanation": text}
    else:
        payload["choices"][0]["message"].update(content=None, refusal=text)


def _append_text(payload: dict[str, Any], anthropic: bool, extra: str) -> None:
    """Add ``extra`` to the text of an answer (its first text block, or its message)."""
    if anthropic:
        for block in payload.get("content", []):
            if block.get("type") == "text":
                block["text"] += extra
                return
    else:
        message = payload["choices"][0]["message"]
        message["content"] = (message.get("content") or "") + extra


def _escape_key_into_issues(payload: dict[str, Any], anthropic: bool, key: str) -> None:
    """Add ``key`` as an issue of the JSON critique in the answer's text, every character
    of it a JSON ``\\u`` escape (text that is no JSON critique is left alone)."""
    if anthropic:
        holders = [b for b in payload.get("content", []) if b.get("type") == "text"]
        name = "text"
    else:
        holders, name = [payload["choices"][0]["message"]], "content"
    for holder in holders[:1]:
        try:
            critique = json.loads(holder.get(name) or "")
        except ValueError:
            return
        if isinstance(critique, dict) and isinstance(critique.get("issues"), list):
            critique["issues"].append("\0")
            escaped = "".join(f"\\u{ord(c):04x}" for c in f"the key is {key}")
            holder[name] = json.dumps(critique).replace('"\\u0000"', f'"{escaped}"')


def _error_payload(anthropic: bool, status: int, message: str) -> dict[str, Any]:
    """A vendor's error body for an HTTP error status."""
    if anthropic:
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = _OPENAI_ERROR_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _answer_one(
    state: _State, anthropic: bool, body: dict[str, Any], key: str
) -> tuple[int, dict[str, Any]]:
    """A request inside a vendor batch: ``(status, reply or error body)``, counted in the
    statistics as a synchronous call's would be. Tool messages the vendor's API refuses
    (a result answering no call, a call left unanswered) fail the request as a 400."""
    problem = toolcalls.anthropic_problem(body) if anthropic else toolcalls.openai_problem(body)
    message = problem if isinstance(problem, str) or problem is None else problem[0]
    if message is not None:
        state.record_response(400)
        return 400, _error_payload(anthropic, 400, message)
    try:
        payload, usage = _answer(state, anthropic, str(body.get("model") or ""), body, key)
    except ProviderError as exc:
        status, failure = _sim_failure(anthropic, exc)
        state.record_response(status)
        return status, failure
    except (ConfigError, ValueError, TypeError, KeyError, AttributeError) as exc:
        state.record_response(400)
        return 400, _error_payload(anthropic, 400, f"invalid request: {exc}")
    state.record_response(200, *usage)
    return 200, payload


def _sim_failure(anthropic: bool, exc: ProviderError) -> tuple[int, dict[str, Any]]:
    """The status and error body a sim failure is answered with: a context overflow is
    OpenAI's 400 with its code ``context_length_exceeded``."""
    status = exc.status_code or 500
    payload = _error_payload(anthropic, status, str(exc))
    if exc.kind == "context_window" and not anthropic:
        payload["error"]["code"] = CONTEXT_CODE
    return status, payload


class FakeLLM:
    """The stand-in server on a background thread; a context manager.

    Args:
        port: TCP port, 0 for any free one.
        latency_ms: base latency added to every model request.
        host: interface to listen on.
        faults: an initial fault plan (same fields as ``POST /_admin/faults``).
        cache_min_tokens: the shortest prompt prefix the prompt cache keeps (the vendors'
            minimum is 1024 tokens for most models).
        cache_ttl_s: how long an unused cached prefix is kept (the vendors': 5 minutes).
        batch_delay_s: how long a vendor batch takes to finish (its requests come due
            evenly over that time).
        rpm, tpm: the account's rate limit, enforced per second as vendors may (HTTP 429
            with ``retry-after`` over it) and stated in the vendors' rate-limit headers
            on every answer (see :mod:`duet.standin.ratelimit`); None: no limit, no headers.
    """

    def __init__(
        self,
        port: int = 0,
        latency_ms: float = 0,
        *,
        host: str = "127.0.0.1",
        faults: dict[str, Any] | None = None,
        cache_min_tokens: int = 1024,
        cache_ttl_s: float = 300.0,
        batch_delay_s: float = 0.0,
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> None:
        self._state = _State(latency_ms, PromptCache(cache_min_tokens, cache_ttl_s), batch_delay_s)
        if faults:
            self._state.set_faults(faults)
        self._state.set_limit({"rpm": rpm, "tpm": tpm})
        self._server = _Server((host, port), self._state)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def base(self) -> str:
        """``http://HOST:PORT`` (the ``ANTHROPIC_BASE_URL``)."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """OpenAI ``base_url``: ``http://HOST:PORT/v1``."""
        return f"{self.base}/v1"

    @property
    def anthropic_url(self) -> str:
        """Anthropic ``base_url``: ``http://HOST:PORT``."""
        return self.base

    def start(self) -> FakeLLM:
        if self._thread is None:
            threading.Thread(target=warm_schemas, name="fake-llm:warm", daemon=True).start()
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"fake-llm:{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, abort pending delays and close every connection."""
        self._server.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.close_open_sockets()
        self._server.server_close()

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict[str, Any]:
        """What ``GET /_admin/stats`` returns."""
        return self._state.snapshot()

    def set_faults(self, **plan: Any) -> None:
        """Set a new fault plan (see module docstring); no arguments clears it."""
        self._state.set_faults(plan)

    def set_batch_plan(self, **plan: Any) -> None:
        """How vendor batches behave (see :mod:`duet.standin.batches`): ``delay_s``,
        ``fail_match``, ``fail_status``, ``expire_match``, ``expire``."""
        self._state.batches.set_plan(plan)

    def set_limits(self, rpm: int | None = None, tpm: int | None = None) -> None:
        """Enforce a rate limit from now (a fresh bucket); no arguments: none."""
        self._state.set_limit({"rpm": rpm, "tpm": tpm})

    def clear_faults(self) -> None:
        self._state.set_faults({})

    def reset(self) -> None:
        """Clear faults, stats and logs; latency back to its start value."""
        self._state.reset()

    @property
    def last_requests(self) -> list[dict[str, Any]]:
        """The most recent model requests, oldest first: ``[{path, model, body,
        authorization}]`` (the ``Authorization`` header received, ``None`` without one)."""
        return self.stats()["last_requests"]


def serve(
    host: str = "127.0.0.1",
    port: int = 8765,
    latency_ms: float = 0,
    rpm: int | None = None,
    tpm: int | None = None,
) -> None:
    """Run the stand-in in the foreground until interrupted.

    Raises:
        ConfigError: the address cannot be listened on (the port is taken, say).
    """
    try:
        server = FakeLLM(port, latency_ms, host=host, rpm=rpm, tpm=tpm)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    print(f"fake LLM on {server.base}  (OpenAI base_url {server.url})", flush=True)
    if threading.current_thread() is threading.main_thread():
        # `docker stop` / `kill` end it as cleanly as Ctrl-C.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server._server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m duet.standin.server [--host H] [--port P] [--latency-ms N]``."""
    parser = argparse.ArgumentParser(prog="duet fake-llm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--rpm", type=int, default=None)
    parser.add_argument("--tpm", type=int, default=None)
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.latency_ms, args.rpm, args.tpm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
