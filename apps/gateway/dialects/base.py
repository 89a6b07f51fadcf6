"""What every dialect provides (apps.gateway.dialects)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from apps.gateway.outputs import StreamEditor
from apps.gateway.schemas import CompletionRequest, Endpoint
from dmxplatform.errors import ApplicationError


@dataclass(frozen=True, slots=True)
class Answer:
    """What a dialect needs of one request to answer it."""

    request_id: str
    request: CompletionRequest
    identity: dict[str, str]  # outputs.identity: the model as the client named it, fingerprint

    def object_id(self, prefix: str) -> str:
        """An id of the answer, as its API spells them (`resp_…`, `msg_…`), that leads back to
        the request's."""
        return prefix + self.request_id.removeprefix("req_")


class StreamWriter(Protocol):
    """One streamed answer in the client's events. Chunks come shaped and filtered
    (outputs.StreamEditor); `end` closes the stream, `error` reports a failure inside it.
    `final`: the object the stream closed with, where the API keeps it (a stored response)."""

    final: dict[str, Any] | None

    def chunk(self, chunk: dict[str, Any]) -> bytes: ...

    def end(self, *, cut: bool) -> bytes:
        """The closing events; `cut`: the gateway ended the stream (the content filter)."""

    def error(self, error: ApplicationError) -> bytes: ...


class Dialect(Protocol):
    endpoint: Endpoint

    def parse(self, data: dict[str, Any]) -> CompletionRequest: ...

    def error_body(self, error: ApplicationError) -> bytes: ...

    def answer(
        self, completion: dict[str, Any], answer: Answer, stop: str | None
    ) -> dict[str, Any]:
        """The client's object for a whole completion (shaped and filtered); `stop`: the stop
        string that ended it, if one did."""

    def writer(self, answer: Answer, editor: StreamEditor) -> StreamWriter: ...


def named_event(name: str, data: bytes) -> bytes:
    """A server-sent event with its type named, as OpenAI's Responses and Anthropic's Messages
    streams send each one."""
    return b"event: %s\ndata: %s\n\n" % (name.encode(), data)


def stream_into(data: dict[str, Any], chat: dict[str, Any]) -> None:
    """Carry the client's `stream` into the chat request, asking for usage when it streams
    (the engine's chat validation refuses a `stream` that is no boolean, naming it)."""
    stream = data.get("stream")
    if stream is not None:
        chat["stream"] = stream
    if stream is True:
        chat["stream_options"] = {"include_usage": True}
