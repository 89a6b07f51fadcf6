from enum import StrEnum


class KeysErrorCode(StrEnum):
    INVALID_API_KEY = "invalid_api_key"
    KEY_REVOKED = "api_key_revoked"
    KEY_EXPIRED = "api_key_expired"
    SIGNATURE_REQUIRED = "signature_required"
    SIGNATURE_INVALID = "signature_invalid"
    SIGNATURE_EXPIRED = "signature_expired"
    SIGNATURE_REPLAYED = "signature_replayed"
    NETWORK_NOT_ALLOWED = "ip_not_allowed"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    INSUFFICIENT_QUOTA = "insufficient_quota"
    LIMITS_UNAVAILABLE = "limits_unavailable"
