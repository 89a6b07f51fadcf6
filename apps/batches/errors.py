from enum import StrEnum


class BatchesErrorCode(StrEnum):
    UNSUPPORTED_PURPOSE = "unsupported_purpose"
    UNSUPPORTED_ENDPOINT = "unsupported_endpoint"
    FILE_TOO_LARGE = "file_too_large"
    BATCH_ENDED = "batch_ended"
