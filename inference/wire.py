"""What the inference worker and the platform say to each other over HTTP.

The one definition of the node protocol: the worker builds these, the platform parses them with
`from_dict`, which checks every field's type, so neither side keeps its own copy of the schema.
No Django here: the worker imports this module in its own virtualenv.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

REGISTER_PATH = "/internal/v1/nodes/register"
HEARTBEAT_PATH = "/internal/v1/nodes/{node_id}/heartbeat"
TOKENIZER_PATH = "/internal/v1/tokenizers/{sha256}"
# The model's name and the version's tag, each URL-quoted (a model's name may hold a slash).
ENGINE_SETTINGS_PATH = "/internal/v1/models/{model}/versions/{version}/engine"

NODE_STATUSES = ("up", "draining", "down")
# What a model's engine runs as (apps.models.choices.ModelKind): a generating model, or a
# pooling one that embeds.
MODEL_KINDS = ("generate", "embed")


class WireError(ValueError):
    """A payload does not match the protocol; `field` names the offending path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


Check = Callable[[Any, str], Any]


@functools.cache
def _checker(hint: Any) -> Check:
    """Return a function that type-checks a value against `hint` (raising WireError with its
    path) and returns it parsed. Built once per type: a heartbeat with eight GPUs' views is a
    few hundred values, checked every few seconds for every node."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        nullable = type(None) in options
        inner = _checker(next(option for option in options if option is not type(None)))

        def check_optional(value: Any, path: str) -> Any:
            return None if value is None and nullable else inner(value, path)

        return check_optional
    if dataclasses.is_dataclass(hint):
        return lambda value, path: hint.from_dict(value, path=path)
    if origin is list:
        item = _checker(typing.get_args(hint)[0])

        def check_list(value: Any, path: str) -> list:
            if not isinstance(value, list):
                raise WireError(path, "must be a list")
            return [item(entry, f"{path}[{i}]") for i, entry in enumerate(value)]

        return check_list
    if origin is dict or hint is dict:
        return _typed(dict, "must be an object")
    if hint is float:

        def check_number(value: Any, path: str) -> float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise WireError(path, "must be a number")
            return float(value)

        return check_number
    if hint is int:

        def check_integer(value: Any, path: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise WireError(path, "must be an integer")
            return value

        return check_integer
    return _typed(hint, f"must be of type {hint.__name__}")


def _typed(kind: type, message: str) -> Check:
    def check(value: Any, path: str) -> Any:
        if not isinstance(value, kind):
            raise WireError(path, message)
        return value

    return check


@functools.cache
def _schema(cls: type) -> tuple[tuple[str, Check, bool], ...]:
    """Each field's name, checker and whether it is required. Resolving the string annotations
    on every parse cost more than the parse itself (a heartbeat with eight GPUs: 19 ms)."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            f.name,
            _checker(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )


class Message:
    """Base of the protocol's dataclasses: strict parsing and plain-dict output."""

    @classmethod
    def from_dict(cls, data: Any, *, path: str = "") -> Self:
        """Parse and type-check a JSON object; unknown keys are ignored for forward compat."""
        if not isinstance(data, dict):
            raise WireError(path or "body", "must be an object")
        values = {}
        for field_name, check, required in _schema(cls):
            name = f"{path}.{field_name}" if path else field_name
            if field_name not in data:
                if required:
                    raise WireError(name, "is required")
                continue
            values[field_name] = check(data[field_name], name)
        instance = cls(**values)
        instance.validate()
        return instance

    def validate(self) -> None:
        """Check constraints beyond types; subclasses raise WireError."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass(slots=True)
class EngineLoad(Message):
    """The engine's load, read from vLLM's own /metrics."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    # Over the last heartbeat window; None when the engine finished no request in it.
    ttft_p95_ms: float | None = None
    e2e_p95_ms: float | None = None
    generation_tokens_per_second: float = 0.0
    # Prompt tokens per second its prefills computed lately; 0.0 until measured.
    prefill_tokens_per_second: float = 0.0
    # Tokens per second one sequence decoded at lately (vLLM's inter-token latency); 0.0 until
    # measured.
    decode_tokens_per_second: float = 0.0
    # The prompt prefixes its KV cache holds (inference.prefix_cache.PrefixFilter, base64);
    # None where the engine publishes no KV-cache events.
    prefix_filter: str | None = None

    def validate(self) -> None:
        if not 0.0 <= self.kv_cache_usage <= 1.0:
            raise WireError("engine.kv_cache_usage", "must be between 0 and 1")
        if self.num_requests_running < 0 or self.num_requests_waiting < 0:
            raise WireError("engine", "request counts must not be negative")


@dataclass(slots=True)
class Registration(Message):
    """A worker announcing the model it serves and where."""

    name: str
    url: str
    model: str
    version: str
    served_model_name: str
    max_model_len: int
    tokenizer_sha256: str | None = None
    resources: dict = field(default_factory=dict)
    engine_args: dict = field(default_factory=dict)

    def validate(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise WireError("url", "must be an http(s) URL")
        if self.max_model_len < 1:
            raise WireError("max_model_len", "must be positive")
        for name in ("name", "model", "version", "served_model_name"):
            if not getattr(self, name):
                raise WireError(name, "must not be empty")


@dataclass(slots=True)
class RegistrationAccepted(Message):
    node_id: int
    heartbeat_seconds: float
    tokenizer_wanted: bool = False


@dataclass(slots=True)
class Heartbeat(Message):
    """A worker's periodic report; `status` is how the worker sees itself."""

    status: str
    engine: EngineLoad = field(default_factory=EngineLoad)
    resources: dict = field(default_factory=dict)

    def validate(self) -> None:
        if self.status not in NODE_STATUSES:
            raise WireError("status", f"must be one of {', '.join(NODE_STATUSES)}")


@dataclass(slots=True)
class HeartbeatAccepted(Message):
    """The platform's answer to a heartbeat: what it stored, and the operator's drain."""

    node_id: int
    status: str
    # An operator drained the node: gateways send it no new requests until it is undrained.
    drained: bool = False


@dataclass(slots=True)
class EngineSettings(Message):
    """What the platform's registry says a model version's engine starts with; None: vLLM's
    default (no parser, the tokenizer's chat template)."""

    kind: str = "generate"
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None

    def validate(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise WireError("kind", f"must be one of {', '.join(MODEL_KINDS)}")


@dataclass(slots=True)
class TokenizerUpload(Message):
    """A model's tokenizer files, sent once per distinct tokenizer."""

    tokenizer_json: str
    chat_template: str = ""
    bos_token: str = ""
    eos_token: str = ""


def tokenizer_digest(upload: TokenizerUpload) -> str:
    """Return the content hash that names a tokenizer on both sides of the wire."""
    digest = hashlib.sha256()
    for part in (upload.tokenizer_json, upload.chat_template, upload.bos_token, upload.eos_token):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()
