"""A stored response's record: what the gateway keeps of a response of /v1/responses (the
object and every input item before it), in Redis and in StoredResponse (apps.gateway.stored)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from apps.gateway.choices import ResponseStatus
from dmxplatform.records import JsonRecord
from dmxplatform.redis_client import tenant_rkey
from dmxplatform.streams import DurableStream

RESPONSES_STREAM = DurableStream(("responses", "stream"), title="Stored responses")


def hot_key(tenant_id: int, response_id: str, *suffix: str) -> str:
    """The Redis key of a tenant's response's copy (or of its `deleted` marker, its run's
    `events` or `cancel` flag): the tenant's id in it, so that no other tenant's request can
    name it."""
    return tenant_rkey(tenant_id, "resp", tenant_id, response_id, *suffix)


# A run still queued or in progress this long after the request timeout died with its process.
ABANDONED_MARGIN_SECONDS = 60.0
ENDED = frozenset(
    {
        ResponseStatus.COMPLETED,
        ResponseStatus.INCOMPLETE,
        ResponseStatus.FAILED,
        ResponseStatus.CANCELLED,
    }
)
_ITEM_PREFIXES = {
    "message": "msg_",
    "function_call": "fc_",
    "function_call_output": "fco_",
    "reasoning": "rs_",
}


@dataclass(slots=True)
class ResponseRecord(JsonRecord):
    """A stored response: the object as the client got it and every input item before it (the
    conversation so far, for the next turn)."""

    tenant_id: int
    api_key_id: int
    created_at: float
    response: dict[str, Any]
    input_items: list[dict[str, Any]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.response["id"]

    @property
    def status(self) -> str:
        return self.response["status"]

    @property
    def background(self) -> bool:
        return bool(self.response.get("background"))

    def history(self) -> list[dict[str, Any]]:
        """The conversation for the next turn: every item in and out."""
        return [*self.input_items, *self.response.get("output", ())]

    def as_of(self, now: float) -> ResponseRecord:
        """The record as a client should see it: a run its process left unfinished (it died)
        is failed, since no process can still be running it past the request timeout."""
        limit = settings.DMX_REQUEST_TIMEOUT_SECONDS + ABANDONED_MARGIN_SECONDS
        if self.status in ENDED or now - self.created_at < limit:
            return self
        response = {
            **self.response,
            "status": ResponseStatus.FAILED.value,
            "error": {
                "code": "server_error",
                "message": "The response's run was interrupted before it finished.",
            },
        }
        return ResponseRecord(
            self.tenant_id, self.api_key_id, self.created_at, response, self.input_items
        )


def input_items(items: list[dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    """The request's input items as OpenAI lists them (ResponseItemList): each with an id (those
    of earlier turns keep theirs) and a message's text as content parts."""
    hex_id = request_id.removeprefix("req_")
    out = []
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        item = {**item, "type": kind}
        if "id" not in item:
            item["id"] = f"{_ITEM_PREFIXES.get(kind, 'item_')}{hex_id}_in{index}"
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": content}]
            item.setdefault("status", "completed")
        out.append(item)
    return out
