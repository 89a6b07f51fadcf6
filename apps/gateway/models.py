"""The sensitive terms the gateway's content filter blocks, masks or flags."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Lower

from apps.gateway.choices import ResponseStatus, SensitiveTermAction
from apps.gateway.content_filter import DEFAULT_CATEGORY, normalise

# A word or a short phrase. A streamed completion is held back while its tail could still be
# the beginning of a term, so a long "term" would delay every completion that starts like it.
TERM_MAX_LENGTH = 100


def validate_term(value: str) -> None:
    """Refuse a term with nothing to match: separators and symbols are ignored when matching."""
    if not normalise(value):
        raise ValidationError(
            "A term needs at least one letter, digit or ideograph; spaces, punctuation and "
            "symbols are ignored when matching.",
            code="empty_term",
        )


class SensitiveTerm(models.Model):
    """A word or phrase the content filter looks for in prompts and completions."""

    term = models.CharField(
        max_length=TERM_MAX_LENGTH,
        validators=[validate_term],
        help_text=(
            "Matched ignoring case, full-width forms, accents, spaces, punctuation and symbols; "
            "a term of Latin letters and digits only matches whole words."
        ),
    )
    category = models.CharField(
        max_length=64, default=DEFAULT_CATEGORY, help_text="A label for reports: abuse, pii, …"
    )
    action = models.CharField(
        max_length=8, choices=SensitiveTermAction.choices, default=SensitiveTermAction.BLOCK
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["category", "term"]
        constraints = [
            models.UniqueConstraint(
                Lower("term"),
                name="sensitive_term_unique_term",
                violation_error_message="This term exists already (terms ignore case).",
            ),
            models.CheckConstraint(
                condition=models.Q(action__in=SensitiveTermAction.values),
                name="sensitive_term_action_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.term


class StoredResponse(models.Model):
    """A response of /v1/responses kept for retrieval and for the next turn
    (`previous_response_id`): the object as the client got it and every input item before it.

    Written from a durable stream (apps.gateway.stored) a second or two after the answer; the
    gateway reads its Redis copy until then. Deleted when its tenant is, and after
    DMX_RESPONSES_RETENTION_DAYS; emptied when the tenant deletes it (`deleted_at`)."""

    id = models.CharField(primary_key=True, max_length=64)
    tenant = models.ForeignKey("keys.Tenant", on_delete=models.CASCADE, related_name="+")
    # The key that made it, kept after the key is deleted (any key of the tenant may read it).
    api_key_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    status = models.CharField(max_length=16, choices=ResponseStatus.choices)
    model = models.CharField(max_length=128)
    background = models.BooleanField(default=False)
    previous_response_id = models.CharField(max_length=64, blank=True)
    response = models.JSONField()
    input_items = models.JSONField(default=list)
    # The stored JSON's size: what a tenant's stored responses take, in its usage views.
    size_bytes = models.PositiveIntegerField(default=0)
    # Deleted by its tenant: the row stays, emptied, until it expires, so that the record's
    # entry, should it still wait in the stream, finds the id taken and is not inserted.
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="stored_response_tenant")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=ResponseStatus.values),
                name="stored_response_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.id
