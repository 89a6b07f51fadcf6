"""The real device through the real NVML backend: runs only where a GPU is (see conftest.py)."""

import json
import re

import pytest

from inference.hardware.detection import get_gpu_info
from inference.hardware.engine_args import ModelShape, recommend
from inference.hardware.nvml import open_backend
from inference.hardware.view import NodeView

pytestmark = pytest.mark.gpu

# A 0.5B-parameter Qwen2.5-like model: small enough for any GPU this project runs on.
SMALL_MODEL = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def test_real_gpus_give_the_uniform_view():
    backend = open_backend()
    assert backend is not None
    try:
        view = get_gpu_info(backend=backend)
    finally:
        backend.close()
    assert view.kind == "gpu" and view.gpus
    assert len(view.topology) == len(view.gpus)
    assert all(len(row) == len(view.gpus) for row in view.topology)
    for position, gpu in enumerate(view.gpus):
        assert gpu.name and gpu.uuid and gpu.uuid.startswith("GPU-")
        assert re.fullmatch(r"\d+\.\d+", gpu.compute_capability)
        assert gpu.memory_total_mb > 1024
        # NVML's used + free is its total, less what the MiB rounding drops.
        assert gpu.memory_total_mb - 2 <= gpu.memory_used_mb + gpu.memory_free_mb
        assert gpu.profile is not None  # a known SKU's, or a generic one
        for fraction in (gpu.gpu_utilization, gpu.memory_bandwidth_utilization):
            assert fraction is None or 0.0 <= fraction <= 1.0
        assert gpu.pcie.max_width is None or gpu.pcie.max_width >= 1
        assert view.topology[position][position] == "X"
    assert NodeView.from_dict(json.loads(json.dumps(view.to_dict()))) == view
    result = recommend(model=ModelShape.from_config(SMALL_MODEL, name="small"), node=view)
    assert result.fits and set(result.devices) <= {gpu.index for gpu in view.gpus}
