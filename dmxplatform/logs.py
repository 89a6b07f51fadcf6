"""The request a log line belongs to, on every line it causes, in whatever module logs it.

The gateway binds a request's ids once, when the request starts (`bind_request`); the filter on
the log handler (settings.LOGGING) copies them onto each record as `request_id`,
`client_request_id` and `trace_id`, which the JSON formatter writes as fields of their own. A
context variable follows the request's task and the tasks it starts, and nothing else: lines
of background work carry no request id. Per record the cost is reading the variable.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import NamedTuple


class RequestIds(NamedTuple):
    request_id: str
    client_request_id: str
    trace_id: str


_current: ContextVar[RequestIds | None] = ContextVar("dmx_request_ids", default=None)


def bind_request(request_id: str, *, client_request_id: str = "", trace_id: str = "") -> None:
    """Mark every line logged from here on in this task (and the tasks it starts) as the
    request's."""
    _current.set(RequestIds(request_id, client_request_id, trace_id))


class RequestIdFilter(logging.Filter):
    """Stamp a record with the ids of the request it was logged for; the empty ones are left
    off, and a record logged outside any request carries none."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = _current.get()
        if ids is not None:
            record.request_id = ids.request_id
            if ids.client_request_id:
                record.client_request_id = ids.client_request_id
            if ids.trace_id:
                record.trace_id = ids.trace_id
        return True
