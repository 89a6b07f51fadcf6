"""Server-sent events as vLLM and OpenAI write them: `data: <json>\n\n`, ending `data: [DONE]`."""

from __future__ import annotations

SEPARATOR = b"\n\n"
DATA = b"data: "
DONE = b"[DONE]"


class EventSplitter:
    """Cut a byte stream into whole events; a partial event waits for the next chunk."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._pending + chunk if self._pending else chunk
        *events, self._pending = data.split(SEPARATOR)
        return events


def data_of(event: bytes) -> bytes | None:
    """Return an event's data field, or None for comments and other fields."""
    if event.startswith(DATA):
        return event[len(DATA) :]
    if event.startswith(b"data:"):
        return event[5:]
    return None


def encode(data: bytes) -> bytes:
    return DATA + data + SEPARATOR
