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
from tests.stack import wait_for


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


def stored(ids: list[int], *, first_hash: int = 0) -> BlockStored:
    """The engine stored a prompt's blocks (16 tokens each), under its own block hashes."""
    blocks = range(first_hash, first_hash + len(ids) // 16)
    return BlockStored(
        block_hashes=[i.to_bytes(32, "big") for i in blocks],
        parent_block_hash=None,
        token_ids=ids,
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )


def test_the_listener_follows_a_publishers_batches_into_the_filter():
    listener = KvEventListener()
    context = zmq.Context()
    publisher = context.socket(zmq.PUB)
    publisher.connect(listener.endpoint)  # as vLLM does with an endpoint without a wildcard
    listener.start()
    try:
        assert listener.filter_text() is None  # nothing heard: no claim either way
        ids = prompt(7, 1024)
        payload = msgspec.msgpack.encode(KVEventBatch(ts=time.time(), events=[stored(ids)]))
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
        # A damaged batch is logged and skipped; the listener keeps going: the next good batch
        # (another prompt's blocks, sent after it) is heard, and the first prompt's are kept.
        publisher.send_multipart((KV_EVENTS_TOPIC.encode(), b"\0" * 8, b"\xc1garbage"))
        later = prompt(8, 1024)
        publisher.send_multipart(
            (
                KV_EVENTS_TOPIC.encode(),
                sequence.to_bytes(8, "big"),
                msgspec.msgpack.encode(
                    KVEventBatch(ts=time.time(), events=[stored(later, first_hash=1000)])
                ),
            )
        )

        def holds(prompt_ids: list[int]) -> bool:
            held = PrefixFilter.decode(listener.filter_text())
            return all(h in held for h in chain_hashes(prompt_ids))

        wait_for(lambda: holds(later), timeout=10, interval=0.05, what="the batch after it")
        assert holds(ids)
    finally:
        publisher.close(linger=0)
        context.term()
        listener.stop()
