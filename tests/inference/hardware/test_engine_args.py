"""Engine arguments against hand-computed cases.

Units: GiB = 2**30 bytes; NVML reports MiB. The rules (inference/hardware/engine_args.py):
  utilisation = min(0.95, floor2((free GiB - 2) / total GiB))
  budget      = utilisation x total GiB per GPU
  KV per GPU  = budget - weights / tp - 1.5 GiB runtime reserve
  KV tokens   = tp x KV per GPU / (2 x layers x KV heads x head dim x KV bytes)
  fits when KV tokens >= max(context, 8 x context / 4) (eight sequences of a quarter context)
  max-num-seqs = min(256, KV tokens // 2048)
"""

import json

from inference.hardware.detection import get_gpu_info
from inference.hardware.engine_args import ModelShape, operator_flags, recommend
from inference.hardware.view import GpuInfo, NodeView
from tests.inference.hardware.nvml_replay import (
    A100_X8,
    H100_X8,
    H200_X8,
    T4,
    ReplayBackend,
    recording,
    replay,
)

MIB = 1024 * 1024

# config.json of Meta's Llama 3.1 8B, Llama 3.1 70B and Llama 3.2 3B (the fields that matter).
LLAMA_31_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA_31_70B = {
    **LLAMA_31_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}
LLAMA_32_3B = {
    **LLAMA_31_8B,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "head_dim": 128,
    "tie_word_embeddings": True,
}


def shape(config: dict, name: str) -> ModelShape:
    return ModelShape.from_config(config, name=name)


def idle(fixture: str) -> NodeView:
    """A recorded node with its GPUs' memory free, as when a worker starts."""
    readings = recording(fixture)
    for device in readings["devices"]:
        total = device["memory"]["total"]
        device["memory"] = {"total": total, "used": 4 * MIB, "free": total - 4 * MIB}
    return get_gpu_info(backend=ReplayBackend(readings))


def values(recommendation) -> dict:
    return {flag: argument.value for flag, argument in recommendation.arguments.items()}


def test_parameters_counted_from_config():
    # 8B: embeddings 128256 x 4096 x 2 (untied) = 1,050,673,152; per layer q,o 2 x 4096 x 4096,
    # k,v 2 x 4096 x 1024, MLP 3 x 4096 x 14336, norms 2 x 4096 = 218,112,000; x 32 layers
    # = 6,979,584,000; + final norm 4096: 8,030,261,248.
    assert shape(LLAMA_31_8B, "8b").parameters == 8_030_261_248
    # 70B the same way: 2,101,346,304 + 80 x 855,654,400 + 8192 = 70,553,706,496.
    assert shape(LLAMA_31_70B, "70b").parameters == 70_553_706_496
    # 3B, tied embeddings: 394,002,432 + 28 x 100,669,440 + 3072 = 3,212,749,824.
    assert shape(LLAMA_32_3B, "3b").parameters == 3_212_749_824


def test_llama_8b_on_one_idle_a100_80gb():
    node = idle(A100_X8)  # 8 x A100-SXM4-80GB, 81920 MiB each, 81916 MiB free
    result = recommend(model=shape(LLAMA_31_8B, "llama-8b"), node=node)
    # utilisation: (81916/1024 - 2) / 80 = 0.97495 -> floor2 0.97 -> capped at 0.95
    # budget 0.95 x 80 = 76.0 GiB; weights 8,030,261,248 x 2 B = 14.957 GiB (bf16, cc 8.0)
    # KV 76.0 - 14.957 - 1.5 = 59.543 GiB; per token 2 x 32 x 8 x 128 x 2 B = 128 KiB (no fp8
    # KV before Hopper) -> 487,772 tokens >= 262,144 needed: one GPU, full 131072 context
    # max-num-seqs min(256, 487,772 // 2048 = 238) = 238; block 32 as 131072 >= 32768
    assert result.fits
    assert values(result) == {
        "--dtype": "bfloat16",
        "--kv-cache-dtype": "auto",
        "--tensor-parallel-size": 1,
        "--gpu-memory-utilization": 0.95,
        "--block-size": 32,
        "--max-num-seqs": 238,
        "--enable-prefix-caching": True,
        "--scheduling-policy": "priority",
    }
    assert result.devices == [0]


