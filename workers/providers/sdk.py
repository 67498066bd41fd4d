"""What the vendor-SDK adapters share: one lazily created client, keys, errors, cleanup; a
subclass writes :meth:`SDKProvider._new_client`, :meth:`SDKProvider.request` (one call's
JSON body, also used in vendor batches) and :meth:`SDKProvider.read` (a reply).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import threading
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from orchestration.core import url_credentials
from orchestration.core.agents import AgentSpec
from orchestration.core.errors import ProviderError
from orchestration.state import fastpaths
from workers import secrets
from workers.providers.base import Completion, Message, Provider
from workers.providers.batch import (
    BatchRequest,
    BatchStatus,
    Outcome,
    cancelled,
    expired,
    missing,
)
from workers.providers.endpoint import Endpoint, Reply
from workers.providers.errors import classify_exception, error_for_status
from workers.providers.limits import read_limits

_T = TypeVar("_T")

#: Headers that carry a credential: none goes to a server no key is configured for.
AUTH_HEADERS = ("authorization", "x-api-key", "api-key")
#: What the SDK client is built with when no key is to be sent (its auth header is then
#: removed from every request): an SDK with no key argument would read one from the
#: environment or look for credentials files.
NO_KEY = "no-key-configured"
#: The HTTP libraries the SDKs post with: httpx2 since their 2.x/3.x lines, httpx before.
HTTP_LIBRARIES = ("httpx2", "httpx")
#: The port of a URL that names none.
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: The statuses that mean the server wants a (valid) key.
_AUTH_STATUSES = (401, 403)

#: What reading an unexpected reply shape raises (a missing key, a wrong type...).
REPLY_SHAPE_ERRORS = (KeyError, IndexError, TypeError, AttributeError, ValueError)


def install_hint(extras: str) -> str:
    """How to install Duet with ``extras``: from its repository at this release's tag, the
    ``Source`` of its metadata (the name is not published on the package index: whoever
    claimed it there would run code wherever it is installed)."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        meta = metadata("duet-review")
    except PackageNotFoundError:
        return f"install Duet with its {extras} extra"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [] if ", " in u)
    if "Source" not in urls:
        return f"install Duet with its {extras} extra"
    return f"pip install 'duet-review[{extras}] @ git+{urls['Source']}@v{meta['Version']}'"


