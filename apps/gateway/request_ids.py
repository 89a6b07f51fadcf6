"""A client's own id for its request (X-Client-Request-Id), next to ours (X-Request-Id).

Kept with the usage record, on the request's log lines and answered back, so a client that
logged its id before sending can find the request even when no answer reached it (a timeout,
a dropped connection). OpenAI takes the header the same way and refuses a request whose value
it cannot keep with a 400 rather than trimming it: an altered id no longer matches what the
client logged, which is all it is for. Our bound is the usage record's column.
"""

from __future__ import annotations

import re
from typing import Any

from apps.gateway.errors import GatewayErrorCode
from dmxplatform.errors import InvalidRequestError
from dmxplatform.responses import Headers, header

CLIENT_REQUEST_ID_HEADER = b"x-client-request-id"
# UsageRecord.client_request_id's length: longer than any id scheme in use (a UUID is 36
# characters), short enough that the header cannot make each log line carry a payload.
MAX_CLIENT_REQUEST_ID = 128
# Printable ASCII, space included: nothing a log line or a header could be broken with.
_VALID = re.compile(rb"[\x20-\x7e]{1,%d}" % MAX_CLIENT_REQUEST_ID)


def accept_client_request_id(scope: dict[str, Any], headers: Headers) -> str:
    """Return the request's X-Client-Request-Id ("" without one) and add it to the response's
    `headers`; refuse one that is too long or not printable ASCII."""
    value = header(scope, CLIENT_REQUEST_ID_HEADER)
    if not value:
        return ""
    if _VALID.fullmatch(value) is None:
        raise InvalidRequestError(
            f"The X-Client-Request-Id header must be at most {MAX_CLIENT_REQUEST_ID} printable "
            "ASCII characters.",
            code=GatewayErrorCode.INVALID_VALUE,
        )
    headers.append((CLIENT_REQUEST_ID_HEADER, value))
    return value.decode("ascii")