def test_llama_70b_on_idle_h100s_takes_four_nvlinked_gpus():
    node = idle(H100_X8)  # 8 x H100 80GB HBM3: 81559 MiB each, 81555 MiB free, NV18
    result = recommend(model=shape(LLAMA_31_70B, "llama-70b"), node=node)
    # utilisation: (79.644 - 2) / 79.647 = 0.9748 -> 0.95; budget 75.665 GiB per GPU
    # weights 70,553,706,496 x 2 B = 131.417 GiB; KV fp8 on cc 9.0: 2 x 80 x 8 x 128 x 1 B
    # = 160 KiB per token; 262,144 tokens needed
    # tp 1: 131.4 > 75.7, no.  tp 2: 75.665 - 65.709 - 1.5 = 8.456 GiB per GPU ->
    #   2 x 8.456 GiB / 160 KiB = 110,835 tokens, short.  tp 4: 75.665 - 32.854 - 1.5 =
    #   41.311 GiB -> 4 x 41.311 GiB / 160 KiB = 1,082,931 tokens: fits
    # max-num-seqs min(256, 528) = 256
    assert result.fits
    assert values(result) == {
        "--dtype": "bfloat16",
        "--kv-cache-dtype": "fp8",
        "--tensor-parallel-size": 4,
        "--gpu-memory-utilization": 0.95,
        "--block-size": 32,
        "--max-num-seqs": 256,
        "--enable-prefix-caching": True,
        "--scheduling-policy": "priority",
    }
    assert result.devices == [0, 1, 2, 3]
    assert "NVLink" in result.arguments["--tensor-parallel-size"].reason


def test_llama_70b_does_not_fit_on_one_t4():
    node = idle(T4)  # 15109 MiB, 15105 free
    result = recommend(model=shape(LLAMA_31_70B, "llama-70b"), node=node)
    # utilisation (14.751 - 2) / 14.755 = 0.864 -> 0.86; budget 12.69 GiB
    # float16 (cc 7.5 has no bf16) weights 131.4 GiB > 12.69; one GPU; no FP8 on Turing
    assert not result.fits
    assert "does not fit" in result.summary and "131.4 GiB" in result.summary
    assert "12.7 GiB" in result.summary and "no FP8" in result.summary
    assert "--tensor-parallel-size" not in result.arguments and result.devices == []
    assert result.arguments["--dtype"].value == "float16"


def test_llama_3b_on_one_t4_gets_a_shorter_context():
    node = idle(T4)
    result = recommend(model=shape(LLAMA_32_3B, "llama-3b"), node=node)
    # budget 0.86 x 14.755 = 12.689 GiB; weights 3,212,749,824 x 2 B = 5.984 GiB (float16)
    # KV 12.689 - 5.984 - 1.5 = 5.205 GiB; per token 2 x 28 x 8 x 128 x 2 B = 112 KiB
    # -> 48,733 tokens. Full context needs 262,144: no. 65536 needs 131,072, 32768 needs
    # 65,536: no; 16384 needs 32,768: yes -> --max-model-len 16384, block 16 (< 32768)
    # max-num-seqs 48,733 // 2048 = 23
    assert result.fits
    assert values(result) == {
        "--dtype": "float16",
        "--kv-cache-dtype": "auto",
        "--tensor-parallel-size": 1,
        "--gpu-memory-utilization": 0.86,
        "--max-model-len": 16384,
        "--block-size": 16,
        "--max-num-seqs": 23,
        "--enable-prefix-caching": True,
        "--scheduling-policy": "priority",
    }


