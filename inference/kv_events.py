"""Listen to the worker's vLLM engine's KV-cache events and keep its prefix index current.

The worker binds a ZeroMQ SUB socket on loopback and starts vLLM with `--kv-events-config`
naming it (EngineConfig.kv_events_endpoint): vLLM's publisher connects there (an endpoint
without a wildcard is one it connects to) and sends each engine step's events as (topic,
sequence, msgpack payload). A thread decodes them into an EngineCacheIndex; the heartbeat reads
its filter. Imports pyzmq and msgspec, which vLLM itself requires.
"""

from __future__ import annotations

import logging
import threading

import msgspec
import zmq

from inference.engine import KV_EVENTS_TOPIC
from inference.prefix_cache import EngineCacheIndex

logger = logging.getLogger("dmx.worker")

# How long the listening thread waits for a message before it checks whether to stop, ms.
POLL_MS = 200
# What a batch that is not vLLM's (or is damaged) raises on its way into the index.
_UNREADABLE = (ValueError, TypeError, AttributeError, msgspec.DecodeError, zmq.ZMQError)


class KvEventListener:
    def __init__(self, host: str = "127.0.0.1") -> None:
        # The process's shared context: a context of our own would block its garbage collection
        # (zmq_term waits for its sockets) when a worker is built and never run.
        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SUBSCRIBE, KV_EVENTS_TOPIC.encode())
        port = self._socket.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{port}"
        self._index = EngineCacheIndex()
        self._lock = threading.Lock()
        self._decode = msgspec.msgpack.Decoder()
        self._stopping = threading.Event()
        self._heard = False
        self._thread = threading.Thread(target=self._listen, name="kv-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2 * POLL_MS / 1000)
        self._socket.close(linger=0)

    def filter_text(self) -> str | None:
        """The engine's prefix filter as a heartbeat carries it; None before any event came."""
        with self._lock:
            return self._index.filter().encode() if self._heard else None

    def _listen(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stopping.is_set():
            if not poller.poll(POLL_MS):
                continue
            try:
                _topic, _sequence, payload = self._socket.recv_multipart()
                batch = self._decode.decode(payload)
                with self._lock:
                    self._index.apply(batch)
                    self._heard = True
            except _UNREADABLE as exc:
                # A batch we cannot read costs its blocks' matches, never the worker.
                logger.warning("could not read a KV-cache event batch: %s", exc)
