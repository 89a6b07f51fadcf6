"""Writes for files and batches: upload and delete files; create, cancel, validate, run and
finish batches. Every step is a transaction over rows, so that a worker lost at any point
leaves a batch the next worker carries on from."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, Any

import orjson
from django.conf import settings
from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.batches.choices import ENDED, BatchEndpoint, BatchStatus, FilePurpose, LineState
from apps.batches.errors import BatchesErrorCode
from apps.batches.models import Batch, BatchLine, File
from apps.gateway.state import new_request_id
from dmxplatform.errors import ConflictError, InvalidRequestError, NotFoundError

logger = logging.getLogger(__name__)

# What of a line's prompt decides which lines share a start (and so a node's cached prefix).
PREFIX_CHARS = 512
# Lines written to the database per statement while validating.
LINES_PER_INSERT = 1000


# Files ------------------------------------------------------------------------------------------


def file_create(
    *,
    tenant_id: int,
    api_key_id: int,
    purpose: str,
    filename: str,
    content: IO[bytes],
    size: int,
    expires_after: int | None = None,
) -> File:
    """Store an uploaded file: its bytes in the `batch_files` storage, its row here. A batch
    file expires DMX_FILES_RETENTION_DAYS after upload, or `expires_after` seconds when sooner."""
    if purpose != FilePurpose.BATCH:
        raise InvalidRequestError(
            f"This platform keeps files for batches only: `purpose` must be `batch`, not "
            f"`{purpose}`.",
            param="purpose",
            code=BatchesErrorCode.UNSUPPORTED_PURPOSE,
        )
    retention = settings.DMX_FILES_RETENTION_DAYS * 86400
    if expires_after is not None and not 3600 <= expires_after <= retention:
        raise InvalidRequestError(
            f"`expires_after[seconds]` must be between 3600 and {retention}.",
            param="expires_after",
        )
    file = File(
        tenant_id=tenant_id,
        api_key_id=api_key_id,
        purpose=purpose,
        filename=filename[:255] or "upload.jsonl",
        bytes=size,
        expires_at=timezone.now() + timedelta(seconds=expires_after or retention),
    )
    file.content.save(file.id, content, save=False)
    try:
        file.save()
    except BaseException:
        file.content.delete(save=False)
        raise
    return file


def _output_file(batch: Batch, name: str, lines: Iterable[bytes]) -> File | None:
    body = b"".join(lines)
    if not body:
        return None
    file = File(
        tenant_id=batch.tenant_id,
        api_key_id=batch.api_key_id,
        purpose=FilePurpose.BATCH_OUTPUT,
        filename=f"{batch.id}_{name}.jsonl",
        bytes=len(body),
        expires_at=timezone.now() + timedelta(days=settings.DMX_FILES_RETENTION_DAYS),
    )
    file.content.save(file.id, ContentFile(body), save=False)
    file.save()
    return file


def file_delete(file: File) -> None:
    """Delete a file and its bytes. A batch still validating it fails for want of it."""
    file.content.delete(save=False)
    file.delete()


def files_purge() -> int:
    """Delete the files past their expiry; returns how many."""
    expired = File.objects.filter(expires_at__lte=timezone.now())
    count = 0
    for file in expired.iterator():
        file_delete(file)
        count += 1
    return count


# Batches: created, cancelled -------------------------------------------------------------------


def batch_create(
    *,
    tenant_id: int,
    api_key_id: int,
    client_address: str,
    input_file_id: Any,
    endpoint: Any,
    completion_window: Any,
    metadata: Any = None,
) -> Batch:
    """A new batch of the tenant's file, to be validated by a batch worker."""
    if endpoint not in BatchEndpoint.values:
        raise InvalidRequestError(
            f"`endpoint` must be one of {', '.join(BatchEndpoint.values)}.",
            param="endpoint",
            code=BatchesErrorCode.UNSUPPORTED_ENDPOINT,
        )
    if completion_window != "24h":
        raise InvalidRequestError(
            "`completion_window` must be `24h`.", param="completion_window", code="invalid_value"
        )
    _check_metadata(metadata)
    if not isinstance(input_file_id, str):
        raise InvalidRequestError("`input_file_id` must be a string.", param="input_file_id")
    file = File.objects.filter(id=input_file_id, tenant_id=tenant_id).first()
    if file is None:
        raise NotFoundError(f"No file found with id '{input_file_id}'.", param="input_file_id")
    if file.purpose != FilePurpose.BATCH:
        raise InvalidRequestError(
            f"File {file.id} has purpose `{file.purpose}`; a batch's input must be `batch`.",
            param="input_file_id",
        )
    return Batch.objects.create(
        tenant_id=tenant_id,
        api_key_id=api_key_id,
        client_address=client_address[:64],
        input_file=file,
        endpoint=endpoint,
        completion_window=completion_window,
        metadata=metadata,
        expires_at=timezone.now() + timedelta(hours=24),
    )


