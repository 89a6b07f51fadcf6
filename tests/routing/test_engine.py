"""The replay's engine model (tests/routing/engine.py) behaves as vLLM's scheduler does."""

from tests.routing.engine import A100, BLOCK_TOKENS, H100, L4, Engine, Seq

HASH = 512  # tokens per trace prefix hash


def seq(key: int, prompt: int, completion: int, hashes=()) -> Seq:
    return Seq(key=key, arrival=0.0, prompt=prompt, completion=completion, hashes=tuple(hashes))


def run(engine: Engine, until: float = 1e9) -> tuple[dict[int, float], dict[int, float]]:
    """Step the engine until it is idle: first-token and finish times by request."""
    now, first, done = 0.0, {}, {}
    while (seconds := engine.schedule()) is not None and now < until:
        now += seconds
        report = engine.complete(now)
        first.update((s.key, now) for s in report.first_tokens)
        done.update((s.key, now) for s in report.finished)
    return first, done


def test_a_step_schedules_at_most_its_token_budget_and_chunks_a_long_prompt():
    engine = Engine(H100, 64)
    engine.add(seq(1, 20_000, 4))
    engine.add(seq(2, 100, 4))
    engine.schedule()
    chunks = {s.key: c for s, c in engine._plan[0]}
    assert chunks == {1: H100.batched_tokens}  # the long prompt fills the budget, FCFS
    first, done = run(engine)
    # Three chunks of 8,192 for the 20,000 tokens; the short prompt rides in the last one.
    assert first[1] == first[2] and set(done) == {1, 2}


def test_decode_steps_are_memory_bound_and_prefill_compute_bound():
    one = H100.step_seconds(0, 0, 1, 1_000)
    many = H100.step_seconds(0, 0, 64, 64_000)
    assert 0.007 < one < 0.012  # about 100 tokens/s for one sequence of an 8B model
    assert many > one  # each sequence's KV is read too
    prefill = H100.step_seconds(8192, 8192 * 4096, 0, 0)
    assert H100.step_seconds(8192, 8192 * 4096, 0, 0) * 3 < A100.step_seconds(
        8192, 8192 * 4096, 0, 0
    )  # 989 against 312 TFLOPS
    assert prefill > 10 * one


def test_requests_beyond_the_kv_blocks_wait_and_a_growing_one_preempts_the_newest():
    engine = Engine(L4, 16)
    capacity = engine.total_blocks * BLOCK_TOKENS
    engine.add(seq(1, capacity // 2, 2_000))
    engine.add(seq(2, capacity // 2 - 1_000, 2_000))
    engine.add(seq(3, capacity // 2, 10))  # no room until one of them ends
    first, done = run(engine)
    assert engine.preemptions >= 1  # the two first outgrew the cache while decoding
    assert first[3] > min(done[1], done[2])
    assert set(done) == {1, 2, 3} and engine.free_blocks + len(engine.evictable) * 32 == (
        engine.total_blocks
    )


def test_a_shared_prefix_is_served_from_the_cache_and_evicted_least_recently_used():
    engine = Engine(H100, 64)
    engine.add(seq(1, 4 * HASH, 2, hashes=(10, 11, 12, 13)))
    run(engine)
    engine.add(seq(2, 5 * HASH, 2, hashes=(10, 11, 12, 13, 14)))
    run(engine)
    assert engine.cached_tokens == 4 * HASH  # the second found the first's four blocks
    assert engine.cached_prefix((10, 11, 12, 13, 14, 15)) == 5
    # Blocks run out: the least recently used prefixes go first.
    engine.add(seq(3, 3 * HASH, 2, hashes=(20, 21, 22)))
    run(engine)
    engine._take(engine.free_blocks + 32)  # one prefix's blocks more than are free
    assert engine.cached_prefix((10,)) == 0 and engine.cached_prefix((20, 21, 22)) == 3
