"""Redis: limits, counters, caches, the usage buffer, the Celery broker and the channel layer."""

from dmxplatform.env import BASE_DIR, env_bool, env_float, env_str
from dmxplatform.settings.base import DEBUG

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Every key this platform writes starts with this, so that several deployments (or the test
# suite) can share one Redis server.
DMX_REDIS_PREFIX = env_str("DMX_REDIS_PREFIX", "dmx")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": f"{DMX_REDIS_PREFIX}:asgi"},
    }
}

# Stream entries (usage records) a gateway could not hand to Redis wait in a file here and are
# appended once Redis answers again, checked this often (dmxplatform.spool). One directory per
# deployment and host: a replay appends to the Redis of whoever replays.
DMX_SPOOL_DIR = env_str("DMX_SPOOL_DIR", str(BASE_DIR / ".run" / "spool"))
DMX_SPOOL_REPLAY_SECONDS = env_float("DMX_SPOOL_REPLAY_SECONDS", 2.0, minimum=0.1)
# The Redis that holds the streams must keep them across a restart (appendonly yes): the
# gateway refuses to start on one that says it does not, unless this is off (the default in
# development only).
DMX_REDIS_REQUIRE_AOF = env_bool("DMX_REDIS_REQUIRE_AOF", not DEBUG)
