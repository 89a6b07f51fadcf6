"""Redis: limits, counters, caches, the usage buffer, the Celery broker and the channel layer."""

from dmxplatform.env import env_str

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
