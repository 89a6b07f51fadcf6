from django.db import models


class FilePurpose(models.TextChoices):
    BATCH = "batch", "Batch input"
    BATCH_OUTPUT = "batch_output", "Batch output"


class BatchStatus(models.TextChoices):
    """OpenAI's batch statuses, in the order a batch goes through them."""

    VALIDATING = "validating", "Validating"
    FAILED = "failed", "Failed"
    IN_PROGRESS = "in_progress", "In progress"
    FINALIZING = "finalizing", "Finalizing"
    COMPLETED = "completed", "Completed"
    EXPIRED = "expired", "Expired"
    CANCELLING = "cancelling", "Cancelling"
    CANCELLED = "cancelled", "Cancelled"


# A batch in one of these is over: nothing runs or changes any more.
ENDED = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


class LineState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    DONE = "done", "Answered"  # a 2xx: the output file
    FAILED = "failed", "Failed"  # an error of the line's own: the error file
    SKIPPED = "skipped", "Not run"  # cancelled or expired before it ran: the error file


class BatchEndpoint(models.TextChoices):
    """What a batch's lines may call (OpenAI's list)."""

    CHAT = "/v1/chat/completions", "Chat completions"
    COMPLETIONS = "/v1/completions", "Completions"
    RESPONSES = "/v1/responses", "Responses"
    EMBEDDINGS = "/v1/embeddings", "Embeddings"
