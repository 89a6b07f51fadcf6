"""One completion request's state, as the pipeline's stages fill it in (apps.gateway.pipeline)."""

from __future__ import annotations

import os
import time
from typing import Any

from django.conf import settings

from apps.gateway import tracing
from apps.gateway.context import PromptCount
from apps.gateway.dialects import dialect_for
from apps.gateway.dialects.base import StreamWriter
from apps.gateway.outputs import StreamEditor
from apps.gateway.reply import ClientReply
from apps.gateway.schemas import CompletionRequest, Endpoint
from apps.keys.gate import Admission, KeyRecord, Settlement, UsageStatus
from apps.models.catalog import ModelEntry
from apps.routing.dispatcher import Dispatch, NodeSnapshot
from dmxplatform.errors import GatewayTimeoutError


def new_request_id() -> str:
    return "req_" + os.urandom(16).hex()


class CompletionState:
    """A request to a model (chat, completions, responses, messages, embeddings), from first
    byte to usage record. Each group of fields is what one stage produced; a field still at its
    default is a stage not reached."""

    def __init__(
        self,
        endpoint: Endpoint,
        scope: dict[str, Any],
        receive,
        send,
        *,
        key: KeyRecord | None = None,
    ) -> None:
        """`key`: the key a caller inside the platform acts for, its user already signed in
        (the portal's playground); otherwise the request's bearer key decides."""
        # As it came, and the API it speaks (its parsing, answers and errors).
        self.endpoint = endpoint
        self.dialect = dialect_for(endpoint)
        self.scope = scope
        self.receive = receive
        self.request_id = new_request_id()
        self.received_at = time.time()
        self.trace = tracing.start(endpoint, self.request_id)
        self.clock = self.trace.new_clock()
        self.reply = ClientReply(
            send, [(b"x-request-id", self.request_id.encode())], self.dialect.error_body
        )
        self.client_request_id = ""
        # auth: the key, and a signing key's nonce.
        self.key = key
        self.nonce: str | None = None
        # parse, intent.
        self.request: CompletionRequest | None = None
        self.intent = ""
        # The classifier's calibrated probability for it, and whether that was under
        # DMX_INTENT_MIN_CONFIDENCE (the alias then routed by its default route).
        self.intent_confidence: float | None = None
        self.intent_low_confidence = False
        # The model it goes to, its hardware preference, and the context it may use now.
        self.model: ModelEntry | None = None
        self.preferred: frozenset[str] = frozenset()
        self.context_limit: int | None = None
        # screen, context: the prompt's content flags and its counted tokens (None: no
        # tokenizer).
        self.flags: list[str] = []
        self.estimated_tokens: int | None = None
        self.prompt_count: PromptCount | None = None
        # Chained hashes of the prompt's 512-token groups (or text blocks), for routing.
        self.prefix_blocks: tuple[int, ...] = ()
        # limits: what was reserved against the key's limits.
        self.reserved = 0
        self.admission: Admission | None = None
        # route, connect: the way to a node (routing's).
        self.dispatch: Dispatch | None = None
        # The answer: the stream's editor and writer (the client's events), an unstreamed
        # answer's usage, the first token.
        self.editor: StreamEditor | None = None
        self.writer: StreamWriter | None = None
        self.usage: dict[str, Any] | None = None
        self.first_token_at: float | None = None
        # How it ended.
        self.outcome = UsageStatus.OK
        self.http_status = 200
        self.error_code = ""
        # settle: the settle call, once made.
        self.settlement: Settlement | None = None

    @property
    def node(self) -> NodeSnapshot | None:
        return self.dispatch.node if self.dispatch else None

    @property
    def started(self) -> float:
        """When the request's first byte came (perf_counter), its stages' zero."""
        return self.clock.started

    def time_left(self) -> float:
        return self.started + settings.DMX_REQUEST_TIMEOUT_SECONDS - time.perf_counter()

    def timed_out(self) -> GatewayTimeoutError:
        """The error of a request that ran out of time (the pipeline's `fail` records it)."""
        return GatewayTimeoutError(
            f"The request ran longer than {settings.DMX_REQUEST_TIMEOUT_SECONDS:g} seconds."
        )
