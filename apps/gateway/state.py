"""One completion request's state, as the pipeline's stages fill it in (apps.gateway.pipeline)."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, TypeVar

from django.conf import settings

from apps.billing.money import Rates
from apps.billing.pricing import PriceBook
from apps.gateway import tracing
from apps.gateway.context import PromptCount
from apps.gateway.dialects import dialect_for
from apps.gateway.dialects.base import StreamWriter
from apps.gateway.errors import GatewayErrorCode
from apps.gateway.outputs import StreamEditor
from apps.gateway.reply import ClientLeft, ClientReply, Reply
from apps.gateway.response_records import ResponseRecord
from apps.gateway.schemas import CompletionRequest, Endpoint
from apps.gateway.upstream_http import UpstreamTimeout
from apps.keys.gate import KeyRecord, Lease, UsageStatus
from apps.models.catalog import ModelEntry
from apps.routing.dispatcher import Dispatch, NodeFailed, NodeSnapshot
from dmxplatform.errors import (
    ApplicationError,
    GatewayTimeoutError,
    ServiceUnavailableError,
    UpstreamError,
    UpstreamUnavailableError,
)
from dmxplatform.resp import RedisUnavailable

logger = logging.getLogger(__name__)


def new_request_id() -> str:
    return "req_" + os.urandom(16).hex()


def request_id_headers(endpoint: Endpoint | None, request_id: str) -> list[tuple[bytes, bytes]]:
    """The answer's request id, in every API's header: Anthropic's SDKs read `request-id` (a
    message's `_request_id`), OpenAI's `x-request-id`."""
    headers = [(b"x-request-id", request_id.encode())]
    if endpoint is Endpoint.MESSAGES:
        headers.append((b"request-id", request_id.encode()))
    return headers


T = TypeVar("T")


def reached(value: T | None, stage: str) -> T:
    """A stage's output, read by a later stage. The pipeline runs the stages in order, so a
    None here is the platform's bug (answered as a 500 and logged), never the client's."""
    if value is None:
        raise RuntimeError(f"read before the {stage} stage produced it")
    return value


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
        batch_id: str = "",
        request_id: str = "",
    ) -> None:
        """`key`: the key a caller inside the platform acts for, its user already signed in
        (the portal's playground) or its batch running (apps.batches); otherwise the request's
        bearer key decides. `batch_id`: the batch the request is a line of, and `request_id`
        the id its batch gave it (a try that goes again keeps its id)."""
        # As it came, and the API it speaks (its parsing, answers and errors).
        self.endpoint = endpoint
        self.dialect = dialect_for(endpoint)
        self.scope = scope
        self.receive = receive
        self.request_id = request_id or new_request_id()
        self.received_at = time.time()
        self.trace = tracing.start(endpoint, self.request_id)
        self.clock = self.trace.new_clock()
        self.reply: Reply = ClientReply(
            send, request_id_headers(endpoint, self.request_id), self.dialect.error_body
        )
        self.client_request_id = ""
        self.batch_id = batch_id
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
        # The priority tier it runs at: its key's, lowered by its route's (Resolution.priority).
        self.priority: int | None = None
        # screen, context: the prompt's content flags and its counted tokens (None: no
        # tokenizer).
        self.flags: list[str] = []
        self.estimated_tokens: int | None = None
        self.prompt_count: PromptCount | None = None
        # Admission: the price book it found and the prices it reserved at (apps.gateway.charges).
        self.prices: PriceBook | None = None
        self.rates: Rates | None = None
        # limits: the key's hold on them, settled once when the request ends.
        self.lease: Lease | None = None
        # route, connect: the way to a node (routing's).
        self.dispatch: Dispatch | None = None
        # The answer: the stream's editor and writer (the client's events), an unstreamed
        # answer's usage, the first token.
        self.editor: StreamEditor | None = None
        self.writer: StreamWriter | None = None
        self.usage: dict[str, Any] | None = None
        self.first_token_at: float | None = None
        # A stored response's record (apps.gateway.stored), once its answer is whole, and its
        # encoding (made once: the settle call and the Redis copy both carry it).
        self.kept: ResponseRecord | None = None
        self.kept_payload: bytes | None = None
        # A background response answered `queued` and running on (apps.gateway.background).
        self.detached = False
        # How it ended (end()): the outcome an answer decides (a filtered or refused stream)
        # is set as it happens; an error that ended it is answered to the client.
        self.outcome = UsageStatus.OK
        self.http_status = 200
        self.error_code = ""
        self.error: ApplicationError | None = None
        self._ended = False
        self._ended_by: BaseException | None = None

    @property
    def node(self) -> NodeSnapshot | None:
        return self.dispatch.node if self.dispatch else None

    @property
    def stores(self) -> bool:
        """The answer is a response to keep (/v1/responses with `store`, its default)."""
        return bool(self.request and self.request.response_settings.get("store"))

    @property
    def background(self) -> bool:
        """A background response: answered `queued`, run on without its client."""
        return bool(self.request and self.request.response_settings.get("background"))

    @property
    def started(self) -> float:
        """When the request's first byte came (perf_counter), its stages' zero."""
        return self.clock.started

    def time_left(self) -> float:
        return self.started + settings.DMX_REQUEST_TIMEOUT_SECONDS - time.perf_counter()

    def timed_out(self) -> GatewayTimeoutError:
        """The error of a request that ran out of time."""
        return GatewayTimeoutError(
            f"The request ran longer than {settings.DMX_REQUEST_TIMEOUT_SECONDS:g} seconds."
        )

    def end(self, ended_by: BaseException | None) -> ApplicationError | None:
        """Decide how the request ended from what ended it (None: its answer went out whole):
        the outcome, status and error code its usage record, trace and metrics carry. Returns
        the error to answer its client with, if any. The first call decides (the key's lease
        settling, before the client is answered); later ones return the same."""
        if self._ended:
            if ended_by not in (None, self._ended_by) and not isinstance(ended_by, ClientLeft):
                # Raised after the request's end was decided and settled (its answer's last
                # bytes on their way): nothing to answer, but not to be lost either.
                logger.warning("request %s: %r after it ended", self.request_id, ended_by)
            return self.error
        self._ended, self._ended_by = True, ended_by
        if isinstance(ended_by, ClientLeft):
            self.outcome = UsageStatus.CLIENT_DISCONNECTED
            self.http_status = 499  # nginx's "client closed request"
            return None
        if ended_by is not None and not isinstance(ended_by, Exception):
            self.outcome = UsageStatus.INTERRUPTED  # cancelled: the server stopped
            self.http_status = 503
            return None
        error = self.error = None if ended_by is None else _error_of(self, ended_by)
        if error is not None:
            self.http_status = error.status
            self.error_code = str(error.code)
            if self.outcome is UsageStatus.OK:
                self.outcome = _outcome_of(error)
        return error


def _error_of(state: CompletionState, exc: Exception) -> ApplicationError:
    """The error a client is answered with for the exception that ended its request."""
    if isinstance(exc, ApplicationError):
        return exc
    if isinstance(exc, NodeFailed):  # mid-answer: routing counted it, the client keeps its part
        return exc.error
    if isinstance(exc, UpstreamTimeout):
        return state.timed_out()
    if isinstance(exc, RedisUnavailable):
        return ServiceUnavailableError(
            "The gateway cannot reach its state store. Please retry shortly.",
            code=GatewayErrorCode.STATE_UNAVAILABLE,
            headers={"Retry-After": str(settings.DMX_RETRY_AFTER_SECONDS)},
        )
    logger.error("request %s failed", state.request_id, exc_info=exc)
    return ApplicationError("The server had an error while processing your request.")


def _outcome_of(error: ApplicationError) -> UsageStatus:
    if isinstance(error, GatewayTimeoutError):
        return UsageStatus.TIMED_OUT
    if isinstance(error, UpstreamError | UpstreamUnavailableError):
        return UsageStatus.UPSTREAM_ERROR
    return UsageStatus.REJECTED
