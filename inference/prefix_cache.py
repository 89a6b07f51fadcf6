"""Which prompt prefixes an engine holds in its KV cache, in terms the gateway can match.

The gateway and the worker hash a prompt the same way: its token ids in GROUP_TOKENS-token
groups from the first token, each group's hash chained on the one before, as vLLM chains its
cache blocks (two prompts share a group's hash only when they share every token up to its end).
The gateway hashes each request's prompt (`chain_hashes`); the worker follows vLLM's KV-cache
events (blocks stored with their token ids, blocks removed, all cleared), keeps the group hashes
of what the engine holds now (`EngineCacheIndex`) and sends them in its heartbeat as a Bloom
filter (`PrefixFilter`): a few KiB whatever the cache's size, read by every gateway's refresh.

No Django here: the worker imports this module in its own virtualenv, the gateway too.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

# Tokens per group: vLLM's 16-token (GPU) or 128-token (CPU) blocks, 32 or 4 to a group, so a
# decision walks a prompt in a few hundred steps at most. The gateway's routing index counts in
# the same groups (apps.routing.router.PREFIX_BLOCK_TOKENS).
GROUP_TOKENS = 512
# 256 groups cover a 128k-token context; hashing stays bounded (blake2b over 512 KiB at most).
MAX_GROUPS = 256
# Group hashes a filter holds: the most recently stored, about what an 80 GB GPU's KV cache
# holds of an 8B model (430k tokens); older ones the engine has likely evicted or soon will.
FILTER_CAPACITY = 1024
# Bits per held hash and probes per lookup: a 1% false-positive rate (m/n = 9.6, k = 7), so a
# filter is 1.2 KiB, 1.6 KiB in a heartbeat's JSON.
FILTER_BITS_PER_ENTRY = 10
FILTER_PROBES = 7


def _token_bytes(ids: Sequence[int]) -> bytes:
    packed = array("I", ids)
    if sys.byteorder == "big":  # hashes must agree across machines: little-endian always
        packed.byteswap()
    return packed.tobytes()


def _chain(previous: bytes, ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(previous + _token_bytes(ids), digest_size=8).digest()


def chain_hashes(ids: Sequence[int]) -> tuple[int, ...]:
    """The chained 64-bit hashes of a prompt's full GROUP_TOKENS-token groups (at most
    MAX_GROUPS)."""
    hashes = []
    previous = b""
    for i in range(min(len(ids) // GROUP_TOKENS, MAX_GROUPS)):
        previous = _chain(previous, ids[i * GROUP_TOKENS : (i + 1) * GROUP_TOKENS])
        hashes.append(int.from_bytes(previous, "big"))
    return tuple(hashes)


class PrefixFilter:
    """A Bloom filter of group hashes: `in` may say yes for one not added (about 1% of them at
    capacity), never no for one added."""

    __slots__ = ("_bits", "_size")

    def __init__(self, bits: bytes | bytearray) -> None:
        self._bits = bits
        self._size = len(bits) * 8

    @classmethod
    def of(cls, hashes: Iterable[int], capacity: int = FILTER_CAPACITY) -> PrefixFilter:
        bits = bytearray(-(-capacity * FILTER_BITS_PER_ENTRY // 8))
        size = len(bits) * 8
        for value in hashes:
            for index in _probes(value, size):
                bits[index >> 3] |= 1 << (index & 7)
        return cls(bytes(bits))

    def __contains__(self, value: int) -> bool:
        bits = self._bits
        return all(bits[i >> 3] & (1 << (i & 7)) for i in _probes(value, self._size))

    def encode(self) -> str:
        return base64.b64encode(self._bits).decode()

    @classmethod
    def decode(cls, text: str) -> PrefixFilter:
        bits = base64.b64decode(text, validate=True)
        if not bits:
            raise ValueError("an empty prefix filter")
        return cls(bits)


def _probes(value: int, size: int) -> Iterable[int]:
    # The hashes are blake2b output, uniform already: double hashing on their two halves.
    low, high = value & 0xFFFFFFFF, (value >> 32) | 1
    return ((low + i * high) % size for i in range(FILTER_PROBES))


# Engine blocks followed at most: an 80 GB GPU holds about 27k 16-token blocks of an 8B model;
# should removals be lost (the publisher drops events past its high-water mark), the oldest go.
MAX_BLOCKS = 262_144


class _Block:
    """An engine block as the index follows it: its tokens, the block before it, how many
    prompt tokens end with it, and the chain of group hashes through the last group it ends."""

    __slots__ = ("chain", "depth", "group", "ids", "parent")

    def __init__(self, ids: tuple[int, ...], parent: _Block | None) -> None:
        self.ids = ids
        self.parent = parent
        self.depth = (parent.depth if parent else 0) + len(ids)
        self.chain = parent.chain if parent else b""
        self.group: int | None = None  # the group hash this block completes, if it does
        if self.depth % GROUP_TOKENS == 0 and self.depth // GROUP_TOKENS <= MAX_GROUPS:
            # Blocks divide groups (vLLM's sizes are powers of two up to 512): the group is this
            # block's tokens and its predecessors' back to the last group's end.
            parts, block = [], self
            while block is not None and block.depth > self.depth - GROUP_TOKENS:
                parts.append(block.ids)
                block = block.parent
            tokens = [token for part in reversed(parts) for token in part]
            self.chain = _chain(block.chain if block else b"", tokens)
            self.group = int.from_bytes(self.chain, "big")


class EngineCacheIndex:
    """The group hashes of the prompts an engine holds in its prefix cache, from its KV-cache
    events (vllm.distributed.kv_events, as msgpack decodes them: a batch is [ts, events, rank],
    an event a map with its "type")."""

    def __init__(self, capacity: int = FILTER_CAPACITY) -> None:
        self._capacity = capacity
        self._blocks: dict[Any, _Block] = {}
        # Group hashes held, least recently stored first, each with how many blocks complete it.
        self._groups: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._groups)

    def apply(self, batch: Sequence[Any]) -> None:
        """Follow one event batch."""
        for event in batch[1]:
            kind = event.get("type")
            if kind == "BlockStored":
                self._stored(event)
            elif kind == "BlockRemoved":
                for block_hash in event.get("block_hashes") or ():
                    self._removed(block_hash)
            elif kind == "AllBlocksCleared":
                self._blocks.clear()
                self._groups.clear()

    def filter(self) -> PrefixFilter:
        """A filter of the most recently stored group hashes the engine still holds."""
        held = list(self._groups)[-self._capacity :]
        return PrefixFilter.of(held, self._capacity)

    def _stored(self, event: dict[str, Any]) -> None:
        hashes = event.get("block_hashes") or []
        tokens = event.get("token_ids") or []
        size = event.get("block_size") or 0
        # An adapter's cache is not the base model's prompt; blocks that do not divide a group
        # (no vLLM default does not) cannot be regrouped without splitting them.
        if event.get("lora_name") or event.get("lora_id") or not size or GROUP_TOKENS % size:
            return
        if len(tokens) != len(hashes) * size:
            return  # a partial block: its successors would not start where a block does
        parent_hash = event.get("parent_block_hash")
        parent = self._blocks.get(parent_hash) if parent_hash is not None else None
        if parent_hash is not None and parent is None:
            return  # its prefix was stored before we listened: where it starts is unknown
        for i, block_hash in enumerate(hashes):
            block = _Block(tuple(tokens[i * size : (i + 1) * size]), parent)
            self._blocks[block_hash] = parent = block
            if block.group is not None:
                self._groups[block.group] = self._groups.get(block.group, 0) + 1
                self._groups.move_to_end(block.group)
        while len(self._blocks) > MAX_BLOCKS:
            self._removed(next(iter(self._blocks)))

    def _removed(self, block_hash: Any) -> None:
        block = self._blocks.pop(block_hash, None)
        if block is None or block.group is None:
            return
        count = self._groups.get(block.group, 0) - 1
        if count > 0:
            self._groups[block.group] = count
        else:
            self._groups.pop(block.group, None)