def test_llama_70b_on_one_h200_is_quantized_to_fp8():
    readings = recording(H200_X8)
    readings["devices"] = readings["devices"][:1]
    readings["topology"] = [[None]]
    device = readings["devices"][0]
    total = device["memory"]["total"]  # 143771 MiB
    device["memory"] = {"total": total, "used": 4 * MIB, "free": total - 4 * MIB}
    node = get_gpu_info(backend=ReplayBackend(readings))
    result = recommend(model=shape(LLAMA_31_70B, "llama-70b"), node=node)
    # utilisation (140.397 - 2) / 140.401 = 0.9857 -> 0.95; budget 133.381 GiB
    # bf16: 133.381 - 131.417 - 1.5 = 0.464 GiB -> 3,040 tokens < 8,192 even at a 4096
    # context: 16-bit weights do not fit, and Hopper has FP8
    # fp8: (70,553,706,496 - 2,101,346,304 embeddings) x 1 B + 2,101,346,304 x 2 B
    # = 67.666 GiB; KV 133.381 - 67.666 - 1.5 = 64.215 GiB / 160 KiB = 420,840 tokens
    # >= 262,144: full context; max-num-seqs min(256, 420,840 // 2048 = 205) = 205
    assert result.fits
    assert values(result) == {
        "--dtype": "bfloat16",
        "--kv-cache-dtype": "fp8",
        "--quantization": "fp8",
        "--tensor-parallel-size": 1,
        "--gpu-memory-utilization": 0.95,
        "--block-size": 32,
        "--max-num-seqs": 205,
        "--enable-prefix-caching": True,
        "--scheduling-policy": "priority",
    }


def test_a_busy_node_has_no_room():
    # The recorded H100 board already runs an engine: 3.5 GiB free per GPU, less than the
    # 2 GiB outside the budget plus weights.
    result = recommend(
        model=shape(LLAMA_31_70B, "llama-70b"), node=get_gpu_info(backend=replay(H100_X8))
    )
    assert not result.fits and "does not fit" in result.summary


def gpu_node(
    count: int, nvlinked: set[frozenset[int]], free_mb: list[int] | None = None
) -> NodeView:
    total = 81920
    gpus = [
        GpuInfo(
            index=i,
            name="NVIDIA A100 80GB PCIe",
            compute_capability="8.0",
            memory_total_mb=total,
            memory_free_mb=(free_mb or [total] * count)[i],
            memory_used_mb=total - (free_mb or [total] * count)[i],
        )
        for i in range(count)
    ]
    topology = [
        [
            "X" if i == j else "NV12" if frozenset((i, j)) in nvlinked else "SYS"
            for j in range(count)
        ]
        for i in range(count)
    ]
    return NodeView(kind="gpu", gpus=gpus, topology=topology)


def test_tensor_parallel_prefers_nvlinked_gpus():
    node = gpu_node(4, {frozenset((2, 3))})
    result = recommend(model=shape(LLAMA_31_8B, "llama-8b"), node=node, operator_argv=["-tp", "2"])
    assert result.devices == [2, 3]
    assert result.arguments["--tensor-parallel-size"].source == "operator"


def test_without_nvlink_the_gpus_with_most_free_memory_over_pcie():
    node = gpu_node(3, set(), free_mb=[60000, 81920, 81920])
    result = recommend(
        model=shape(LLAMA_31_8B, "llama-8b"), node=node, operator_argv=["--tensor-parallel-size=2"]
    )
    assert result.devices == [1, 2]
    assert "PCIe" in result.summary


def test_tensor_parallel_must_divide_the_kv_heads():
    config = {**LLAMA_31_70B, "num_key_value_heads": 1}  # multi-query attention
    result = recommend(model=shape(config, "mqa-70b"), node=idle(H100_X8))
    # Only tp 1 divides one KV head, so the 4 NVLinked GPUs of the GQA model are out:
    # parameters 2,101,346,304 + 80 x 840,974,336 + 8192 = 69,379,301,376; 16-bit weights
    # (129.2 GiB) exceed one GPU's 75.665 GiB budget; fp8: 67,277,955,072 x 1 B +
    # 2,101,346,304 x 2 B = 66.571 GiB; KV 75.665 - 66.571 - 1.5 = 7.594 GiB; per token
    # 2 x 80 x 1 x 128 x 1 B = 20 KiB -> 398,135 tokens >= 262,144; 398,135 // 2048 = 194
    assert shape(config, "mqa-70b").parameters == 69_379_301_376
    assert values(result)["--tensor-parallel-size"] == 1
    assert values(result)["--quantization"] == "fp8"
    assert values(result)["--max-num-seqs"] == 194
    assert result.devices == [0]


