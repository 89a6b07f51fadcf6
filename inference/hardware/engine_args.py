"""Recommend vLLM's arguments for a model on this node's hardware, each with its reason.

The same worker runs on a T4 or eight H200s: it reads the model's shape (config.json) and the
node's view (inference.hardware.detection) and asks `recommend()` for the engine settings that
suit them. Arguments the operator gives vLLM explicitly are kept and win; the recommendation
plans around them (a given --max-model-len or --tensor-parallel-size is used, not second-
guessed). Memory is counted in GiB, as NVML and vLLM report it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inference.hardware.profiles import BF16_FROM, FP8_FROM, parse_compute_capability
from inference.hardware.view import GpuInfo, NodeView

GIB = 1024**3

# Hopper (cc 9.0) is where vLLM's attention kernels read an fp8 KV cache without slowing down.
FP8_KV_FROM = (9, 0)
# vLLM's budget is a fraction of each GPU's memory; outside it stay the CUDA context, the
# allocator's fragmentation and anything else on the GPU. This much is left outside, GiB...
OUTSIDE_BUDGET_GIB = 2.0
# ...and never less than 5% of the GPU: above 0.95 an 80 GB GPU runs out on allocator slack.
MAX_GPU_MEMORY_UTILIZATION = 0.95
# Inside the budget, besides weights and KV cache: the activation peak vLLM profiles at its
# default batch of tokens, CUDA-graph pools and NCCL buffers, for dense models up to ~70B.
RUNTIME_RESERVE_GIB = 1.5
# A useful KV cache holds at least this many sequences at a quarter of the context each (and
# never less than one full context, without which vLLM refuses to start): fewer, and
# continuous batching has little to batch.
USEFUL_BATCH = 8
TYPICAL_CONTEXT_FRACTION = 0.25
# A context shorter than this is not worth serving: chat prompts with history overflow it.
MIN_CONTEXT = 4096
# Prompt plus completion of a typical chat request through the gateway: --max-num-seqs lets
# this many-token requests fill the cache; longer ones make vLLM preempt, which it handles.
TYPICAL_REQUEST_TOKENS = 2048
# vLLM's long-standing default: more running sequences per step mostly add latency.
MAX_NUM_SEQS = 256
CPU_MAX_NUM_SEQS = 128  # vLLM's default for its OpenAI server on a CPU (EngineArgs, world size 1)
# From this context on, 32-token KV blocks halve the block tables of long sequences; below it
# vLLM's default 16 loses less memory in half-filled last blocks.
LONG_CONTEXT = 32768
LONG_CONTEXT_BLOCK_SIZE = 32
BLOCK_SIZE = 16

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
# Weight bytes per parameter of vLLM's quantization methods; others are counted as 16-bit.
QUANTIZATION_BYTES = {"fp8": 1, "fbgemm_fp8": 1, "awq": 0.5, "gptq": 0.5, "awq_marlin": 0.5}
# vLLM's short flags.
FLAG_ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-q": "--quantization",
    "-pp": "--pipeline-parallel-size",
}


class ModelShapeError(ValueError):
    """A config.json lacks what the recommendation needs."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What sizes a model's memory: parameters, checkpoint dtype, attention shape, context."""

    name: str
    parameters: int
    dtype: str  # the checkpoint's: "bfloat16", "float16", "float32"
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    # Embedding and LM head parameters: vLLM's fp8 quantization leaves them 16-bit.
    embedding_parameters: int = 0
    # A checkpoint quantized already (its config's quant_method) and its size on disk.
    quantization: str | None = None
    weight_bytes: int | None = None

    def kv_bytes_per_token(self, element_bytes: float) -> float:
        """Bytes one token's keys and values take over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_bytes

    @classmethod
    def from_config(
        cls, config: dict[str, Any], *, name: str = "model", weight_bytes: int | None = None
    ) -> ModelShape:
        """Read a Hugging Face config.json; count parameters from the weights' size if given."""
        text = config.get("text_config") or config  # multimodal configs nest the language model
        try:
            hidden = int(text["hidden_size"])
            layers = int(text["num_hidden_layers"])
            heads = int(text["num_attention_heads"])
            context = int(text["max_position_embeddings"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelShapeError(f"{name}: config.json lacks {exc}") from exc
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or hidden // heads)
        dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "")
        dtype = dtype if dtype in DTYPE_BYTES else "bfloat16"
        quantization = (config.get("quantization_config") or {}).get("quant_method")
        vocab = int(text.get("vocab_size") or 0)
        tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
        embedding = vocab * hidden * (1 if tied else 2)
        if weight_bytes and not quantization:
            parameters = weight_bytes // DTYPE_BYTES[dtype]
        else:
            parameters = _estimate_parameters(text, hidden, layers, heads, kv_heads, head_dim)
            parameters += embedding
        return cls(
            name=name,
            parameters=parameters,
            dtype=dtype,
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_context=context,
            embedding_parameters=embedding,
            quantization=quantization,
            weight_bytes=weight_bytes,
        )

    @classmethod
    def from_pretrained(cls, model: str) -> ModelShape | None:
        """Read a model directory or a hub id already in the local cache; None if neither."""
        directory = _model_directory(model)
        if directory is None or not (directory / "config.json").is_file():
            return None
        config = json.loads((directory / "config.json").read_text())
        return cls.from_config(config, name=model, weight_bytes=_weight_bytes(directory))


def _estimate_parameters(
    config: dict[str, Any], hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int
) -> int:
    """Count a Llama-style decoder's parameters from its config (embeddings excluded)."""
    intermediate = int(config.get("intermediate_size") or 4 * hidden)
    experts = int(config.get("num_local_experts") or config.get("num_experts") or 1)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o; k, v
    mlp = 3 * hidden * intermediate * experts + (hidden * experts if experts > 1 else 0)
    norms = 2 * hidden
    return layers * (attention + mlp + norms) + hidden  # + the final norm


def _model_directory(model: str) -> Path | None:
    path = Path(model)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import try_to_load_from_cache  # the worker's venv has it (vLLM)
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a hub id either (a path that does not exist)
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def _weight_bytes(directory: Path) -> int | None:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if total:
            return int(total)
    sizes = [path.stat().st_size for path in directory.glob("*.safetensors")]
    return sum(sizes) or None


# --- the operator's own vLLM arguments ---------------------------------------------------------


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def operator_flags(argv: Sequence[str]) -> dict[str, str | None]:
    """Return the flags in a vLLM command line, normalised (--max_num_seqs is --max-num-seqs)."""
    flags: dict[str, str | None] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if not token.startswith("-") or _is_number(token):
            continue
        name, has_value, value = token.partition("=")
        name = FLAG_ALIASES.get(name, name)
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        if name.startswith("--no-"):
            flags["--" + name[5:]] = "false"
            continue
        if not has_value and index < len(argv):
            following = argv[index]
            if not following.startswith("-") or _is_number(following):
                value, has_value = following, "="
                index += 1
        flags[name] = value if has_value else None
    return flags


# The flags the plan takes as given when the operator sets them.
PINNED_FLAGS = (
    "--dtype",
    "--kv-cache-dtype",
    "--quantization",
    "--tensor-parallel-size",
    "--max-model-len",
    "--gpu-memory-utilization",
)


@dataclass(frozen=True, slots=True)
class Pinned:
    """What the operator fixed on vLLM's command line; the plan takes it as given."""

    dtype: str | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None

    @classmethod
    def from_flags(cls, flags: dict[str, str | None]) -> Pinned:
        def number(flag: str, kind: type) -> Any:
            try:
                return kind(flags[flag]) if flags.get(flag) else None
            except ValueError:
                return None

        return cls(
            dtype=flags.get("--dtype"),
            kv_cache_dtype=flags.get("--kv-cache-dtype"),
            quantization=flags.get("--quantization"),
            tensor_parallel_size=number("--tensor-parallel-size", int),
            max_model_len=number("--max-model-len", int),
            gpu_memory_utilization=number("--gpu-memory-utilization", float),
        )


# --- the recommendation ------------------------------------------------------------------------


@dataclass(slots=True)
class Argument:
    value: str | int | float | bool
    reason: str
    source: str = "recommended"  # or "operator": given on the command line, kept as given


@dataclass(slots=True)
class Recommendation:
    """vLLM arguments with reasons, whether the model fits, and on which GPUs it should run."""

    fits: bool
    summary: str
    arguments: dict[str, Argument] = field(default_factory=dict)
    devices: list[int] = field(default_factory=list)  # NVML indices; [] on a CPU node
    notes: list[str] = field(default_factory=list)

    def argv(self, operator_argv: Sequence[str]) -> list[str]:
        """Return vLLM's arguments: the recommended ones the operator did not set, then theirs."""
        taken = operator_flags(operator_argv)
        recommended: list[str] = []
        for flag, argument in self.arguments.items():
            if flag in taken or argument.source == "operator":
                continue
            if argument.value is True:
                recommended.append(flag)
            elif argument.value is False:
                recommended.append("--no-" + flag[2:])
            else:
                recommended += [flag, str(argument.value)]
        return [*recommended, *operator_argv]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Plan:
    """One way to place the model: which GPUs, how many bytes where, how long a context."""

    positions: tuple[int, ...]  # into NodeView.gpus
    nvlink: bool
    quantization: str | None
    utilization: float
    weights_gib: float  # per GPU
    kv_tokens: int
    context: int


def _floor2(value: float) -> float:
    return math.floor(value * 100) / 100


def _needed_tokens(context: int) -> int:
    return max(context, USEFUL_BATCH * math.ceil(context * TYPICAL_CONTEXT_FRACTION))


def _cc(gpu: GpuInfo) -> tuple[int, int]:
    return parse_compute_capability(gpu.compute_capability) if gpu.compute_capability else (0, 0)


def _dtype(model: ModelShape | None, cc: tuple[int, int]) -> Argument:
    label = "{}.{}".format(*cc)
    if cc < BF16_FROM:
        return Argument("float16", f"compute capability {label} has no BF16 tensor cores")
    if model is not None and model.dtype == "float16":
        return Argument("float16", "the checkpoint is float16: bfloat16 would drop 3 mantissa bits")
    return Argument(
        "bfloat16", f"compute capability {label} has BF16 tensor cores; bf16 keeps fp32's range"
    )


def _kv_cache_dtype(cc: tuple[int, int]) -> Argument:
    label = "{}.{}".format(*cc)
    if cc >= FP8_KV_FROM:
        reason = f"cc {label}, Hopper or newer, reads an fp8 KV cache at full speed: 2x tokens"
        return Argument("fp8", reason)
    reason = f"cc {label} predates Hopper's fp8 attention kernels: the cache keeps the dtype"
    return Argument("auto", reason)


def _element_bytes(dtype: str) -> float:
    return DTYPE_BYTES.get(dtype, 2)


def _weight_bytes_for(model: ModelShape, dtype: str, quantization: str | None) -> float:
    if model.quantization:
        if model.weight_bytes:
            return model.weight_bytes
        return model.parameters * QUANTIZATION_BYTES.get(model.quantization, 2)
    if quantization:
        body = model.parameters - model.embedding_parameters
        return body * QUANTIZATION_BYTES.get(quantization, 2) + model.embedding_parameters * 2
    return model.parameters * _element_bytes(dtype)


def _device_sets(node: NodeView, size: int) -> list[tuple[tuple[int, ...], bool]]:
    """Return the GPU sets of a size, best first: NVLink all-to-all, then the most free memory."""
    sets = []
    for positions in itertools.combinations(range(len(node.gpus)), size):
        nvlink = all(node.nvlinked(a, b) for a, b in itertools.combinations(positions, 2))
        free = min(node.gpus[p].memory_free_mb or 0 for p in positions)
        sets.append((positions, nvlink, free))
    sets.sort(key=lambda entry: (not entry[1], -entry[2], entry[0]))
    return [(positions, nvlink) for positions, nvlink, _ in sets]


def _utilization(gpus: list[GpuInfo], pinned: float | None) -> float:
    if pinned is not None:
        return pinned
    headroom = min(
        ((gpu.memory_free_mb or 0) / 1024 - OUTSIDE_BUDGET_GIB) * 1024 / (gpu.memory_total_mb or 1)
        for gpu in gpus
    )
    return min(MAX_GPU_MEMORY_UTILIZATION, _floor2(headroom))


def _plan(
    model: ModelShape,
    node: NodeView,
    positions: tuple[int, ...],
    nvlink: bool,
    *,
    dtype: str,
    kv_bytes: float,
    quantization: str | None,
    pinned: Pinned,
    capped: bool,
) -> Plan | None:
    gpus = [node.gpus[p] for p in positions]
    utilization = _utilization(gpus, pinned.gpu_memory_utilization)
    total_gib = min((gpu.memory_total_mb or 0) / 1024 for gpu in gpus)
    budget = utilization * total_gib
    size = len(positions)
    weights = _weight_bytes_for(model, dtype, quantization) / size / GIB
    kv_gib = budget - weights - RUNTIME_RESERVE_GIB
    if utilization <= 0 or kv_gib <= 0:
        return None
    kv_tokens = math.floor(kv_gib * GIB * size / model.kv_bytes_per_token(kv_bytes))
    full = pinned.max_model_len or model.max_context
    context = full if _needed_tokens(full) <= kv_tokens else None
    if context is None and capped and pinned.max_model_len is None:
        candidate = 1 << (full.bit_length() - 1)  # the largest power of two below the context
        candidate = candidate // 2 if candidate == full else candidate
        while candidate >= MIN_CONTEXT and _needed_tokens(candidate) > kv_tokens:
            candidate //= 2
        context = candidate if candidate >= MIN_CONTEXT else None
    if context is None:
        return None
    return Plan(positions, nvlink, quantization, utilization, weights, kv_tokens, context)


def _tensor_parallel_sizes(model: ModelShape, node: NodeView, pinned: Pinned) -> list[int]:
    pinned_size = pinned.tensor_parallel_size
    if pinned_size is not None:
        return [pinned_size] if pinned_size <= len(node.gpus) else []
    sizes = []
    size = 1
    while size <= len(node.gpus):
        if model.num_kv_heads % size == 0 and model.num_attention_heads % size == 0:
            sizes.append(size)
        size *= 2
    return sizes


def _search(
    model: ModelShape, node: NodeView, *, dtype: str, kv_bytes: float, pinned: Pinned
) -> Plan | None:
    """Return the first plan that fits, in order of preference.

    16-bit weights before fp8 (quantization only when nothing else fits); the model's full
    context before a shorter one; the fewest GPUs, NVLink-connected where possible.
    """
    cc = min(_cc(gpu) for gpu in node.gpus)
    if pinned.quantization is not None:
        quantizations = [pinned.quantization]
    elif model.quantization is None and cc >= FP8_FROM:
        quantizations = [None, "fp8"]
    else:
        quantizations = [None]
    sizes = _tensor_parallel_sizes(model, node, pinned)
    for quantization in quantizations:
        for capped in (False, True):
            for size in sizes:
                for positions, nvlink in _device_sets(node, size):
                    plan = _plan(
                        model,
                        node,
                        positions,
                        nvlink,
                        dtype=dtype,
                        kv_bytes=kv_bytes,
                        quantization=quantization,
                        pinned=pinned,
                        capped=capped,
                    )
                    if plan is not None:
                        return plan
    return None


def _scheduling() -> Argument:
    return Argument(
        "priority",
        "the gateway sends each key's priority tier with its requests; vLLM orders its queue by "
        "it only under this policy",
    )


def _cpu(flags: dict[str, str | None]) -> Recommendation:
    arguments = {
        "--dtype": Argument(
            "float32",
            "CPU: vLLM's bfloat16 CPU attention takes an AMX path that dies with SIGILL on some "
            "virtual machines (inference/tiny_model.py)",
        ),
        "--max-num-seqs": Argument(
            CPU_MAX_NUM_SEQS,
            "vLLM's own CPU default for its API server, stated so that gateways know the batch "
            "(they count requests beyond it as queued)",
        ),
    }
    arguments["--scheduling-policy"] = _scheduling()
    _mark_operator(arguments, flags)
    return Recommendation(
        fits=True,
        summary="CPU node: float32, vLLM's batch, the rest left to vLLM",
        arguments=arguments,
        notes=[
            "CPU: vLLM sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, not from GPU memory, so "
            "tensor parallelism, memory utilisation and block size are left to it"
        ],
    )


def _mark_operator(arguments: dict[str, Argument], flags: dict[str, str | None]) -> None:
    """Show the operator's value for every flag they set that the plan reads or recommends."""
    for flag, value in flags.items():
        recommended = arguments.get(flag)
        if recommended is None and flag not in PINNED_FLAGS:
            continue
        reason = "set by the operator"
        given: str | bool = True if value is None else False if value == "false" else value
        if recommended is not None and str(recommended.value) != str(given):
            reason += f" (recommended {recommended.value}: {recommended.reason})"
        arguments[flag] = Argument(given, reason, source="operator")


def _gpus_label(node: NodeView, positions: Sequence[int]) -> str:
    return ", ".join(str(node.gpus[p].index) for p in positions)


def _too_big(model: ModelShape, node: NodeView, dtype: str, pinned: Pinned) -> str:
    cc = min(_cc(gpu) for gpu in node.gpus)
    weights = _weight_bytes_for(model, dtype, None) / GIB
    utilization = _utilization(node.gpus, pinned.gpu_memory_utilization)
    room = sum(max(utilization, 0) * (gpu.memory_total_mb or 0) / 1024 for gpu in node.gpus)
    sizes = ", ".join(map(str, _tensor_parallel_sizes(model, node, pinned))) or "none"
    if model.quantization:
        fp8 = f"; the checkpoint is {model.quantization} already"
    elif cc >= FP8_FROM:
        fp8_gib = _weight_bytes_for(model, dtype, "fp8") / GIB
        fp8 = f"; in fp8 the weights still take {fp8_gib:.1f} GiB"
    else:
        fp8 = f"; cc {'{}.{}'.format(*cc)} has no FP8 to quantize to"
    return (
        f"{model.name} does not fit: {weights:.1f} GiB of {dtype} weights and a KV cache of at "
        f"least {_needed_tokens(MIN_CONTEXT)} tokens need more than the {room:.1f} GiB usable on "
        f"{len(node.gpus)} x {node.gpus[0].name} (tensor-parallel sizes tried: {sizes}){fp8}"
    )


def recommend(
    *, model: ModelShape | None, node: NodeView, operator_argv: Sequence[str] = ()
) -> Recommendation:
    """Return vLLM arguments for the model on this node, or why it does not fit."""
    flags = operator_flags(operator_argv)
    pinned = Pinned.from_flags(flags)
    if node.kind == "cpu" or not node.gpus:
        return _cpu(flags)
    cc = min(_cc(gpu) for gpu in node.gpus)
    dtype_arg = _dtype(model, cc)
    kv_arg = _kv_cache_dtype(cc)
    dtype = pinned.dtype if pinned.dtype not in (None, "auto") else str(dtype_arg.value)
    kv_dtype = pinned.kv_cache_dtype or str(kv_arg.value)
    kv_bytes = 1 if kv_dtype.startswith("fp8") else _element_bytes(dtype)
    prefix = Argument(
        True,
        "chat traffic repeats system prompts and history: cached KV blocks skip recomputing "
        "them, and the router sends related requests to the same node",
    )
    arguments = {"--dtype": dtype_arg, "--kv-cache-dtype": kv_arg}
    if model is None:
        utilization = _utilization(node.gpus, pinned.gpu_memory_utilization)
        arguments["--gpu-memory-utilization"] = Argument(
            utilization, f"free memory less {OUTSIDE_BUDGET_GIB:g} GiB, at most 0.95"
        )
        arguments["--enable-prefix-caching"] = prefix
        arguments["--scheduling-policy"] = _scheduling()
        _mark_operator(arguments, flags)
        return Recommendation(
            fits=True,
            summary="model shape unknown (no config.json): GPU settings only",
            arguments=arguments,
            devices=[gpu.index for gpu in node.gpus],
            notes=["model shape unknown: tensor parallelism, context and batch left to vLLM"],
        )

    plan = _search(model, node, dtype=dtype, kv_bytes=kv_bytes, pinned=pinned)
    if plan is None:
        arguments["--scheduling-policy"] = _scheduling()
        _mark_operator(arguments, flags)
        return Recommendation(
            fits=False, summary=_too_big(model, node, dtype, pinned), arguments=arguments
        )

    gpus = [node.gpus[p] for p in plan.positions]
    size = len(plan.positions)
    if plan.quantization:
        arguments["--quantization"] = Argument(
            plan.quantization,
            f"{_weight_bytes_for(model, dtype, None) / GIB:.1f} GiB of {dtype} weights fit no "
            f"GPU set here; cc {'{}.{}'.format(*cc)} runs FP8 weights natively (embeddings and "
            "LM head stay 16-bit)",
        )
    link = "NVLink" if plan.nvlink else "PCIe"
    where = f"GPUs {_gpus_label(node, plan.positions)}"
    if size > 1:
        where += f", {link}" + ("" if plan.nvlink else ": no NVLink set of this size here")
    arguments["--tensor-parallel-size"] = Argument(
        size,
        f"the fewest GPUs (a power of two dividing {model.num_kv_heads} KV heads) holding "
        f"{plan.weights_gib:.1f} GiB of weights each and a KV cache for {USEFUL_BATCH} sequences "
        f"of a quarter context ({where})",
    )
    arguments["--gpu-memory-utilization"] = Argument(
        plan.utilization,
        f"min(0.95, free memory less {OUTSIDE_BUDGET_GIB:g} GiB outside vLLM's budget, over "
        f"{min(g.memory_total_mb or 0 for g in gpus) / 1024:.1f} GiB per GPU)",
    )
    if plan.context < (pinned.max_model_len or model.max_context):
        arguments["--max-model-len"] = Argument(
            plan.context,
            f"the full {model.max_context}-token context leaves no room for {USEFUL_BATCH} "
            f"sequences of a quarter of it; {plan.context} (a power of two) does",
        )
    block = LONG_CONTEXT_BLOCK_SIZE if plan.context >= LONG_CONTEXT else BLOCK_SIZE
    arguments["--block-size"] = Argument(
        block,
        f"{block}-token blocks for a {plan.context}-token context"
        + (": shorter block tables" if block > BLOCK_SIZE else ": less lost in part-filled blocks"),
    )
    per_request = min(plan.context, TYPICAL_REQUEST_TOKENS)
    sequences = max(1, min(MAX_NUM_SEQS, plan.kv_tokens // per_request))
    arguments["--max-num-seqs"] = Argument(
        sequences,
        f"the KV cache holds {plan.kv_tokens} tokens: {plan.kv_tokens // per_request} requests "
        f"of {per_request} tokens, at most {MAX_NUM_SEQS}",
    )
    arguments["--enable-prefix-caching"] = prefix
    arguments["--scheduling-policy"] = _scheduling()
    _mark_operator(arguments, flags)
    kv_gib = plan.kv_tokens * model.kv_bytes_per_token(kv_bytes) / GIB
    return Recommendation(
        fits=True,
        summary=(
            f"{model.name}: tensor parallel {size} on {where}, {dtype}"
            f"{' + fp8 weights' if plan.quantization else ''}, {plan.context}-token context, "
            f"{kv_gib:.1f} GiB of KV cache"
        ),
        arguments=arguments,
        devices=[gpu.index for gpu in gpus],
    )
