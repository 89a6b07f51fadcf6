from enum import StrEnum


class RoutingErrorCode(StrEnum):
    NO_CAPACITY = "no_capacity"
