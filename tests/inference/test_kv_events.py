"""The worker's KV-event listener against a ZeroMQ publisher sending vLLM's wire format.

The structs below copy vllm.distributed.kv_events (0.32) field for field: the platform's
virtualenv has no vLLM. tests/routing/test_routing_e2e.py checks the same path against a real
engine."""

import time

import msgspec
import zmq

from inference.engine import KV_EVENTS_TOPIC
from inference.kv_events import KvEventListener
from inference.prefix_cache import PrefixFilter, chain_hashes
from tests.inference.test_prefix_cache import prompt


class BlockStored(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored]
    data_parallel_rank: int | None = None


def test_the_listener_follows_a_publishers_batches_into_the_filter():
    listener = KvEventListener()
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    publisher.connect(listener.endpoint)  # as vLLM does with an endpoint without a wildcard
    listener.start()
    try:
        assert listener.filter_text() is None  # nothing heard: no claim either way
        ids = prompt(7, 1024)
        event = BlockStored(
            block_hashes=[i.to_bytes(32, "big") for i in range(64)],
            parent_block_hash=None,
            token_ids=ids,
            block_size=16,
            lora_id=None,
            medium="GPU",
            lora_name=None,
        )
        payload = msgspec.msgpack.encode(KVEventBatch(ts=time.time(), events=[event]))
        deadline = time.monotonic() + 10
        text = None
        sequence = 0
        while text is None and time.monotonic() < deadline:
            # A PUB socket drops what it sends before the subscription reached it.
            publisher.send_multipart(
                (KV_EVENTS_TOPIC.encode(), sequence.to_bytes(8, "big"), payload)
            )
            sequence += 1
            time.sleep(0.05)
            text = listener.filter_text()
        assert text is not None, "the listener never heard a batch"
        held = PrefixFilter.decode(text)
        assert all(h in held for h in chain_hashes(ids))
        # A damaged batch is logged and skipped; the listener keeps going.
        publisher.send_multipart((KV_EVENTS_TOPIC.encode(), b"\0" * 8, b"\xc1garbage"))
        time.sleep(0.2)
        assert listener.filter_text() == text
    finally:
        publisher.close(linger=0)
        context.term()
        listener.stop()
