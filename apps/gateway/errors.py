"""The gateway's stable error codes, as clients see them in `error.code`."""

from enum import StrEnum


class GatewayErrorCode(StrEnum):
    INVALID_JSON = "invalid_json"
    MISSING_PARAMETER = "missing_required_parameter"
    INVALID_TYPE = "invalid_type"
    INVALID_VALUE = "invalid_value"
    UNSUPPORTED_PARAMETER = "unsupported_parameter"
    UNSUPPORTED_VALUE = "unsupported_value"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    CONTENT_POLICY_VIOLATION = "content_policy_violation"
    NO_CAPACITY = "no_capacity"
    UPSTREAM_ERROR = "upstream_error"
    STATE_UNAVAILABLE = "state_unavailable"
    NOT_FOUND = "not_found"
    UNSUPPORTED_MODEL = "unsupported_model"
    INTERNAL_ERROR = "internal_error"
    # Stored responses (/v1/responses/{id}, previous_response_id, cancel).
    RESPONSE_NOT_FOUND = "response_not_found"
    RESPONSE_NOT_CONTINUABLE = "response_not_continuable"
    RESPONSE_NOT_CANCELLABLE = "response_not_cancellable"
    RESPONSE_NOT_STREAMABLE = "response_not_streamable"
