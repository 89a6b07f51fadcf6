from django.db import models

from apps.gateway.content_filter import FilterAction


class SensitiveTermAction(models.TextChoices):
    """What the content filter does with a term; the values are content_filter.FilterAction's."""

    BLOCK = FilterAction.BLOCK.value, "Block (refuse the request, end the completion)"
    MASK = FilterAction.MASK.value, "Mask (replace its characters with *)"
    FLAG = FilterAction.FLAG.value, "Flag (let it through, report it)"


class ResponseStatus(models.TextChoices):
    """A response's status, as OpenAI's Responses API names them."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"
