"""Batches (/v1/files, /v1/batches): file limits and storage, and how batches run."""

import json

from django.core.exceptions import ImproperlyConfigured

from dmxplatform.env import BASE_DIR, env_float, env_int, env_optional, env_str
from dmxplatform.settings.base import STORAGES

# Where batch files are kept, through Django's storage API: local files under DMX_FILES_ROOT by
# default; any other backend by its dotted path (e.g. django-storages' S3 backend,
# "storages.backends.s3.S3Storage") with its options as JSON in DMX_FILES_STORAGE_OPTIONS.
DMX_FILES_ROOT = env_str("DMX_FILES_ROOT", str(BASE_DIR / ".run" / "files"))
_backend = env_str("DMX_FILES_STORAGE", "django.core.files.storage.FileSystemStorage")
try:
    _options = json.loads(env_optional("DMX_FILES_STORAGE_OPTIONS") or "null")
except ValueError as exc:
    raise ImproperlyConfigured(f"DMX_FILES_STORAGE_OPTIONS is not JSON: {exc}") from exc
STORAGES["batch_files"] = {
    "BACKEND": _backend,
    "OPTIONS": _options if _options is not None else {"location": DMX_FILES_ROOT},
}
# The largest file a tenant may upload, bytes (OpenAI's batch input limit: 200 MB).
DMX_FILES_MAX_BYTES = env_int("DMX_FILES_MAX_BYTES", 200 * 1024 * 1024, minimum=1024)
# An upload must have arrived whole within this, seconds (200 MB at about 220 KB/s); one that
# sends nothing for DMX_BODY_READ_TIMEOUT_SECONDS is refused sooner.
DMX_FILES_UPLOAD_TIMEOUT_SECONDS = env_float("DMX_FILES_UPLOAD_TIMEOUT_SECONDS", 900.0, minimum=1.0)
# Batch files (input and output) are deleted this many days after they were made, unless the
# upload asks for less (expires_after), as OpenAI's are.
DMX_FILES_RETENTION_DAYS = env_int("DMX_FILES_RETENTION_DAYS", 30, minimum=1)
# The most lines one batch may hold (OpenAI's limit).
DMX_BATCH_MAX_LINES = env_int("DMX_BATCH_MAX_LINES", 50_000, minimum=1)

# How often idle batch workers look for work (a batch to validate, run on or end), seconds.
DMX_BATCH_TICK_SECONDS = env_float("DMX_BATCH_TICK_SECONDS", 5.0, minimum=0.2)
# How long one task runs a batch before handing it back, so that batches take turns, seconds.
DMX_BATCH_SLICE_SECONDS = env_float("DMX_BATCH_SLICE_SECONDS", 60.0, minimum=1.0)
# A worker holds the batch it runs for this long, renewed as it goes; a lost worker's batch is
# taken over this long after it last renewed, seconds.
DMX_BATCH_HOLD_SECONDS = env_float("DMX_BATCH_HOLD_SECONDS", 30.0, minimum=1.0)
# Lines of one batch in flight at once (the router still sends each only to spare capacity).
DMX_BATCH_CONCURRENCY = env_int("DMX_BATCH_CONCURRENCY", 8, minimum=1)
# Tries of a line the engine failed (5xx) before it goes to the error file. A line refused for
# capacity or a rate limit is not failing: it waits and goes again, until the batch expires.
DMX_BATCH_MAX_ATTEMPTS = env_int("DMX_BATCH_MAX_ATTEMPTS", 3, minimum=1)
# How long a line waits in its worker's admission queue for spare capacity before it is
# refused (and, refused, deferred to go again), seconds.
DMX_BATCH_WAIT_SECONDS = env_float("DMX_BATCH_WAIT_SECONDS", 300.0, minimum=1.0)
# Spare capacity, the only capacity a batch line is routed to: a node with nothing waiting in
# its engine's queue, its KV cache used below this share, and fewer requests running than this
# share of its --max-num-seqs.
DMX_BATCH_MAX_KV_CACHE = env_float("DMX_BATCH_MAX_KV_CACHE", 0.6, minimum=0.0)
DMX_BATCH_MAX_BUSY = env_float("DMX_BATCH_MAX_BUSY", 0.5, minimum=0.0)
# And, for a model with a TTFT target (its sla_ttft_p95_ms), a node whose engine's TTFT p95 over
# its last heartbeat is within this share of the target: batches yield as interactive first
# tokens slow towards it, and resume when they recover.
DMX_BATCH_TTFT_SLA_SHARE = env_float("DMX_BATCH_TTFT_SLA_SHARE", 0.5, minimum=0.0)
