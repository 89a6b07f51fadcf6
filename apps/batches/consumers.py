"""/v1/files and /v1/batches as OpenAI's API serves them, as ASGI applications beside the
gateway's (config.asgi): authenticated as /v1 is (the key, its allowed networks, a signing key's
signature), a tenant's files and batches visible to any key of the tenant and to no one else.
The work is the services' and selectors'; this is HTTP."""

from __future__ import annotations

import mmap
import tempfile
from collections.abc import Awaitable, Callable
from typing import IO, Any

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.files.uploadhandler import TemporaryFileUploadHandler
from django.http.multipartparser import MultiPartParser, MultiPartParserError

from apps.batches import selectors, services
from apps.batches.errors import BatchesErrorCode
from apps.batches.objects import batch_object, file_object, page
from apps.batches.tasks import batches_work_task
from apps.gateway.runtime import get_runtime
from apps.gateway.state import new_request_id
from apps.gateway.stored import query_int
from apps.keys.gate import KeyRecord
from dmxplatform.clients import client_address
from dmxplatform.errors import ApplicationError, InvalidRequestError, RequestTooLargeError
from dmxplatform.responses import (
    dumps,
    header,
    method_not_allowed,
    query_params,
    read_body,
    receive_upload,
    send_error,
    send_json,
)

# A create call's JSON, or nothing (a read signs an empty body).
MAX_JSON_BODY_BYTES = 64 * 1024
# Multipart's own lines around the file: its boundary, headers and the `purpose` field.
MULTIPART_OVERHEAD_BYTES = 64 * 1024
CHUNK_BYTES = 256 * 1024

Handler = Callable[["Call"], Awaitable[Any]]
_db = sync_to_async  # each call's queries in Django's thread, as views' are


class Call:
    """One request: its key (authenticated), path arguments, query and body."""

    def __init__(self, scope: dict[str, Any], key: KeyRecord, address: str, body: Any) -> None:
        self.scope = scope
        self.key = key
        self.address = address
        self.body = body
        self.kwargs = scope["url_route"]["kwargs"]
        self.query = query_params(scope)

    def json(self) -> dict[str, Any]:
        try:
            data = orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError as exc:
            raise InvalidRequestError(f"The body is not valid JSON: {exc}.") from None
        if not isinstance(data, dict):
            raise InvalidRequestError("The body must be a JSON object.")
        return data

    def limit(self, most: int) -> int:
        """OpenAI's `limit`: 20 unless given, up to `most`."""
        limit = query_int(self.query, "limit", 20)
        if not 1 <= limit <= most:
            raise InvalidRequestError(f"`limit` must be from 1 to {most}.", param="limit")
        return limit


class Api:
    """One path's methods. Uploads (multipart) are spooled to a temporary file as they come,
    never held whole in memory."""

    def __init__(self, **handlers: Handler) -> None:
        self.handlers = {method.upper(): handler for method, handler in handlers.items()}
        self.allowed = ", ".join(self.handlers)

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        headers = [(b"x-request-id", new_request_id().encode())]
        handler = self.handlers.get(scope["method"])
        spool: IO[bytes] | None = None
        try:
            if handler is None:
                raise method_not_allowed(self.allowed)
            runtime = await get_runtime()
            if handler is _upload:
                spool = await _spool(receive)
                body: Any = _view(spool)
            else:
                body = await read_body(receive, MAX_JSON_BODY_BYTES)
            address = client_address(scope, runtime.trusted_proxies) or ""
            key, _ = await runtime.gate.authenticate(scope, body, address=address)
            call = Call(scope, key, address, spool if spool is not None else body)
            result = await handler(call)
            if isinstance(result, _Content):
                await result.send(send, headers)
            else:
                await send_json(send, 200, dumps(result), headers)
        except ApplicationError as error:
            await send_error(send, error, headers)
        finally:
            if spool is not None:
                spool.close()


async def _spool(receive) -> IO[bytes]:
    """The request's body in a temporary file, refused past DMX_FILES_MAX_BYTES."""
    limit = settings.DMX_FILES_MAX_BYTES + MULTIPART_OVERHEAD_BYTES
    spool = tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it, in Api.__call__)
    try:
        await receive_upload(
            receive, limit, spool.write, within=settings.DMX_FILES_UPLOAD_TIMEOUT_SECONDS
        )
    except RequestTooLargeError as refused:
        spool.close()
        raise RequestTooLargeError(
            f"A file may hold at most {settings.DMX_FILES_MAX_BYTES} bytes.",
            code=BatchesErrorCode.FILE_TOO_LARGE,
            headers=refused.headers,
        ) from None
    spool.flush()
    return spool