def _check_metadata(metadata: Any) -> None:
    """OpenAI's metadata: up to 16 string pairs, keys of 64 characters, values of 512."""
    if metadata is None:
        return
    if not (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()
        )
    ):
        raise InvalidRequestError(
            "`metadata` holds at most 16 pairs of strings (keys up to 64 characters, values "
            "up to 512).",
            param="metadata",
        )


def batch_cancel(batch_id: str, tenant_id: int) -> Batch:
    """Cancel a batch: lines not started are not run; those running finish and are delivered
    with the rest when the worker ends it. A batch that ended cannot be cancelled."""
    with transaction.atomic():
        batch = Batch.objects.select_for_update().filter(id=batch_id, tenant_id=tenant_id).first()
        if batch is None:
            raise NotFoundError(f"No batch found with id '{batch_id}'.")
        if batch.status in ENDED:
            raise ConflictError(
                f"Batch {batch.id} is {batch.status}: only a batch still running can be cancelled.",
                code=BatchesErrorCode.BATCH_ENDED,
            )
        if batch.status != BatchStatus.CANCELLING:
            batch.status = BatchStatus.CANCELLING
            batch.cancelling_at = timezone.now()
            batch.save(update_fields=["status", "cancelling_at"])
    return batch


# Batches: validated ----------------------------------------------------------------------------


