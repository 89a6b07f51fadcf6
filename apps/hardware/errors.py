from enum import StrEnum


class HardwareErrorCode(StrEnum):
    INVALID_NODE_TOKEN = "invalid_node_token"
    NODE_NOT_FOUND = "node_not_found"
    INVALID_PAYLOAD = "invalid_payload"
