"""Redis: two roles, one server by default.

The coordination Redis (REDIS_URL): caches, fleet and catalog state, pub/sub, the Celery broker
and the channel layer; its load grows with gateways and nodes, not with requests. The request
store (DMX_REQUEST_REDIS_URL): what every request reads and writes (limits, leases, replay
nonces, breakers, the usage and decision streams); it may be a Redis Cluster.
"""

from dmxplatform.env import BASE_DIR, env_bool, env_float, env_int, env_str
from dmxplatform.settings.base import DEBUG

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
DMX_REQUEST_REDIS_URL = env_str("DMX_REQUEST_REDIS_URL", REDIS_URL)
# On, DMX_REQUEST_REDIS_URL names a Redis Cluster's seed nodes: redis://host:port,host:port.
DMX_REQUEST_REDIS_CLUSTER = env_bool("DMX_REQUEST_REDIS_CLUSTER", False)
# Tenants are spread over this many hash slots (a tenant's keys share one, so that one request's
# scripts never cross slots), and the usage and decision streams over as many streams, drained
# in parallel. On a cluster, several per master (64 for up to a dozen masters). Changing it
# moves some tenants' limits to fresh counters once; lower it only once the streams of the
# shards above the new number are drained (nothing drains those any more).
DMX_REQUEST_REDIS_SHARDS = env_int("DMX_REQUEST_REDIS_SHARDS", 1, minimum=1)
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
