"""Inference nodes: heartbeat cadence and when a silent node counts as down."""

from dmxplatform.env import env_float

# Interval a worker is told to send heartbeats at, seconds.
DMX_HEARTBEAT_SECONDS = env_float("DMX_HEARTBEAT_SECONDS", 2.0, minimum=0.2)
# A node whose last heartbeat is older than this is down for the router at once and is marked
# down in the database by the next stale check. Three missed heartbeats by default.
DMX_NODE_STALE_SECONDS = env_float("DMX_NODE_STALE_SECONDS", 6.0, minimum=0.5)
