"""Where a model call is posted after the first: straight onto the SDK client's pool.

The first call of an adapter goes through the SDK; the URL and headers it went out with
(auth included) make an :class:`Endpoint`. Later calls are sent on the connection pool
the SDK's HTTP client (an ``httpx2.Client``) picked for that URL: its TLS settings, proxy
(one from the environment included) and keep-alive expiry, without the client's
per-request layers (request and response models, header and cookie merging, auth and
event hooks). Against the stand-in server that halves the CPU of the post.

Each thread posts on a connection of its own, which the pool makes
(``create_connection``: the kind the pool would, through a proxy too) and which is made
anew once closed or expired. A worker's threads are its slots, so a thread holds one
call at a time and the connections are as many as the pool would open under full load;
the pool itself is not entered: under its lock it passes over every connection on each
request and each release, which with 50 threads cost a third of the post's CPU and
kept the other threads waiting.

What the client does and the pool alone does not, the endpoint does: the timeout of each
call (connect, read, write and pool), exceptions of the client's types (``httpx2``'s
``ReadTimeout``, ``ConnectError``...: the pool's are mapped as the client maps them),
decoding a compressed body, and a redirect (the call is sent again through the client,
which follows it). Cookies a vendor sets are not kept: model calls carry their auth in
headers.

The pool is reached through private names of ``httpx2``: the ``endpoint`` fast path
(:mod:`orchestration.state.fastpaths`) runs only on the httpx2 releases it is tested with;
otherwise every call goes through the SDK (``SDKProvider`` learns no endpoint).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

#: Headers the first call carried that belong to it alone (lengths, the SDK's retry
#: count and its timeouts, which a later call's own may differ from, its idempotency key):
#: not sent again.
PER_REQUEST_HEADERS = frozenset(
    {
        b"content-length",
        b"transfer-encoding",
        b"x-stainless-retry-count",
        b"x-stainless-read-timeout",
        b"x-stainless-timeout",
        b"idempotency-key",
    }
)


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP response, read whole: status, headers (names lower case), body."""

    status_code: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        """The body as JSON (``ValueError`` if it is not)."""
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The URL and headers of the SDK's first call, and the pool to post later calls on."""

    http: Any  # the SDK's httpx2.Client: redirects go through it
    url: Any  # httpx2.URL
    headers: list[tuple[bytes, bytes]]  # as sent, Host and auth included
    pool: Any  # the httpcore2 pool (or proxy) the client sends this URL to, or None
    target: Any  # httpcore2.URL
    #: Each thread's connection (``.connection``), made by ``pool``.
    local: threading.local = field(default_factory=threading.local, compare=False, repr=False)
    #: The threads' connections still open (for :meth:`close`).
    open: set[Any] = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def of(cls, http: Any, request: Any) -> Endpoint:
        """The endpoint ``request`` (an ``httpx2.Request`` as ``http`` sends it) went to."""
        import httpcore2
        import httpx2

        url = request.url
        transport = http._transport_for_url(url)
        # A transport of another kind (a mock, a custom mount) is only reached through
        # the client.
        pool = transport._pool if isinstance(transport, httpx2.HTTPTransport) else None
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in PER_REQUEST_HEADERS]
        target = httpcore2.URL(
            scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
        )
        return cls(http, url, headers, pool, target)

    def post(self, body: dict[str, Any], timeout_s: float) -> Reply:
        """POST ``body`` as JSON with every timeout ``timeout_s``; the whole response.

        Raises ``httpx2``'s exceptions, as the SDK's client would.
        """
        content = json.dumps(body).encode()
        if self.pool is None:
            return self._through_client(content, timeout_s)
        import httpcore2
        from httpx2._transports.default import map_httpcore_exceptions

        request = httpcore2.Request(
            b"POST",
            self.target,
            content=content,
            headers=[*self.headers, (b"Content-Length", b"%d" % len(content))],
            extensions={
                "timeout": {
                    "connect": timeout_s,
                    "read": timeout_s,
                    "write": timeout_s,
                    "pool": timeout_s,
                }
            },
        )
        with map_httpcore_exceptions():
            response = self._send(request)
            try:
                data = b"".join(response.stream)
            finally:
                response.close()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}
        status = response.status
        if 300 <= status < 400 and "location" in headers:
            return self._through_client(content, timeout_s)
        if headers.get("content-encoding", "identity") != "identity":
            import httpx2

            data = httpx2.Response(status, headers=response.headers, content=data).content
        return Reply(status, headers, data)

    def _send(self, request: Any) -> Any:
        """Send ``request`` on this thread's connection (a new one if it has none, or it
        is closed or expired, or it turns out not to be available)."""
        from httpcore2 import ConnectionNotAvailable

        connection = getattr(self.local, "connection", None)
        if connection is None or connection.is_closed() or connection.has_expired():
            connection = self._connect()
        try:
            return connection.handle_request(request)
        except ConnectionNotAvailable:
            # Closed by the server since the check (httpcore2 >= 2.17 finds one the server
            # dropped while idle only here: has_expired() no longer probes the socket).
            return self._connect().handle_request(request)

    def _connect(self) -> Any:
        """A new connection for this thread (its old one closed)."""
        old = getattr(self.local, "connection", None)
        if old is not None:
            self.open.discard(old)
            old.close()
        connection = self.local.connection = self.pool.create_connection(self.target.origin)
        self.open.add(connection)
        return connection

    def close(self) -> None:
        """Close every thread's connection (the SDK's client closes its pool)."""
        while self.open:
            self.open.pop().close()

    def _through_client(self, content: bytes, timeout_s: float) -> Reply:
        """Send through the SDK's client (it follows redirects and decodes)."""
        response = self.http.post(
            self.url, content=content, headers=self.headers, timeout=timeout_s
        )
        return Reply(response.status_code, dict(response.headers), response.content)