def vendor_sdk(name: str) -> ModuleType:
    """The vendor's SDK (``openai``, ``anthropic``), imported on first use; a worker
    installed without it fails the call for good, naming the extra that brings it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ProviderError(
            f"the {name} SDK is not installed on this worker: {install_hint(name)}",
            kind="missing_sdk",
            transient=False,
        ) from exc


class SDKProvider(Provider):
    """One client (so one HTTP connection pool) per adapter, made on first use."""

    #: The environment variable named in messages when the agent names none.
    default_key_env: ClassVar[str]
    #: The endpoint of one model call, relative to the client's base URL.
    path: ClassVar[str]

    def __init__(self, *, base_url: str | None = None, api_key_env: str | None = None) -> None:
        super().__init__(base_url=base_url, api_key_env=api_key_env)
        self._client: Any = None
        self._http: Any = None
        self._endpoint: Endpoint | None = None
        self._key: str | None = None
        self._lock = threading.Lock()
        #: A server that is not the vendor's (a ``base_url``) with no key variable named
        #: (:func:`orchestration.core.agents.default_key_env`): it gets no credential.
        self.keyless = api_key_env is None and base_url is not None
        #: Where the client sends its calls: ``base_url`` without the ``user:${VARIABLE}@``
        #: part, whose credentials a request hook adds (:meth:`_url_credentials`).
        self.server_url = url_credentials.without_credentials(base_url) if base_url else None

    def client(self) -> Any:
        """The adapter's client, created on first use (``max_retries=0``: retries are ours)."""
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is None:
                hooks: list[Callable[[Any], None]] = []
                if self.keyless:
                    key = NO_KEY
                    hooks.append(_without_credentials)
                else:
                    found = os.environ.get(self.api_key_env) if self.api_key_env else None
                    key = self._key = found or self._missing_key()
                login = self._url_credentials()
                if login is not None and self.server_url is not None:
                    hooks.append(_basic_auth(self.server_url, login.header()))
                hooks.append(self._learn_endpoint)  # last: it learns the headers sent
                http = self._new_http({"request": hooks})
                self._http = http
                self._client = self._new_client(key, http)
            return self._client

    def _learn_endpoint(self, request: Any) -> None:
        """Note where the SDK posted its first call, with which headers (an HTTP client
        request hook: it sees the request as it goes out, auth included)."""
        if (
            self._endpoint is None
            and request.method == "POST"
            and fastpaths.enabled("endpoint")  # else every call goes through the SDK
            and (request.url.path.endswith(self.path))
        ):
            self._endpoint = Endpoint.of(self._http, request)

    @abstractmethod
    def _new_http(self, event_hooks: dict[str, list[Any]]) -> Any:
        """The SDK's default HTTP client (its connection pool and timeouts) with
        ``event_hooks``."""

    @abstractmethod
    def _new_client(self, key: str, http: Any) -> Any:
        """Import the SDK and build its client on ``http``."""

    @abstractmethod
    def request(
        self, agent: AgentSpec, messages: list[Message], structured: bool = False
    ) -> dict[str, Any]:
        """The JSON body of one call: ``agent``'s model, instructions and limits,
        ``messages``; with ``structured``, the critique's shape asked for natively."""

    @abstractmethod
    def read(self, data: dict[str, Any], structured: bool = False) -> Completion:
        """A reply body as a :class:`Completion` (its native critique read when the request
        asked for one); a shape it cannot read is ``bad_response``."""

    # --- vendor batches ------------------------------------------------------------------
    def submit_batch(self, requests: Sequence[BatchRequest]) -> str:
        """Submit ``requests`` as one vendor batch; its id.

        Raises:
            ProviderError: the vendor refused it (classified like a synchronous call).
        """
        if not requests:
            raise ValueError("a vendor batch needs at least one request")
        return self._batch_op(self._submit_batch, requests)

    def poll_batch(self, batch_id: str) -> BatchStatus:
        """Where the vendor batch is. Raises :class:`ProviderError` on failure."""
        return self._batch_op(self._poll_batch, batch_id)

    def batch_results(self, batch_id: str, expected: Mapping[str, bool]) -> dict[str, Outcome]:
        """Each request's outcome of an ended vendor batch, by custom id.

        ``expected`` maps each custom id submitted to whether it asked for the native
        critique. A request the vendor gives no result for is cancelled, expired or
        failed, as the batch's own status says.
        """
        found, status = self._batch_op(self._batch_results, batch_id, expected)
        for custom_id in expected.keys() - found.keys():
            if status.vendor_status in ("cancelled", "cancelling", "canceling"):
                found[custom_id] = cancelled(custom_id, self.name)
            elif status.vendor_status == "expired":
                found[custom_id] = expired(custom_id, self.name)
            else:
                found[custom_id] = missing(custom_id, self.name, status.vendor_status)
        return {custom_id: found[custom_id] for custom_id in expected}

    def cancel_batch(self, batch_id: str) -> BatchStatus:
        """Ask the vendor to cancel the batch; requests already answered keep their answers."""
        return self._batch_op(self._cancel_batch, batch_id)

    def _batch_op(self, op: Callable[..., _T], *args: Any) -> _T:
        try:
            return op(*args)
        except ProviderError:
            raise
        except Exception as exc:  # noqa: BLE001 - every vendor failure becomes one error type
            # Not chained (as in Provider.complete): the vendor's exception may quote the key.
            raise self.classify(exc) from None

    @abstractmethod
    def _submit_batch(self, requests: Sequence[BatchRequest]) -> str: ...

    @abstractmethod
    def _poll_batch(self, batch_id: str) -> BatchStatus: ...

    @abstractmethod
    def _batch_results(
        self, batch_id: str, expected: Mapping[str, bool]
    ) -> tuple[dict[str, Outcome], BatchStatus]: ...

    @abstractmethod
    def _cancel_batch(self, batch_id: str) -> BatchStatus: ...

    def _call(self, agent: AgentSpec, messages: list[Message], structured: bool) -> Completion:
        body = self.request(agent, messages, structured)
        reply, headers = self._post(self.path, body, agent.timeout_s)
        return replace(self.read(reply, structured), limits=read_limits(headers))

    def _url_credentials(self) -> url_credentials.BasicCredentials | None:
        """The basic-auth credentials ``base_url`` names, read from this worker's
        environment (a missing variable is a run error naming it, as a missing key is)."""
        try:
            return url_credentials.credentials(self.base_url, os.environ)
        except url_credentials.MissingVariable as missing:
            raise ProviderError(
                f"{self.name}: no credentials for base_url {self.base_url}: environment "
                f"variable {missing.name} is not set on this worker",
                kind="missing_key",
                transient=False,
            ) from None

    def _missing_key(self) -> str:
        """The key to use when the variable is unset; by default, that is an error."""
        raise ProviderError(
            f"{self.name}: no API key: environment variable "
            f"{self.api_key_env or self.default_key_env} is not set on this worker",
            kind="missing_key",
            transient=False,
        )

    def _post(
        self, path: str, body: dict[str, Any], timeout_s: float
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        """POST ``body`` as one call and return the JSON reply and its headers (the
        vendor's rate limits are among them): the first through the SDK's ``client.post``,
        later ones with the endpoint it showed (:meth:`_learn_endpoint`), skipping the
        SDK's typed models and per-request layers (docs/performance.md)."""
        endpoint = self._endpoint
        if endpoint is None:  # the first call: through the SDK, which shows the endpoint
            client = self.client()
            # The SDKs hand back their raw response when asked for their HTTP library's.
            response = client.post(
                path, body=body, cast_to=response_type(self._http), options={"timeout": timeout_s}
            )
            headers: Mapping[str, str] = response.headers
            try:
                reply = response.json()
            except ValueError as exc:
                raise self._bad_reply(exc) from exc
        else:
            sent = endpoint.post(body, timeout_s)
            reply, headers = self._read_reply(sent), sent.headers
        if not isinstance(reply, dict):
            raise self._bad_reply("the reply is not a JSON object")
        return reply, headers

    def _read_reply(self, response: Reply) -> Any:
        """The JSON of a reply posted on the endpoint; an error status raised as the SDK's
        status errors are classified."""
        status = int(response.status_code)
        if status >= 400:
            raise self._explained(
                error_for_status(
                    status,
                    response.headers,
                    _error_message(response),
                    provider=self.name,
                    secrets=[self._key, *secrets.key_values()],
                    code=_error_code(response),
                )
            )
        try:
            return response.json()
        except ValueError as exc:
            raise self._bad_reply(exc) from exc

    def _bad_reply(self, what: str | Exception) -> ProviderError:
        """A reply Duet cannot read: permanent, as asking again gets the same."""
        if isinstance(what, Exception):
            what = f"unexpected reply shape ({type(what).__name__}: {what})"
        return ProviderError(
            secrets.redact(f"{self.name}: {what}"), kind="bad_response", transient=False
        )

    def classify(self, exc: Exception) -> ProviderError:
        # The key in use, and every other configured key, is scrubbed from the message.
        return self._explained(
            classify_exception(exc, provider=self.name, secrets=[self._key, *secrets.key_values()])
        )

    def _explained(self, error: ProviderError) -> ProviderError:
        """``error``, saying how to send a key when a server given none asks for one."""
        if (
            not self.keyless
            or error.status_code not in _AUTH_STATUSES
            or url_credentials.has_credentials(self.base_url)  # base_url's were sent
        ):
            return error
        return ProviderError(
            f"{error}; no key was sent to {self.base_url}, as it is not {self.name}'s own API: "
            "set api_key_env to the environment variable holding its key",
            kind=error.kind,
            transient=error.transient,
            retry_after=error.retry_after,
            status_code=error.status_code,
            limits=error.limits,
        )

    def warm(self) -> None:
        # A missing key is reported by complete(), on the run; here it is not an error.
        with contextlib.suppress(ProviderError):
            self.client()

    def close(self) -> None:
        """Close the HTTP connection pool (the next call opens a new client)."""
        with self._lock:
            client, self._client, self._http = self._client, None, None
            endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.close()
        if client is not None:
            client.close()


def response_type(http: Any) -> type:
    """The ``Response`` class of the HTTP library ``http`` is a client of: ``httpx2`` with
    today's SDKs, ``httpx`` with the older releases Duet still supports."""
    for cls in type(http).__mro__:
        library = cls.__module__.partition(".")[0]
        if library in HTTP_LIBRARIES:
            return importlib.import_module(library).Response  # type: ignore[no-any-return]
    raise TypeError(f"{type(http).__qualname__} is not a client of {' or '.join(HTTP_LIBRARIES)}")


def _without_credentials(request: Any) -> None:
    """Remove every credential header from ``request`` (an HTTP client request hook, run
    before the endpoint learns the headers, so later calls carry none either)."""
    for name in AUTH_HEADERS:
        request.headers.pop(name, None)


def _basic_auth(server_url: str, header: str) -> Callable[[Any], None]:
    """A request hook sending ``Authorization: header`` on requests to ``server_url``'s
    scheme, host and port only (a redirect elsewhere gets none)."""
    parts = urlsplit(server_url)
    origin = (parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme))

    def add(request: Any) -> None:
        url = request.url
        if (url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme)) == origin:
            request.headers["Authorization"] = header

    return add


def _error_message(response: Reply) -> str:
    """The vendor's message in an error response (``{"error": {"message": ...}}`` at
    OpenAI and Anthropic), else the start of its body."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:500]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return json.dumps(data)[:500]


def _error_code(response: Reply) -> object:
    """The vendor's ``error.code`` in an error response, or None."""
    try:
        data = response.json()
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    return error.get("code") if isinstance(error, dict) else None
