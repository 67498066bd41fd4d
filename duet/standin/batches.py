"""The stand-in server's vendor batch APIs: OpenAI files + batches, Anthropic message batches.

What the real SDKs call, answered from memory::

    POST /v1/files                       upload a JSONL file (multipart, purpose=batch)
    GET  /v1/files/{id}[/content]        the file object, or its bytes
    POST /v1/batches                     {input_file_id, endpoint, completion_window}
    GET  /v1/batches/{id}                status, request_counts, output/error file ids
    POST /v1/batches/{id}/cancel
    POST /v1/messages/batches            {requests: [{custom_id, params}]}
    GET  /v1/messages/batches/{id}       processing_status, request_counts, results_url
    GET  /v1/messages/batches/{id}/results   JSONL, one result per request
    POST /v1/messages/batches/{id}/cancel

Each request of a batch comes due at an even share of the batch's completion delay after
it was created, and is answered — by the same code as a synchronous call, so usage and
prompt caching are the same — the first time the batch is looked at after that; the batch
ends when all have been. A plan (:meth:`BatchStore.set_plan`) sets the delay and makes
requests fail (those whose body contains ``fail_match``, with HTTP ``fail_status``) or
expire (``expire_match``, or every request still unanswered when ``expire`` is set). A
cancelled batch answers no more requests: the rest are cancelled.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from duet.standin.schemas import Kind, refusal, upload_refusal

#: ``answer(anthropic, body, key) -> (status, payload)``: one request, as if sent alone.
Answer = Callable[[bool, dict[str, Any], str], tuple[int, dict[str, Any]]]

_PLAN_FIELDS: dict[str, Any] = {
    "delay_s": (int, float),
    "fail_match": str,
    "fail_status": int,
    "expire_match": str,
    "expire": bool,
}
OPENAI_ENDPOINT = "/v1/chat/completions"
#: How long a batch may take before it expires, as the vendors state it.
WINDOW_S = 24 * 3600


class BatchError(Exception):
    """A request to the batch API the vendor would refuse: ``status`` and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Request:
    custom_id: str
    body: dict[str, Any]
    due: float
    #: ``succeeded`` / ``errored`` / ``expired`` / ``canceled``, with the reply or error.
    outcome: str | None = None
    status: int = 0
    payload: dict[str, Any] | None = None


