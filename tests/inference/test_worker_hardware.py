"""The worker applies the engine recommendation and reports its GPUs (no vLLM started here)."""

import json

import pytest

from inference import worker as worker_module
from inference.worker import Worker, parse_args
from tests.inference.hardware.nvml_replay import H100_X8, T4, ReplayBackend, recording
from tests.inference.hardware.test_engine_args import LLAMA_31_8B, LLAMA_31_70B

TINY_ARGS = ["--enforce-eager", "--max-num-seqs", "16"]  # what tests/stack.py starts workers with
MIB = 1024 * 1024


def make_worker(model: str, *extra: str, own: tuple[str, ...] = ()) -> Worker:
    return Worker(parse_args(["--model", model, *own, "--", *extra]))


@pytest.fixture(autouse=True)
def _node_token(monkeypatch):
    monkeypatch.setenv("DMX_NODE_TOKEN", "dmx-node-abcdefgh_secret")


@pytest.fixture
def model_dir(tmp_path):
    def write(config: dict) -> str:
        (tmp_path / "config.json").write_text(json.dumps(config))
        return str(tmp_path)

    return write


@pytest.fixture
def gpus(monkeypatch):
    """Give the worker recorded GPUs, idle, in place of NVML."""

    def install(fixture: str) -> ReplayBackend:
        readings = recording(fixture)
        for device in readings["devices"]:
            total = device["memory"]["total"]
            device["memory"] = {"total": total, "used": 4 * MIB, "free": total - 4 * MIB}
        backend = ReplayBackend(readings)
        monkeypatch.setattr(worker_module, "open_backend", lambda: backend)
        return backend

    return install


def test_cpu_worker_adds_float32_and_keeps_the_operators_arguments(monkeypatch, model_dir):
    monkeypatch.setattr(worker_module, "open_backend", lambda: None)
    worker = make_worker(model_dir(LLAMA_31_8B), *TINY_ARGS)
    assert worker.engine.config.extra_args == [
        "--dtype",
        "float32",
        "--scheduling-policy",
        "priority",
        *TINY_ARGS,
    ]
    assert worker.engine.config.env == {}
    assert worker.hardware().kind == "cpu"
    recommendation = worker.recommendation.to_dict()
    assert recommendation["fits"] and recommendation["arguments"]["--dtype"]["value"] == "float32"
    explicit = ["--enforce-eager", "--dtype", "float32", "--max-num-seqs", "16"]
    assert make_worker(model_dir(LLAMA_31_8B), *explicit).engine.config.extra_args == [
        "--scheduling-policy",
        "priority",
        *explicit,
    ]


def test_no_recommend_passes_the_operators_arguments_alone(gpus, model_dir):
    gpus(H100_X8)
    worker = make_worker(model_dir(LLAMA_31_8B), *TINY_ARGS, own=("--no-recommend",))
    assert worker.recommendation is None
    assert worker.engine.config.extra_args == TINY_ARGS
    assert len(worker.hardware().gpus) == 8


def test_gpu_worker_runs_on_the_recommended_gpus_and_reports_only_them(gpus, model_dir):
    backend = gpus(H100_X8)
    worker = make_worker(model_dir(LLAMA_31_8B), "--max-num-seqs", "128")
    argv = worker.engine.config.extra_args
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert argv.count("--max-num-seqs") == 1 and argv[-2:] == ["--max-num-seqs", "128"]
    uuid = backend.readings["devices"][0]["uuid"]
    assert worker.engine.config.env == {"CUDA_VISIBLE_DEVICES": uuid}
    assert worker.engine.config.environment()["CUDA_VISIBLE_DEVICES"] == uuid
    view = worker.hardware()
    assert [gpu.uuid for gpu in view.gpus] == [uuid]
    worker.close()
    assert backend.closed and worker.hardware().kind == "cpu"


def test_registration_tells_gateways_the_engines_batch_and_scheduler(gpus, model_dir, monkeypatch):
    gpus(H100_X8)
    monkeypatch.setattr(worker_module, "export_tokenizer", lambda model: None)
    worker = make_worker(model_dir(LLAMA_31_8B), "--max-num-seqs", "128")
    monkeypatch.setattr(worker.engine, "max_model_len", lambda: 8192)
    engine_args = worker._registration().engine_args
    assert engine_args["max_num_seqs"] == 128
    assert engine_args["scheduling_policy"] == "priority"
    # An attached server's flags are what the operator declares; without them, unknown.
    declared = make_worker(
        model_dir(LLAMA_31_8B), "--max-num-seqs", "64", own=("--attach", "http://10.0.0.5:8000")
    )
    bare = make_worker(model_dir(LLAMA_31_8B), own=("--attach", "http://10.0.0.5:8000"))
    for attached in (declared, bare):
        monkeypatch.setattr(attached.engine, "max_model_len", lambda: 8192)
    assert declared._registration().engine_args["max_num_seqs"] == 64
    assert bare._registration().engine_args["max_num_seqs"] is None


def test_a_model_that_does_not_fit_stops_the_worker_before_vllm(gpus, model_dir, monkeypatch):
    gpus(T4)
    worker = make_worker(model_dir(LLAMA_31_70B))
    assert not worker.recommendation.fits
    monkeypatch.setattr(worker.engine, "start", lambda: pytest.fail("vLLM must not start"))
    monkeypatch.setattr(worker_module.signal, "signal", lambda *args: None)  # keep pytest's
    assert worker.run() == 1


def test_a_slow_metrics_page_neither_holds_back_the_heartbeat_nor_reports_the_node_idle(
    monkeypatch, model_dir
):
    from tests.inference.test_engine_metrics import FIXTURE

    monkeypatch.setattr(worker_module, "open_backend", lambda: None)
    worker = make_worker(model_dir(LLAMA_31_8B), *TINY_ARGS)
    timeouts = []
    pages = iter([FIXTURE.read_text(), TimeoutError("timed out")])

    def metrics_text(*, timeout):
        timeouts.append(timeout)
        page = next(pages)
        if isinstance(page, Exception):
            raise page
        return page

    monkeypatch.setattr(worker.engine, "metrics_text", metrics_text)
    read = worker._load()
    assert (read.num_requests_running, read.num_requests_waiting) == (2, 1)
    late = worker._load()
    assert late is read  # the last load read, not an idle node
    # Bounded by the heartbeat period (before registration, the retry period), not 5 s.
    assert timeouts == [worker_module.RETRY_SECONDS] * 2
