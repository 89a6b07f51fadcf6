"""A model of one vLLM engine for the replay, independent of the router's predictions.

The router predicts a node's speed from its hardware profile (apps.routing.router.node_rates,
inference.hardware.profiles.serving_rates); if the replay's nodes ran at those same rates, the
replay would only show the router agreeing with itself. This engine has its own model, built
like vLLM's V1 scheduler and timed by a roofline cost per step:

- a step schedules running requests first (one token for a decoding one, a chunk of the prompt
  for a prefilling one: chunked prefill), then admits waiting ones first come first served,
  within a token budget per step (--max-num-batched-tokens) and --max-num-seqs;
- KV cache lives in blocks of 16 tokens, a fixed count per GPU (its memory at
  --gpu-memory-utilization, less the weights and an activation reserve); a request takes blocks
  as its context grows; when a running request needs a block and none is free, the most
  recently admitted running request is preempted (its blocks freed, its tokens recomputed when
  it is admitted again, vLLM's recompute preemption);
- the prefix cache keeps a finished request's full prompt blocks, by the trace's block hash,
  evicted least recently used when blocks run out; a new request reuses the leading blocks it
  finds (at least its last prompt token is computed, as in vLLM);
- a step takes max(compute, memory) plus a fixed overhead: compute is 2 FLOPs per parameter per
  scheduled token plus attention over each prefill chunk's context, at a share of the GPU's dense
  BF16 rate; memory is the weights plus every scheduled sequence's KV read once, at a share of
  its bandwidth. When nothing is prefilling and no one can be admitted, the decode steps up to
  the next finish are taken at once (their time is the same formula, step by step in sum).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

# Llama-3-8B in BF16: 8.03 B parameters; 32 layers, hidden size 4096; KV per token = 32 layers x
# 8 KV heads x 128 x 2 (K and V) x 2 bytes.
PARAMS = 8.03e9
WEIGHT_BYTES = PARAMS * 2
LAYERS = 32
HIDDEN = 4096
KV_BYTES_PER_TOKEN = 131_072
MODEL_MAX_LEN = 131_072
BLOCK_TOKENS = 16  # vLLM's default --block-size
# The trace's prefix hashes cover 512 tokens each: 32 of the engine's blocks.
HASH_BLOCK_TOKENS = 512
# The share of the datasheet's dense BF16 FLOPs a prefill reaches, and of its bandwidth a decode
# step reaches: vLLM's published benchmarks of Llama-3-8B on H100 (about 110-120 tokens/s for one
# sequence, about 20k prompt tokens/s) sit near these. Chosen apart from the router's figures
# (inference.hardware.profiles: 0.5 and 0.7), which the replay checks, not copies.
MFU = 0.4
MBU = 0.8
# Scheduling, sampling and kernel launches per step, with CUDA graphs (vLLM V1 measures 1-4 ms).
STEP_OVERHEAD_SECONDS = 0.003
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
ACTIVATION_RESERVE_BYTES = 1.5e9  # peak activations of a profiling run, kept out of the KV pool
# vLLM's default --max-num-batched-tokens for the API server: 8192 on GPUs of 70 GiB or more,
# 2048 on smaller ones (vllm.engine.arg_utils).
LARGE_GPU_BATCHED_TOKENS = 8192
SMALL_GPU_BATCHED_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class Gpu:
    """Datasheet figures (NVIDIA's, dense BF16) and an on-demand price."""

    profile: str
    tflops: float
    bandwidth_gbps: float
    memory_gb: float
    price_per_hour: float

    @property
    def kv_blocks(self) -> int:
        pool = self.memory_gb * 1e9 * GPU_MEMORY_UTILIZATION - WEIGHT_BYTES
        return int((pool - ACTIVATION_RESERVE_BYTES) / (BLOCK_TOKENS * KV_BYTES_PER_TOKEN))

    @property
    def batched_tokens(self) -> int:
        return LARGE_GPU_BATCHED_TOKENS if self.memory_gb >= 70 else SMALL_GPU_BATCHED_TOKENS

    def step_seconds(self, prefill_tokens: int, attended: float, decodes: int, kv_read: float):
        """One step's time: `prefill_tokens` prompt tokens whose attention spans `attended`
        token pairs, `decodes` decoding sequences, `kv_read` KV tokens read."""
        flops = 2 * PARAMS * (prefill_tokens + decodes) + 4 * LAYERS * HIDDEN * attended
        compute = flops / (self.tflops * 1e12 * MFU)
        memory = (WEIGHT_BYTES + kv_read * KV_BYTES_PER_TOKEN) / (self.bandwidth_gbps * 1e9 * MBU)
        return max(compute, memory) + STEP_OVERHEAD_SECONDS


H100 = Gpu("nvidia-h100-sxm", 989.0, 3350.0, 80.0, 2.99)
A100 = Gpu("nvidia-a100-sxm4-80gb", 312.0, 2039.0, 80.0, 1.79)
L4 = Gpu("nvidia-l4", 121.0, 300.0, 24.0, 0.71)


@dataclass(slots=True, eq=False)
class Seq:
    """A request inside the engine."""

    key: int
    arrival: float
    prompt: int
    completion: int
    hashes: tuple[int, ...]
    needed: int = 0  # tokens to compute before decoding: the prompt, or after a preemption
    computed: int = 0  # of them, computed or found in the prefix cache
    output: int = 0  # tokens generated
    hit_blocks: int = 0  # hash blocks shared from the prefix cache
    blocks: int = 0  # engine blocks of its own
    first_token_at: float | None = None
    admitted: bool = False

    @property
    def context(self) -> int:
        return self.computed + max(self.output - 1, 0) if self.output else self.computed


@dataclass(slots=True)
class StepReport:
    first_tokens: list[Seq]
    finished: list[Seq]


@dataclass(eq=False)
class Engine:
    gpu: Gpu
    max_num_seqs: int
    total_blocks: int = 0
    free_blocks: int = 0
    running: list[Seq] = field(default_factory=list)
    waiting: deque[Seq] = field(default_factory=deque)
    # Prefix cache: hash -> references by running requests; unreferenced ones in LRU order.
    pinned: dict[int, int] = field(default_factory=dict)
    evictable: OrderedDict[int, None] = field(default_factory=OrderedDict)
    # What the heartbeat reports, over its window.
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_steps: int = 0
    decode_seconds: float = 0.0
    decode_rate: float = 0.0  # as the last heartbeat reported it
    prompt_tokens: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    # The step in flight: when it started, how long each of its steps takes, how many.
    busy: bool = False
    step_started: float = 0.0
    step_seconds: float = 0.0
    step_count: int = 0
    version: int = 0
    _plan: tuple | None = None

    def __post_init__(self) -> None:
        self.total_blocks = self.free_blocks = self.gpu.kv_blocks

    @property
    def max_model_len(self) -> int:
        return min(MODEL_MAX_LEN, self.total_blocks * BLOCK_TOKENS)

    @property
    def kv_cache_usage(self) -> float:
        """Blocks referenced by running requests (vLLM's gauge: cached, unreferenced ones are
        free)."""
        evictable = len(self.evictable) * (HASH_BLOCK_TOKENS // BLOCK_TOKENS)
        return 1.0 - (self.free_blocks + evictable) / self.total_blocks

    def cached_prefix(self, hashes: tuple[int, ...]) -> int:
        count = 0
        for h in hashes:
            if h not in self.pinned and h not in self.evictable:
                break
            count += 1
        return count

    # Blocks. ---------------------------------------------------------------------------------

    def _take(self, count: int) -> bool:
        """Take `count` free blocks, evicting cached prefixes as needed."""
        per_hash = HASH_BLOCK_TOKENS // BLOCK_TOKENS
        while self.free_blocks < count and self.evictable:
            self.evictable.popitem(last=False)
            self.free_blocks += per_hash
        if self.free_blocks < count:
            return False
        self.free_blocks -= count
        return True

    def _available(self) -> int:
        return self.free_blocks + len(self.evictable) * (HASH_BLOCK_TOKENS // BLOCK_TOKENS)

    def _own_blocks(self, seq: Seq, tokens: int) -> int:
        """Blocks of its own a sequence needs for `tokens` of context."""
        shared = seq.hit_blocks * (HASH_BLOCK_TOKENS // BLOCK_TOKENS)
        return max(0, -(-tokens // BLOCK_TOKENS) - shared)

    def _release(self, seq: Seq, *, keep_prefix: bool) -> None:
        """Free a sequence's blocks; its full prompt blocks stay in the prefix cache."""
        per_hash = HASH_BLOCK_TOKENS // BLOCK_TOKENS
        for h in seq.hashes[: seq.hit_blocks]:
            refs = self.pinned[h] - 1
            if refs:
                self.pinned[h] = refs
            else:
                del self.pinned[h]
                self.evictable[h] = None
        own = seq.blocks
        if keep_prefix:
            full = min(seq.computed, seq.prompt) // HASH_BLOCK_TOKENS
            for h in seq.hashes[seq.hit_blocks : full]:
                if own < per_hash:
                    break
                if h in self.pinned or h in self.evictable:
                    continue
                self.evictable[h] = None
                own -= per_hash
        self.free_blocks += own
        seq.blocks = 0
        seq.hit_blocks = 0

    def _admit_prefix(self, seq: Seq) -> None:
        """Share the leading prompt blocks the prefix cache holds (at least one prompt token is
        left to compute)."""
        hits = min(self.cached_prefix(seq.hashes), (seq.prompt - 1) // HASH_BLOCK_TOKENS)
        for h in seq.hashes[:hits]:
            if h in self.evictable:
                del self.evictable[h]
                self.pinned[h] = 1
            else:
                self.pinned[h] += 1
        seq.hit_blocks = hits
        seq.computed = hits * HASH_BLOCK_TOKENS

    def _preempt(self, seq: Seq) -> None:
        self.preemptions += 1
        self.running.remove(seq)
        self._release(seq, keep_prefix=True)
        # Recomputed from its prompt and what it generated so far.
        seq.needed = seq.prompt + seq.output
        seq.computed = 0
        self.waiting.appendleft(seq)

    # Scheduling. -----------------------------------------------------------------------------

    def add(self, seq: Seq) -> None:
        seq.needed = seq.prompt
        self.waiting.append(seq)

    def schedule(self) -> float | None:
        """Plan the next step(s); the seconds they take, or None when there is nothing to do."""
        budget = self.gpu.batched_tokens
        chunks: list[tuple[Seq, int]] = []
        decodes: list[Seq] = []
        preempted = False
        for seq in list(self.running):
            if seq not in self.running:  # preempted by an earlier one this step
                continue
            if seq.computed < seq.needed:
                chunk = min(seq.needed - seq.computed, budget)
                if chunk <= 0:
                    continue
                grow = self._own_blocks(seq, seq.computed + chunk) - seq.blocks
            else:
                chunk = 0
                grow = self._own_blocks(seq, seq.context + 1) - seq.blocks
            while grow > 0 and not self._take(grow):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq not in self.running:
                break
            seq.blocks += max(grow, 0)
            if chunk:
                chunks.append((seq, chunk))
                budget -= chunk
            else:
                decodes.append(seq)
                budget -= 1
        if not preempted:
            while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
                seq = self.waiting[0]
                self._admit_prefix(seq)
                chunk = min(seq.needed - seq.computed, budget)
                grow = self._own_blocks(seq, seq.computed + chunk)
                if not self._take(grow):
                    self._release(seq, keep_prefix=False)
                    seq.computed = 0
                    break
                self.waiting.popleft()
                if not seq.admitted:  # counted once: a recomputation finds its own blocks
                    seq.admitted = True
                    self.prompt_tokens += seq.prompt
                    self.cached_tokens += seq.computed
                seq.blocks = grow
                self.running.append(seq)
                chunks.append((seq, chunk))
                budget -= chunk
        if not chunks and not decodes:
            self._plan = None
            return None
        prefill = sum(c for _, c in chunks)
        attended = sum(c * (s.computed + c / 2) for s, c in chunks)
        kv = sum(s.context for s in decodes) + sum(s.computed for s, _ in chunks)
        count = 1
        if not chunks and not preempted:
            # Decode only, and no one waiting could be admitted (no slot or no blocks, which
            # only a finish frees): every step alike up to the next finish (or until the
            # blocks left would run out).
            count = min(s.completion - s.output for s in decodes)
            spare = self._available() // len(decodes) - 1
            count = max(1, min(count, spare * BLOCK_TOKENS if spare > 0 else 1))
        kv_mid = kv + len(decodes) * (count - 1) / 2
        seconds = self.gpu.step_seconds(prefill, attended, len(decodes), kv_mid)
        self._plan = (chunks, decodes, prefill, seconds)
        self.step_seconds = seconds
        self.step_count = count
        return seconds * count

    def interrupt(self, now: float) -> float:
        """A request arrived mid-way through a run of decode steps: end the run after the step
        in progress. Returns when the run now ends."""
        if self.step_count > 1:
            done = min(
                self.step_count, math.floor((now - self.step_started) / self.step_seconds) + 1
            )
            self.step_count = done
        return self.step_started + self.step_seconds * self.step_count

    def complete(self, now: float) -> StepReport:
        """Apply the planned step(s), ending at `now`."""
        chunks, decodes, prefill, seconds = self._plan
        count = self.step_count
        first: list[Seq] = []
        finished: list[Seq] = []
        if prefill:
            self.prefill_tokens += prefill
            self.prefill_seconds += seconds
        if decodes:
            self.decode_steps += count
            self.decode_seconds += seconds * count
        for seq, chunk in chunks:
            seq.computed += chunk
            if seq.computed >= seq.needed:
                seq.output += 1
                if seq.first_token_at is None:
                    seq.first_token_at = now
                    first.append(seq)
        for seq in decodes:
            extra = count - 1
            if extra:  # blocks for the steps taken at once
                grow = self._own_blocks(seq, seq.context + 1 + extra) - seq.blocks
                if grow > 0 and self._take(grow):
                    seq.blocks += grow
            seq.output += count
        for seq in list(self.running):
            if seq.output >= seq.completion:
                self.running.remove(seq)
                self._release(seq, keep_prefix=True)
                finished.append(seq)
        self._plan = None
        return StepReport(first, finished)

    def rated_prefill(self) -> float:
        """Prompt tokens per second of a long prefill alone (for the capacity baseline)."""
        return self.gpu.tflops * 1e12 * MFU / (2 * PARAMS)

    def request_seconds(self, prompt: float, completion: float) -> float:
        """Engine-seconds one request of these lengths takes at full load (capacity)."""
        prefill = self.gpu.step_seconds(prompt, prompt * prompt / 2, 0, 0) - STEP_OVERHEAD_SECONDS
        concurrency = max(1, min(self.max_num_seqs, self.total_blocks * BLOCK_TOKENS
                                 / (prompt + completion)))  # fmt: skip
        step = self.gpu.step_seconds(
            0, 0, int(concurrency), concurrency * (prompt + completion / 2)
        )
        return prefill + completion * step / concurrency
