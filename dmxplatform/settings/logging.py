"""Logging: one line per event to stderr; never a key secret (see apps.keys.secrets).

JSON lines in production (DMX_LOG_FORMAT=json, the default with DMX_DEBUG off), for a log
pipeline to index; plain text in development. Either way every line a request causes carries
its request id (dmxplatform.logs), and uvicorn's own lines go through the same handler.
"""

from django.core.exceptions import ImproperlyConfigured

from dmxplatform.env import env_str
from dmxplatform.settings.base import DEBUG

DMX_LOG_LEVEL = env_str("DMX_LOG_LEVEL", "INFO")
DMX_LOG_FORMAT = env_str("DMX_LOG_FORMAT", "plain" if DEBUG else "json")
if DMX_LOG_FORMAT not in ("json", "plain"):
    raise ImproperlyConfigured(f"DMX_LOG_FORMAT must be json or plain, got {DMX_LOG_FORMAT!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "request": {"()": "dmxplatform.logs.RequestIdFilter"},
    },
    "formatters": {
        # orjson, which the platform has anyway: the fastest of the library's encoders. Fields:
        # timestamp (ISO 8601, UTC), levelname, name, message, request_id, client_request_id
        # and trace_id within a request, exc_info with a traceback.
        "json": {
            "()": "pythonjsonlogger.orjson.OrjsonFormatter",
            "fmt": "%(levelname)s %(name)s %(message)s",
            "timestamp": True,
        },
        "plain": {
            "()": "logging.Formatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(request_id)s %(message)s",
            "defaults": {"request_id": "-"},  # a line of no request's
        },
    },
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "formatter": DMX_LOG_FORMAT,
            "filters": ["request"],
        },
    },
    "root": {"handlers": ["stderr"], "level": DMX_LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # uvicorn's lines, through this handler rather than the one uvicorn gives its logger
        # before Django starts. Only uvicorn.error's: uvicorn turns its access log off
        # (config.serve) by leaving uvicorn.access without a handler and unpropagated, and
        # configuring it or its parent "uvicorn" here would turn it back on.
        "uvicorn.error": {"handlers": ["stderr"], "propagate": False},
    },
}
