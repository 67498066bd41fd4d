"""Where a model call is posted after the first: straight onto the SDK client's pool.

The first call of an adapter goes through the SDK; the URL and headers it went out with
(auth included) make an :class:`Endpoint`. Later calls are sent on the connection pool
the SDK's HTTP client (an ``httpx2.Client``) picked for that URL: the same pool and
limits, TLS settings and proxy (one from the environment included), without the client's
per-request layers (request and response models, header and cookie merging, auth and
event hooks). Against the stand-in server that halves the CPU of the post.

What the client does and the pool alone does not, the endpoint does: the timeout of each
call (connect, read, write and pool), exceptions of the client's types (``httpx2``'s
``ReadTimeout``, ``ConnectError``...: the pool's are mapped as the client maps them),
decoding a compressed body, and a redirect (the call is sent again through the client,
which follows it). Cookies a vendor sets are not kept: model calls carry their auth in
headers.

The pool is reached through private names of ``httpx2``: :func:`check_versions` refuses
a release they are not tested with, at worker start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestration.state.broker import check_release

#: The httpx2 releases the private names below are tested with (the SDKs pull httpx2 in).
HTTPX2_TESTED = ">=2.16,<2.17"
#: Headers the first call carried that belong to it alone (lengths, the SDK's retry
#: count and its timeouts, which a later call's own may differ from, its idempotency key):
#: not sent again.
PER_REQUEST_HEADERS = frozenset({b"content-length", b"transfer-encoding",
                                 b"x-stainless-retry-count", b"x-stainless-read-timeout",
                                 b"x-stainless-timeout", b"idempotency-key"})  # fmt: skip


def check_versions() -> None:
    """Refuse (ConfigError) an httpx2 release outside :data:`HTTPX2_TESTED` or one
    lacking a private name :class:`Endpoint` uses."""
    import httpx2
    from httpx2._transports import default

    present = {
        "httpx2.Client._transport_for_url": hasattr(httpx2.Client, "_transport_for_url"),
        "httpx2.HTTPTransport._pool": "_pool" in httpx2.HTTPTransport.__init__.__code__.co_names,
        "httpx2._transports.default.map_httpcore_exceptions": hasattr(
            default, "map_httpcore_exceptions"
        ),
    }
    missing = [name for name, there in present.items() if not there]
    check_release("httpx2", httpx2.__version__, HTTPX2_TESTED, missing)


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
            b"POST", self.target, content=content,
            headers=[*self.headers, (b"Content-Length", b"%d" % len(content))],
            extensions={"timeout": {"connect": timeout_s, "read": timeout_s,
                                    "write": timeout_s, "pool": timeout_s}},
        )  # fmt: skip
        with map_httpcore_exceptions():
            response = self.pool.handle_request(request)
            try:
                data = b"".join(response.stream)
            finally:
                response.close()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in response.headers}  # fmt: skip
        status = response.status
        if 300 <= status < 400 and "location" in headers:
            return self._through_client(content, timeout_s)
        if headers.get("content-encoding", "identity") != "identity":
            import httpx2

            data = httpx2.Response(status, headers=response.headers, content=data).content
        return Reply(status, headers, data)

    def _through_client(self, content: bytes, timeout_s: float) -> Reply:
        """Send through the SDK's client (it follows redirects and decodes)."""
        response = self.http.post(self.url, content=content, headers=self.headers,
                                  timeout=timeout_s)  # fmt: skip
        return Reply(response.status_code, dict(response.headers), response.content)