@dataclass
class _Batch:
    id: str
    anthropic: bool
    key: str
    created: float
    requests: list[_Request]
    input_file_id: str | None = None
    metadata: dict[str, Any] | None = None
    cancel_at: float | None = None
    ended_at: float | None = None
    expired: bool = False
    output_file_id: str | None = None
    error_file_id: str | None = None
    polls: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class BatchStore:
    """Files and batches of both vendors, in memory. Thread-safe."""

    def __init__(self, answer: Answer, delay_s: float = 0.0) -> None:
        self._answer = answer
        self._lock = threading.RLock()
        self._start_delay_s = delay_s
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.plan: dict[str, Any] = {"delay_s": self._start_delay_s}
            self.files: dict[str, tuple[dict[str, Any], bytes]] = {}
            self.batches: dict[str, _Batch] = {}

    def set_plan(self, plan: dict[str, Any]) -> None:
        """Replace the plan (fields left out: off; ``delay_s`` kept when left out)."""
        unknown = set(plan) - set(_PLAN_FIELDS)
        if unknown:
            raise ValueError(
                f"unknown batch plan fields {sorted(unknown)}; known: {sorted(_PLAN_FIELDS)}"
            )
        for name, kind in _PLAN_FIELDS.items():
            if plan.get(name) is not None and not isinstance(plan[name], kind):
                raise ValueError(f"batch plan field {name!r} has the wrong type: {plan[name]!r}")
        with self._lock:
            delay = plan.get("delay_s", self.plan.get("delay_s", 0.0))
            self.plan = {k: v for k, v in plan.items() if v is not None}
            self.plan["delay_s"] = float(delay)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "batches": len(self.batches),
                "batch_requests": sum(len(b.requests) for b in self.batches.values()),
                "cancelled": sorted(b.id for b in self.batches.values() if b.cancel_at is not None),
                "polls": {b.id: b.polls for b in self.batches.values()},
            }

    # --- OpenAI ------------------------------------------------------------------------
    def upload(self, content_type: str, raw: bytes) -> dict[str, Any]:
        """``POST /v1/files`` with a multipart body."""
        form = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw
        )
        if not form.is_multipart():
            raise BatchError(400, "expected a multipart/form-data upload")
        fields: dict[str, tuple[str | None, bytes]] = {}
        for part in form.iter_parts():
            name = part.get_param("name", header="content-disposition")
            data = part.get_payload(decode=True)
            fields[str(name)] = (part.get_filename(), data if isinstance(data, bytes) else b"")
        problem = upload_refusal(
            {name: value.decode(errors="replace") for name, (_, value) in fields.items()}
        )
        if problem is not None:
            raise BatchError(400, problem)
        purpose = fields["purpose"][1].decode()
        filename, data = fields["file"]
        return self._store_file(data, filename or "upload.jsonl", purpose)

    def _store_file(self, data: bytes, filename: str, purpose: str) -> dict[str, Any]:
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        meta = {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        with self._lock:
            self.files[file_id] = (meta, data)
        return meta

    def file(self, file_id: str) -> tuple[dict[str, Any], bytes]:
        with self._lock:
            if file_id not in self.files:
                raise BatchError(404, f"no file {file_id!r}")
            return self.files[file_id]

    def create_openai(self, body: dict[str, Any], key: str) -> dict[str, Any]:
        """``POST /v1/batches``."""
        _check("openai.batch", body)
        if body.get("endpoint") != OPENAI_ENDPOINT:
            raise BatchError(
                400, f"endpoint must be {OPENAI_ENDPOINT!r}, got {body.get('endpoint')!r}"
            )
        if body.get("completion_window") != "24h":
            raise BatchError(400, "completion_window must be '24h'")
        meta, data = self.file(str(body.get("input_file_id")))
        if meta["purpose"] != "batch":
            raise BatchError(400, f"file {meta['id']} has purpose {meta['purpose']!r}, not 'batch'")
        lines = [line for line in data.decode().splitlines() if line.strip()]
        requests = []
        for n, line in enumerate(lines, start=1):
            try:
                item = json.loads(line)
                _check("openai.batch_line", item, f"input file line {n}: ")
                requests.append((str(item["custom_id"]), item["body"], item.get("url")))
            except (ValueError, KeyError, TypeError) as exc:
                raise BatchError(400, f"input file line {n}: {exc}") from None
        ids = [r[0] for r in requests]
        if len(set(ids)) != len(ids):
            raise BatchError(400, "custom_id values must be unique within a batch")
        for custom_id, _, url in requests:
            if url != OPENAI_ENDPOINT:
                raise BatchError(400, f"request {custom_id}: url must be {OPENAI_ENDPOINT!r}")
        batch = self._new("batch_", False, key, [(r[0], r[1]) for r in requests])
        batch.input_file_id = meta["id"]
        batch.metadata = body.get("metadata")
        return self.openai(batch.id)

    def openai(self, batch_id: str, *, cancel: bool = False) -> dict[str, Any]:
        """``GET /v1/batches/{id}`` (or its cancel): the batch object, moved on."""
        batch = self._batch(batch_id, anthropic=False, cancel=cancel)
        with self._lock:
            counts = self._counts(batch)
            if batch.ended_at is not None and batch.output_file_id is None and not batch.extra:
                self._openai_files(batch)
            status = (
                "in_progress"
                if batch.ended_at is None and batch.cancel_at is None
                else "cancelling"
                if batch.ended_at is None
                else "expired"
                if batch.expired
                else "cancelled"
                if batch.cancel_at is not None
                else "completed"
            )
            return {
                "id": batch.id,
                "object": "batch",
                "endpoint": OPENAI_ENDPOINT,
                "errors": None,
                "input_file_id": batch.input_file_id,
                "completion_window": "24h",
                "status": status,
                "output_file_id": batch.output_file_id,
                "error_file_id": batch.error_file_id,
                "created_at": int(batch.created),
                "in_progress_at": int(batch.created),
                "expires_at": int(batch.created + WINDOW_S),
                "finalizing_at": None,
                "completed_at": _int(batch.ended_at),
                "failed_at": None,
                "expired_at": _int(batch.ended_at) if batch.expired else None,
                "cancelling_at": _int(batch.cancel_at),
                "cancelled_at": (_int(batch.ended_at) if batch.cancel_at is not None else None),
                "request_counts": {
                    "total": len(batch.requests),
                    "completed": counts["succeeded"],
                    "failed": counts["errored"] + counts["expired"] + counts["canceled"],
                },
                "metadata": batch.metadata,
            }

    def _openai_files(self, batch: _Batch) -> None:
        out, err = [], []
        for r in batch.requests:
            line: dict[str, Any] = {
                "id": f"batch_req_{uuid.uuid4().hex[:24]}",
                "custom_id": r.custom_id,
            }
            if r.outcome == "succeeded":
                line.update(
                    response={
                        "status_code": 200,
                        "request_id": uuid.uuid4().hex,
                        "body": r.payload,
                    },
                    error=None,
                )
                out.append(line)
            elif r.outcome == "errored":
                line.update(
                    response={
                        "status_code": r.status,
                        "request_id": uuid.uuid4().hex,
                        "body": r.payload,
                    },
                    error=None,
                )
                err.append(line)
            elif r.outcome == "expired":
                line.update(
                    response=None,
                    error={
                        "code": "batch_expired",
                        "message": "This request could not be executed before the completion window expired.",
                    },
                )
                err.append(line)
            # cancelled requests appear in neither file
        batch.extra["files"] = True
        if out:
            batch.output_file_id = self._store_file(
                _jsonl(out), f"{batch.id}_output.jsonl", "batch_output"
            )["id"]
        if err:
            batch.error_file_id = self._store_file(
                _jsonl(err), f"{batch.id}_error.jsonl", "batch_output"
            )["id"]

    # --- Anthropic -----------------------------------------------------------------------
    def create_anthropic(self, body: dict[str, Any], key: str, base: str) -> dict[str, Any]:
        """``POST /v1/messages/batches``."""
        _check("anthropic.batch", body)
        raw = body.get("requests")
        if not isinstance(raw, list) or not raw:
            raise BatchError(400, "requests: must be a non-empty list")
        requests = []
        for n, item in enumerate(raw):
            if not isinstance(item, dict) or not isinstance(item.get("params"), dict):
                raise BatchError(400, f"requests.{n}: needs custom_id and params")
            requests.append((str(item.get("custom_id")), item["params"]))
        ids = [r[0] for r in requests]
        if len(set(ids)) != len(ids):
            raise BatchError(400, "custom_id values must be unique within a batch")
        batch = self._new("msgbatch_", True, key, requests)
        return self.anthropic(batch.id, base=base)

    def anthropic(self, batch_id: str, *, base: str, cancel: bool = False) -> dict[str, Any]:
        """``GET /v1/messages/batches/{id}`` (or its cancel): the batch object, moved on."""
        batch = self._batch(batch_id, anthropic=True, cancel=cancel)
        with self._lock:
            counts = self._counts(batch)
            ended = batch.ended_at is not None
            return {
                "id": batch.id,
                "type": "message_batch",
                "processing_status": (
                    "ended"
                    if ended
                    else "canceling"
                    if batch.cancel_at is not None
                    else "in_progress"
                ),
                "request_counts": counts,
                "ended_at": _iso(batch.ended_at),
                "created_at": _iso(batch.created),
                "expires_at": _iso(batch.created + WINDOW_S),
                "archived_at": None,
                "cancel_initiated_at": _iso(batch.cancel_at),
                "results_url": f"{base}/v1/messages/batches/{batch.id}/results" if ended else None,
            }

    def anthropic_results(self, batch_id: str) -> bytes:
        """``GET /v1/messages/batches/{id}/results``: JSONL, once the batch has ended."""
        batch = self._batch(batch_id, anthropic=True)
        with self._lock:
            if batch.ended_at is None:
                raise BatchError(404, f"batch {batch_id} has not ended; no results yet")
            lines = []
            for r in batch.requests:
                result: dict[str, Any] = {"type": r.outcome}
                if r.outcome == "succeeded":
                    result["message"] = r.payload
                elif r.outcome == "errored":
                    result["error"] = r.payload
                lines.append({"custom_id": r.custom_id, "result": result})
            return _jsonl(lines)

    # --- both -----------------------------------------------------------------------------
    def _new(
        self, prefix: str, anthropic: bool, key: str, requests: list[tuple[str, Any]]
    ) -> _Batch:
        now = time.time()
        with self._lock:
            delay = float(self.plan.get("delay_s", 0.0))
            n = len(requests)
            batch = _Batch(
                id=f"{prefix}{uuid.uuid4().hex[:24]}",
                anthropic=anthropic,
                key=key,
                created=now,
                requests=[
                    _Request(cid, body if isinstance(body, dict) else {}, now + delay * (i + 1) / n)
                    for i, (cid, body) in enumerate(requests)
                ],
            )
            self.batches[batch.id] = batch
        return batch

    def _batch(self, batch_id: str, *, anthropic: bool, cancel: bool = False) -> _Batch:
        with self._lock:
            batch = self.batches.get(batch_id)
            if batch is None or batch.anthropic != anthropic:
                raise BatchError(404, f"no batch {batch_id!r}")
            batch.polls += 1
            now = time.time()
            if cancel and batch.cancel_at is None and batch.ended_at is None:
                batch.cancel_at = now
            self._advance(batch, now)
            return batch

    def _advance(self, batch: _Batch, now: float) -> None:
        """Answer the requests that have come due; end the batch when none is left."""
        if batch.ended_at is not None:
            return
        plan = self.plan
        for r in batch.requests:
            if r.outcome is not None:
                continue
            if batch.cancel_at is not None:
                r.outcome = "canceled"
            elif plan.get("expire"):
                r.outcome = "expired"
                batch.expired = True
            elif r.due <= now:
                text = json.dumps(r.body)
                if plan.get("expire_match") and plan["expire_match"] in text:
                    r.outcome = "expired"
                elif plan.get("fail_match") and plan["fail_match"] in text:
                    status = int(plan.get("fail_status", 400))
                    r.outcome, r.status = "errored", status
                    r.payload = _error_body(batch.anthropic, status, "simulated failure in a batch")
                else:
                    r.status, r.payload = self._answer(batch.anthropic, r.body, batch.key)
                    r.outcome = "succeeded" if r.status == 200 else "errored"
        if all(r.outcome is not None for r in batch.requests):
            batch.ended_at = now

    @staticmethod
    def _counts(batch: _Batch) -> dict[str, int]:
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        for r in batch.requests:
            counts[r.outcome or "processing"] += 1
        return counts


def _check(kind: Kind, body: Any, where: str = "") -> None:
    """Refuse, as the vendor would, a body its SDK's request type does not allow."""
    problem = refusal(kind, body)
    if problem is not None:
        raise BatchError(400, where + problem[0])


def _error_body(anthropic: bool, status: int, message: str) -> dict[str, Any]:
    if anthropic:
        return {
            "type": "error",
            "error": {
                "type": "invalid_request_error" if status < 500 else "api_error",
                "message": message,
            },
        }
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _int(t: float | None) -> int | None:
    return None if t is None else int(t)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"