def test_operator_arguments_win_and_are_shown():
    node = idle(A100_X8)
    operator = ["--max_num_seqs=64", "--no-enable-prefix-caching", "--enforce-eager"]
    result = recommend(model=shape(LLAMA_31_8B, "llama-8b"), node=node, operator_argv=operator)
    argv = result.argv(operator)
    assert argv[-3:] == operator
    assert "--max-num-seqs" not in argv and "--enable-prefix-caching" not in argv
    assert argv[:2] == ["--dtype", "bfloat16"]
    seqs = result.arguments["--max-num-seqs"]
    assert (seqs.value, seqs.source) == ("64", "operator") and "recommended 238" in seqs.reason
    assert result.arguments["--enable-prefix-caching"].value is False


def test_a_pinned_context_is_planned_around():
    result = recommend(
        model=shape(LLAMA_32_3B, "llama-3b"),
        node=idle(T4),
        operator_argv=["--max-model-len", "8192"],
    )
    # 8192 needs 16,384 of the 48,733 KV tokens: fits as given, block 16, nothing capped
    assert result.fits and result.arguments["--max-model-len"].source == "operator"
    assert values(result)["--block-size"] == 16
    assert "--max-model-len" not in result.argv(["--max-model-len", "8192"])[:-2]


def test_cpu_recommends_float32_and_does_not_fight_the_tiny_model_arguments():
    cpu = NodeView(kind="cpu", cpu_count=4, memory_total_mb=16000, memory_available_mb=12000)
    tiny = ["--enforce-eager", "--max-num-seqs", "16"]
    result = recommend(model=None, node=cpu, operator_argv=tiny)
    assert result.fits and result.devices == []
    assert result.argv(tiny) == ["--dtype", "float32", "--scheduling-policy", "priority", *tiny]
    # Without the operator's batch size, vLLM's CPU default is stated for the gateways to read.
    assert recommend(model=None, node=cpu, operator_argv=[]).argv([]) == [
        "--dtype",
        "float32",
        "--max-num-seqs",
        "128",
        "--scheduling-policy",
        "priority",
    ]
    explicit = ["--enforce-eager", "--dtype", "float32", "--max-num-seqs", "16"]
    assert recommend(model=None, node=cpu, operator_argv=explicit).argv(explicit) == [
        "--scheduling-policy",
        "priority",
        *explicit,
    ]


def test_unknown_model_shape_gets_gpu_settings_only():
    result = recommend(model=None, node=idle(H100_X8))
    assert result.fits and result.devices == list(range(8))
    assert set(values(result)) == {
        "--dtype",
        "--kv-cache-dtype",
        "--gpu-memory-utilization",
        "--enable-prefix-caching",
        "--scheduling-policy",
    }


def test_model_shape_from_a_model_directory(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({**LLAMA_31_8B, "torch_dtype": None, "dtype": "float16"})
    )
    index = {"metadata": {"total_size": 16_060_522_496}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    model = ModelShape.from_pretrained(str(tmp_path))
    assert model.dtype == "float16" and model.parameters == 16_060_522_496 // 2
    assert (model.num_layers, model.num_kv_heads, model.head_dim) == (32, 8, 128)
    # A float16 checkpoint stays float16 on a GPU that could run bf16.
    assert recommend(model=model, node=idle(A100_X8)).arguments["--dtype"].value == "float16"
    assert ModelShape.from_pretrained(str(tmp_path / "missing")) is None


def test_operator_flags_are_normalised():
    flags = operator_flags(
        [
            "-tp",
            "2",
            "--max_num_seqs=8",
            "--no-enable-prefix-caching",
            "--enforce-eager",
            "--max-model-len",
            "4096",
            "--seed",
            "-1",
        ]
    )
    assert flags == {
        "--tensor-parallel-size": "2",
        "--max-num-seqs": "8",
        "--enable-prefix-caching": "false",
        "--enforce-eager": None,
        "--max-model-len": "4096",
        "--seed": "-1",
    }
