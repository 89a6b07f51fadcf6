"""Prompt prefixes in token groups: the gateway's hashes, an engine's KV-cache events, filters."""

import random

import pytest

from inference.prefix_cache import (
    FILTER_CAPACITY,
    GROUP_TOKENS,
    EngineCacheIndex,
    PrefixFilter,
    chain_hashes,
)


def prompt(seed: int, tokens: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32_000) for _ in range(tokens)]


def stored(ids: list[int], *, size: int, start: int = 0, parent=None, tag: str = "p") -> dict:
    """A BlockStored event as vLLM publishes it (msgspec's map of a tagged struct): the full
    blocks of ids[start:], chained on `parent`."""
    count = (len(ids) - start) // size
    return {
        "type": "BlockStored",
        "block_hashes": [f"{tag}{start // size + i}".encode() for i in range(count)],
        "parent_block_hash": parent,
        "token_ids": ids[start : start + count * size],
        "block_size": size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def batch(*events) -> list:
    return [1.0, list(events), 0]  # EventBatch is array-like: [ts, events, data_parallel_rank]


def test_a_groups_hash_depends_on_everything_before_it():
    a = prompt(1, 3 * GROUP_TOKENS + 100)
    assert len(chain_hashes(a)) == 3  # full groups only
    b = [*a[:GROUP_TOKENS], 7, *a[GROUP_TOKENS + 1 :]]
    assert chain_hashes(b)[0] == chain_hashes(a)[0]
    assert chain_hashes(b)[1:] != chain_hashes(a)[1:] and chain_hashes(b)[2] != chain_hashes(a)[2]
    assert chain_hashes(a[: GROUP_TOKENS - 1]) == ()


@pytest.mark.parametrize("size", [16, 128])
def test_an_engines_stored_blocks_give_the_gateways_hashes_of_the_same_tokens(size):
    ids = prompt(2, 3 * GROUP_TOKENS + 40)
    index = EngineCacheIndex()
    # The first request's prompt in one event, a longer one sharing it later, chained on it.
    first = ids[: 2 * GROUP_TOKENS]
    index.apply(batch(stored(first, size=size)))
    last_block = f"p{len(first) // size - 1}".encode()
    index.apply(batch(stored(ids, size=size, start=len(first), parent=last_block)))
    held = index.filter()
    assert all(h in held for h in chain_hashes(ids))
    assert len(index) == 3
    other = chain_hashes(prompt(3, 2 * GROUP_TOKENS))
    assert not any(h in held for h in other)


def test_removed_and_cleared_blocks_are_no_longer_held():
    ids = prompt(4, 2 * GROUP_TOKENS)
    index = EngineCacheIndex()
    index.apply(batch(stored(ids, size=16)))
    first, second = chain_hashes(ids)
    # vLLM evicts the second group's last block: that group is gone, the first stays.
    index.apply(batch({"type": "BlockRemoved", "block_hashes": [b"p63"], "medium": "GPU"}))
    assert first in index.filter() and second not in index.filter()
    index.apply(batch({"type": "AllBlocksCleared"}))
    assert len(index) == 0 and first not in index.filter()


def test_blocks_the_index_cannot_place_are_left_out():
    ids = prompt(5, 2 * GROUP_TOKENS)
    index = EngineCacheIndex()
    # A parent stored before the worker listened: where these blocks start is unknown.
    index.apply(batch(stored(ids, size=16, start=GROUP_TOKENS, parent=b"unknown")))
    # An adapter's blocks; a partial block (fewer tokens than its size).
    adapter = {**stored(ids, size=16), "lora_name": "sql-adapter"}
    partial = {**stored(ids, size=16), "token_ids": ids[:-3]}
    index.apply(batch(adapter, partial))
    assert len(index) == 0


def test_the_filter_never_misses_a_held_hash_and_seldom_claims_another():
    rng = random.Random(6)
    held = [rng.getrandbits(64) for _ in range(FILTER_CAPACITY)]
    decoded = PrefixFilter.decode(PrefixFilter.of(held).encode())
    assert all(h in decoded for h in held)
    others = [rng.getrandbits(64) for _ in range(20_000)]
    false_positive = sum(h in decoded for h in others) / len(others)
    assert false_positive < 0.02
    assert len(PrefixFilter.of(held).encode()) < 2_000  # what each heartbeat carries
    with pytest.raises(ValueError):
        PrefixFilter.decode("")
    with pytest.raises(ValueError):
        PrefixFilter.decode("not base64!")