class FileRefused(Exception):
    """The input file as a whole cannot be a batch: `errors` in OpenAI's BatchError shape."""

    def __init__(self, code: str, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.error = {"code": code, "message": message, "param": None, "line": line}


def batch_validate(batch: Batch) -> None:
    """Read the batch's file into lines. A file that is not JSON Lines fails the batch with a
    message naming the line; a line that is JSON but not a request the batch can run (no
    custom_id, a repeated one, another method, an endpoint not served) is kept to be answered in
    the error file, and the rest runs. What a request's body asks for is the API's to judge when
    the line runs (a model unknown, a prompt over the context): its answer goes in the error
    file as the API gave it."""
    try:
        lines = _parse(batch)
    except FileRefused as refused:
        _fail(batch, refused.error)
        return
    with transaction.atomic():
        locked = Batch.objects.select_for_update().get(id=batch.id)
        if locked.status != BatchStatus.VALIDATING:  # cancelled meanwhile
            return
        BatchLine.objects.filter(batch=batch).delete()  # a validation lost halfway, redone
        BatchLine.objects.bulk_create(lines, batch_size=LINES_PER_INSERT)
        failed = sum(line.state == LineState.FAILED for line in lines)
        models = [line.body.get("model") for line in lines if line.body]
        Batch.objects.filter(id=batch.id).update(
            status=BatchStatus.IN_PROGRESS,
            in_progress_at=timezone.now(),
            total=len(lines),
            failed=failed,
            model=next((m for m in models if isinstance(m, str)), "")[:128],
        )


def _fail(batch: Batch, error: dict[str, Any]) -> None:
    Batch.objects.filter(id=batch.id, status=BatchStatus.VALIDATING).update(
        status=BatchStatus.FAILED,
        failed_at=timezone.now(),
        errors={"object": "list", "data": [error]},
    )


def _parse(batch: Batch) -> list[BatchLine]:
    file = batch.input_file
    if file is None:
        raise FileRefused("file_not_found", "The batch's input file was deleted.")
    lines: list[BatchLine] = []
    seen: set[str] = set()
    try:
        handle = file.content.open("rb")
    except FileNotFoundError:
        raise FileRefused("file_not_found", "The batch's input file is gone.") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            if len(lines) >= settings.DMX_BATCH_MAX_LINES:
                raise FileRefused(
                    "too_many_requests",
                    f"A batch holds at most {settings.DMX_BATCH_MAX_LINES} requests; line "
                    f"{number} is one too many.",
                    number,
                )
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise FileRefused(
                    "invalid_json_line",
                    f"Line {number} of the input file is not valid JSON: {exc}.",
                    number,
                ) from None
            lines.append(_line(batch, number, data, seen))
    if not lines:
        raise FileRefused("empty_file", "The input file holds no request.")
    return lines


def _line(batch: Batch, number: int, data: Any, seen: set[str]) -> BatchLine:
    line = BatchLine(batch=batch, index=number)
    if not isinstance(data, dict):
        return _refused(line, "invalid_request", "A line must be a JSON object.")
    custom_id = data.get("custom_id")
    if isinstance(custom_id, str):
        line.custom_id = custom_id[:512]
    line.url = url = data.get("url") if isinstance(data.get("url"), str) else ""
    body = data.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        return _refused(line, "missing_custom_id", "`custom_id` must be a non-empty string.")
    if custom_id in seen:
        return _refused(
            line,
            "duplicate_custom_id",
            f"The custom_id `{custom_id}` is on an earlier line: each must be unique.",
        )
    seen.add(custom_id)
    if data.get("method") != "POST":
        return _refused(line, "invalid_method", "`method` must be `POST`.")
    if url not in BatchEndpoint.values:
        return _refused(
            line,
            "invalid_url",
            f"`url` must be one of {', '.join(BatchEndpoint.values)}.",
        )
    if not isinstance(body, dict):
        return _refused(line, "invalid_body", "`body` must be a JSON object.")
    line.body = body
    line.prefix_key = _prefix_key(body)
    return line


def _refused(line: BatchLine, code: str, message: str) -> BatchLine:
    line.state = LineState.FAILED
    line.error = {"code": code, "message": f"Line {line.index}: {message}"}
    return line


def _prefix_key(body: dict[str, Any]) -> str:
    """The start of a line's prompt, hashed: lines that share it run one after another."""
    prompt = body.get("messages") or body.get("input") or body.get("prompt") or ""
    text = json.dumps(prompt, ensure_ascii=False, sort_keys=True)[:PREFIX_CHARS]
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# Batches: run ----------------------------------------------------------------------------------


def batch_hold(*, now=None) -> Batch | None:
    """Take a batch to work on that no live worker holds (the oldest waiting), holding it for
    DMX_BATCH_HOLD_SECONDS; lines a lost holder left running go back to pending."""
    now = now or timezone.now()
    with transaction.atomic():
        batch = (
            Batch.objects.select_for_update(skip_locked=True)
            .filter(
                status__in=[
                    BatchStatus.VALIDATING,
                    BatchStatus.IN_PROGRESS,
                    BatchStatus.FINALIZING,
                    BatchStatus.CANCELLING,
                ]
            )
            .filter(Q(held_until__isnull=True) | Q(held_until__lt=now))
            .order_by("created_at")
            .first()
        )
        if batch is None:
            return None
        batch.held_until = now + timedelta(seconds=settings.DMX_BATCH_HOLD_SECONDS)
        batch.save(update_fields=["held_until"])
        BatchLine.objects.filter(batch=batch, state=LineState.RUNNING).update(
            state=LineState.PENDING, resumed=True
        )
    return batch


def batch_renew(batch: Batch) -> Batch:
    """Renew the hold and read the batch as it is now (a cancel may have come)."""
    now = timezone.now()
    Batch.objects.filter(id=batch.id).update(
        held_until=now + timedelta(seconds=settings.DMX_BATCH_HOLD_SECONDS)
    )
    return Batch.objects.get(id=batch.id)


def batch_release(batch: Batch) -> None:
    Batch.objects.filter(id=batch.id).update(held_until=None)


def lines_claim(batch: Batch, count: int) -> list[BatchLine]:
    """Up to `count` pending lines due now, marked running, each with the request id of its
    try: those sharing a prompt's start together, in file order otherwise. A try is counted
    (`attempts`) when claimed; a lost worker's try goes again as the same try."""
    now = timezone.now()
    with transaction.atomic():
        lines = list(
            BatchLine.objects.select_for_update(skip_locked=True)
            .filter(batch=batch, state=LineState.PENDING)
            .filter(Q(not_before__isnull=True) | Q(not_before__lte=now))
            .order_by("prefix_key", "index")[:count]
        )
        for line in lines:
            if not line.resumed:
                line.request_id = new_request_id()
                line.attempts += 1
            line.state, line.resumed = LineState.RUNNING, False
        BatchLine.objects.bulk_update(lines, ["state", "request_id", "attempts", "resumed"])
    return lines


def lines_waiting(batch: Batch) -> tuple[int, float | None]:
    """Lines not ended yet, and the seconds until the next deferred one is due (None: one is
    due now or none is deferred)."""
    open_lines = BatchLine.objects.filter(
        batch=batch, state__in=[LineState.PENDING, LineState.RUNNING]
    )
    count = open_lines.count()
    due = open_lines.filter(state=LineState.PENDING).order_by("not_before").first()
    if due is None or due.not_before is None:
        return count, None
    return count, max((due.not_before - timezone.now()).total_seconds(), 0.0)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the pipeline answered a line's try: its status and body (JSON, as sent)."""

    status: int
    body: bytes
    retry_after: float = 0.0

    @property
    def transient(self) -> bool:
        """Refused for now (no spare capacity, a rate limit): the line waits and goes again."""
        return self.status in (429, 503)


def line_record(line: BatchLine, outcome: Outcome) -> None:
    """A line's answer, with the batch's counts and tokens, in one transaction: once recorded
    it is never run again."""
    update: dict[str, Any] = {}
    if outcome.transient:
        update.update(
            state=LineState.PENDING,
            not_before=timezone.now() + timedelta(seconds=max(outcome.retry_after, 0.5)),
            attempts=F("attempts") - 1,  # waiting for room is no failed try
        )
    elif outcome.status >= 500 and line.attempts < settings.DMX_BATCH_MAX_ATTEMPTS:
        update.update(state=LineState.PENDING, not_before=timezone.now() + timedelta(seconds=1))
    else:
        ok = 200 <= outcome.status < 300
        update.update(
            state=LineState.DONE if ok else LineState.FAILED,
            status_code=outcome.status,
            response=outcome.body,
        )
        prompt, cached, completion = _tokens(outcome.body)
    with transaction.atomic():
        updated = BatchLine.objects.filter(id=line.id, state=LineState.RUNNING).update(**update)
        if not updated or update["state"] == LineState.PENDING:
            return
        Batch.objects.filter(id=line.batch_id).update(
            completed=F("completed") + int(update["state"] == LineState.DONE),
            failed=F("failed") + int(update["state"] == LineState.FAILED),
            input_tokens=F("input_tokens") + prompt,
            cached_tokens=F("cached_tokens") + cached,
            output_tokens=F("output_tokens") + completion,
        )


def _tokens(body: bytes) -> tuple[int, int, int]:
    """(input, cached, output) tokens of an answer's usage, in any endpoint's names."""
    try:
        usage = orjson.loads(body).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return 0, 0, 0
    if not isinstance(usage, dict):
        return 0, 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens")) or 0
    completion = usage.get("completion_tokens", usage.get("output_tokens")) or 0
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return int(prompt), int(details.get("cached_tokens") or 0), int(completion)


def batch_end(batch: Batch) -> str:
    """Finish a batch with no line left to run, or one cancelled or past its window: lines not
    run go to the error file (`batch_cancelled`, `batch_expired`), the output and error files
    are written from the lines, and the batch ends completed, cancelled or expired."""
    now = timezone.now()
    if batch.status == BatchStatus.FINALIZING:  # its lines all ran; writing its files was lost
        final, skipped = BatchStatus.COMPLETED, None
    elif batch.status == BatchStatus.CANCELLING:
        final, skipped = BatchStatus.CANCELLED, ("batch_cancelled", "The batch was cancelled.")
    elif batch.expires_at <= now:
        final, skipped = (
            BatchStatus.EXPIRED,
            (
                "batch_expired",
                "The batch expired before this request could be run.",
            ),
        )
    else:
        final, skipped = BatchStatus.COMPLETED, None
    if skipped is not None:
        code, message = skipped
        BatchLine.objects.filter(batch=batch, state=LineState.PENDING).update(
            state=LineState.SKIPPED, error={"code": code, "message": message}
        )
    if final == BatchStatus.COMPLETED:
        Batch.objects.filter(id=batch.id).update(
            status=BatchStatus.FINALIZING, finalizing_at=batch.finalizing_at or now
        )
    lines = BatchLine.objects.filter(batch=batch).order_by("index")
    output = _output_file(
        batch, "output", (_output_line(line) for line in lines.filter(state=LineState.DONE))
    )
    errors = _output_file(
        batch,
        "error",
        (
            _output_line(line)
            for line in lines.filter(state__in=[LineState.FAILED, LineState.SKIPPED])
        ),
    )
    stamp = {
        BatchStatus.COMPLETED: "completed_at",
        BatchStatus.CANCELLED: "cancelled_at",
        BatchStatus.EXPIRED: "expired_at",
    }[final]
    Batch.objects.filter(id=batch.id).update(
        status=final,
        output_file=output,
        error_file=errors,
        held_until=None,
        **{stamp: timezone.now()},
    )
    return final


def _output_line(line: BatchLine) -> bytes:
    """A line as OpenAI's output and error files write it: the API's answer under `response`,
    or, for a line that never reached the API, `error`."""
    answered = line.status_code is not None
    record = {
        "id": f"batch_req_{line.batch_id.removeprefix('batch_')}_{line.index}",
        "custom_id": line.custom_id or None,
        "response": (
            {
                "status_code": line.status_code,
                "request_id": line.request_id,
                "body": orjson.Fragment(bytes(line.response or b"{}")),
            }
            if answered
            else None
        ),
        "error": None if answered else line.error,
    }
    return orjson.dumps(record) + b"\n"
