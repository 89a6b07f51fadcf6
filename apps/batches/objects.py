"""Files, batches and their lists as OpenAI's API writes them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from apps.batches.models import Batch, File


def _unix(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def file_object(file: File) -> dict[str, Any]:
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": _unix(file.created_at),
        "expires_at": _unix(file.expires_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
    }


def batch_object(batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model or None,
        "errors": batch.errors,
        "input_file_id": batch.input_file_id or "",
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _unix(batch.created_at),
        "in_progress_at": _unix(batch.in_progress_at),
        "expires_at": _unix(batch.expires_at),
        "finalizing_at": _unix(batch.finalizing_at),
        "completed_at": _unix(batch.completed_at),
        "failed_at": _unix(batch.failed_at),
        "expired_at": _unix(batch.expired_at),
        "cancelling_at": _unix(batch.cancelling_at),
        "cancelled_at": _unix(batch.cancelled_at),
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
        },
        "usage": {
            "input_tokens": batch.input_tokens,
            "input_tokens_details": {"cached_tokens": batch.cached_tokens},
            "output_tokens": batch.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": batch.input_tokens + batch.output_tokens,
        },
        "metadata": batch.metadata,
    }


def page(objects: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": objects,
        "first_id": objects[0]["id"] if objects else None,
        "last_id": objects[-1]["id"] if objects else None,
        "has_more": has_more,
    }