def _view(spool: IO[bytes]) -> bytes | mmap.mmap:
    """The spooled body as the signature check reads it, without a copy in memory."""
    size = spool.seek(0, 2)
    spool.seek(0)
    return mmap.mmap(spool.fileno(), size, access=mmap.ACCESS_READ) if size else b""


class _Content:
    """A file's bytes, sent in chunks from storage."""

    def __init__(self, file) -> None:
        self.file = file

    async def send(self, send, headers) -> None:
        handle = await _db(self.file.content.open)("rb")
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/octet-stream"),
                        (b"content-length", str(self.file.bytes).encode()),
                        *headers,
                    ],
                }
            )
            while chunk := await _db(handle.read, thread_sensitive=False)(CHUNK_BYTES):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            handle.close()


# Files ------------------------------------------------------------------------------------------


async def _upload(call: Call) -> dict[str, Any]:
    return await _db(_store_upload)(call)


def _store_upload(call: Call) -> dict[str, Any]:
    content_type = header(call.scope, b"content-type") or b""
    if not content_type.startswith(b"multipart/form-data"):
        raise InvalidRequestError(
            "Upload a file as multipart/form-data, with fields `file` and `purpose`."
        )
    spool = call.body
    size = spool.seek(0, 2)
    spool.seek(0)
    meta = {"CONTENT_TYPE": content_type.decode("latin-1"), "CONTENT_LENGTH": str(size)}
    try:
        fields, files = MultiPartParser(meta, spool, [TemporaryFileUploadHandler()]).parse()
    except MultiPartParserError as exc:
        raise InvalidRequestError(f"The multipart body cannot be read: {exc}.") from None
    upload = files.get("file")
    if upload is None:
        raise InvalidRequestError("The field `file` is required.", param="file")
    if upload.size > settings.DMX_FILES_MAX_BYTES:
        raise RequestTooLargeError(
            f"A file may hold at most {settings.DMX_FILES_MAX_BYTES} bytes.",
            param="file",
            code=BatchesErrorCode.FILE_TOO_LARGE,
        )
    seconds = "expires_after[seconds]"
    try:
        file = services.file_create(
            tenant_id=call.key.tenant_id,
            api_key_id=call.key.id,
            purpose=fields.get("purpose", ""),
            filename=upload.name or "",
            content=upload,
            size=upload.size,
            expires_after=query_int(fields, seconds, 0) if seconds in fields else None,
        )
    finally:
        upload.close()
    return file_object(file)


async def _files(call: Call) -> dict[str, Any]:
    order = call.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError("`order` must be `asc` or `desc`.", param="order")
    files, more = await _db(selectors.files_page)(
        call.key.tenant_id,
        purpose=call.query.get("purpose"),
        limit=call.limit(10_000),
        after=call.query.get("after"),
        ascending=order == "asc",
    )
    return page([file_object(file) for file in files], more)


async def _file(call: Call) -> dict[str, Any]:
    file = await _db(selectors.file_get)(call.kwargs["file_id"], call.key.tenant_id)
    return file_object(file)


async def _file_delete(call: Call) -> dict[str, Any]:
    def delete() -> str:
        file = selectors.file_get(call.kwargs["file_id"], call.key.tenant_id)
        services.file_delete(file)
        return file.id

    return {"id": await _db(delete)(), "object": "file", "deleted": True}


async def _file_content(call: Call) -> _Content:
    return _Content(await _db(selectors.file_get)(call.kwargs["file_id"], call.key.tenant_id))


# Batches ----------------------------------------------------------------------------------------


async def _batch_create(call: Call) -> dict[str, Any]:
    data = call.json()
    batch = await _db(services.batch_create)(
        tenant_id=call.key.tenant_id,
        api_key_id=call.key.id,
        client_address=call.address,
        input_file_id=data.get("input_file_id"),
        endpoint=data.get("endpoint"),
        completion_window=data.get("completion_window"),
        metadata=data.get("metadata"),
    )
    batches_work_task.delay()  # validation starts now, not at the next tick
    return batch_object(batch)


async def _batches(call: Call) -> dict[str, Any]:
    batches, more = await _db(selectors.batches_page)(
        call.key.tenant_id, limit=call.limit(100), after=call.query.get("after")
    )
    return page([batch_object(batch) for batch in batches], more)


async def _batch(call: Call) -> dict[str, Any]:
    return batch_object(await _db(selectors.batch_get)(call.kwargs["batch_id"], call.key.tenant_id))


async def _batch_cancel(call: Call) -> dict[str, Any]:
    return batch_object(
        await _db(services.batch_cancel)(call.kwargs["batch_id"], call.key.tenant_id)
    )


files = Api(post=_upload, get=_files)
file = Api(get=_file, delete=_file_delete)
file_content = Api(get=_file_content)
batches = Api(post=_batch_create, get=_batches)
batch = Api(get=_batch)
batch_cancel = Api(post=_batch_cancel)
