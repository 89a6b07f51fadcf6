"""Batches made as the API makes them (services), for the tests that look at them."""

from __future__ import annotations

import io
import json

from apps.batches import services
from apps.batches.models import Batch
from tests.keys.factories import make_api_key


def request_line(custom_id, url="/v1/chat/completions", text="Hello", **extra) -> dict:
    """One line of a batch's input file."""
    line = {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": "m", "messages": [{"role": "user", "content": text}]},
    }
    line.update(extra)
    return line


def make_batch(lines, key=None) -> Batch:
    """A batch of `lines` (dicts, or raw text lines), its file uploaded, not yet validated."""
    key = key or make_api_key()[0]
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    file = services.file_create(
        tenant_id=key.tenant_id,
        api_key_id=key.id,
        purpose="batch",
        filename="in.jsonl",
        content=io.BytesIO(text.encode()),
        size=len(text),
    )
    return services.batch_create(**create_arguments(key, file.id))


def create_arguments(key, input_file_id: str) -> dict:
    """services.batch_create's arguments for a chat batch of `key`'s over the file."""
    return dict(
        tenant_id=key.tenant_id,
        api_key_id=key.id,
        client_address="10.0.0.1",
        input_file_id=input_file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )


def validated_batch(lines, key=None) -> Batch:
    batch = make_batch(lines, key)
    services.batch_validate(batch)
    return Batch.objects.get(id=batch.id)


def finished_batch(key, answer: bytes = b'{"id": "chatcmpl-1"}') -> Batch:
    """A one-line batch whose line was answered `answer`, ended (its files written)."""
    batch = validated_batch([request_line("a")], key)
    [line] = services.lines_claim(batch, 1)
    services.line_record(line, services.Outcome(200, answer))
    batch.refresh_from_db()
    services.batch_end(batch)
    batch.refresh_from_db()
    return batch
