from enum import StrEnum


class RoutingErrorCode(StrEnum):
    NO_CAPACITY = "no_capacity"
    # The gateway's code for the same refusal, for a prompt that fits the model but no node.
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
