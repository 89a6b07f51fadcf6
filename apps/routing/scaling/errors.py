"""Autoscaling's stable error codes, and the error a scaler raises when it cannot act."""

from enum import StrEnum

from dmxplatform.errors import ApplicationError


class ScalingErrorCode(StrEnum):
    SCALER_FAILED = "scaler_failed"
    POLICY_MISCONFIGURED = "scaling_policy_misconfigured"
    POLICY_INACTIVE = "scaling_policy_inactive"
    POLICY_NOT_FOUND = "scaling_policy_not_found"
    INVALID_ALERTMANAGER_TOKEN = "invalid_alertmanager_token"
    ALERTMANAGER_NOT_CONFIGURED = "alertmanager_not_configured"


class ScalingError(ApplicationError):
    """A scaler could not read or change a replica count (API server, process start, config)."""

    status = 502
    error_type = "server_error"
    default_code = ScalingErrorCode.SCALER_FAILED
