"""What the inference worker and the platform say to each other over HTTP.

The one definition of the node protocol: the worker builds these, the platform parses them with
`from_dict` (or `from_json` straight from a request's body), which checks every field's type
and constraint (msgspec), so neither side keeps its own copy of the schema. No Django here: the
worker imports this module in its own virtualenv.
"""

from __future__ import annotations

import hashlib
import re
import typing
from typing import Annotated, Any, Literal, Self

import msgspec

REGISTER_PATH = "/internal/v1/nodes/register"
HEARTBEAT_PATH = "/internal/v1/nodes/{node_id}/heartbeat"
TOKENIZER_PATH = "/internal/v1/tokenizers/{sha256}"
# The model's name and the version's tag, each URL-quoted (a model's name may hold a slash).
ENGINE_SETTINGS_PATH = "/internal/v1/models/{model}/versions/{version}/engine"

NodeStatus = Literal["up", "draining", "down"]
NODE_STATUSES = typing.get_args(NodeStatus)
# What a model's engine runs as (apps.models.choices.ModelKind): a generating model, or a
# pooling one that embeds.
ModelKind = Literal["generate", "embed"]
MODEL_KINDS = typing.get_args(ModelKind)

Count = Annotated[int, msgspec.Meta(ge=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Name = Annotated[str, msgspec.Meta(min_length=1)]


class WireError(ValueError):
    """A payload does not match the protocol; `field` names the offending path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# msgspec names where a value failed as "<message> - at `$.engine.kv_cache_usage`".
_AT = re.compile(r"(?P<message>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?", re.S)
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]+)`")


def _joined(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def _wire_error(error: msgspec.ValidationError, path: str) -> WireError:
    """msgspec's error as the protocol's: the field's path and what is wrong with it."""
    found = _AT.fullmatch(str(error))
    assert found is not None  # the pattern matches any text
    message, at = found["message"], found["path"] or ""
    cause = error.__cause__
    if isinstance(cause, WireError):  # a cross-field check in a message's __post_init__
        at, message = _joined(at, cause.field), cause.message
    elif missing := _MISSING.fullmatch(message):
        at, message = _joined(at, missing["name"]), "is required"
    return WireError(_joined(path, at) or path or "body", message)


class Message(msgspec.Struct, kw_only=True):
    """Base of the protocol's messages: strict parsing, plain-dict output. Unknown keys are
    ignored for forward compatibility; a bool is not an int, an int is a float."""

    @classmethod
    def from_dict(cls, data: Any, *, path: str = "") -> Self:
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as error:
            raise _wire_error(error, path) from None

    @classmethod
    def from_json(cls, body: bytes) -> Self:
        """Parse a JSON body straight into the message (no intermediate dicts)."""
        try:
            return msgspec.json.decode(body, type=cls)
        except msgspec.ValidationError as error:
            raise _wire_error(error, "") from None
        except msgspec.DecodeError as error:
            raise WireError("body", f"The body is not valid JSON: {error}") from None

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


class EngineLoad(Message):
    """The engine's load, read from vLLM's own /metrics."""

    num_requests_running: Count = 0
    num_requests_waiting: Count = 0
    kv_cache_usage: Fraction = 0.0
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


class Registration(Message):
    """A worker announcing the model it serves and where."""

    name: Name
    url: Annotated[str, msgspec.Meta(pattern=r"^https?://")]
    model: Name
    version: Name
    served_model_name: Name
    max_model_len: Annotated[int, msgspec.Meta(ge=1)]
    tokenizer_sha256: str | None = None
    resources: dict = {}
    engine_args: dict = {}


class RegistrationAccepted(Message):
    node_id: int
    heartbeat_seconds: float
    tokenizer_wanted: bool = False


class Heartbeat(Message):
    """A worker's periodic report; `status` is how the worker sees itself."""

    status: NodeStatus
    engine: EngineLoad = msgspec.field(default_factory=EngineLoad)
    resources: dict = {}


class HeartbeatAccepted(Message):
    """The platform's answer to a heartbeat: what it stored, and the operator's drain."""

    node_id: int
    status: str
    # An operator drained the node: gateways send it no new requests until it is undrained.
    drained: bool = False


class EngineSettings(Message):
    """What the platform's registry says a model version's engine starts with; None: vLLM's
    default (no parser, the tokenizer's chat template)."""

    kind: ModelKind = "generate"
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None


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
