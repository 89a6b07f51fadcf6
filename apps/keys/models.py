"""Tenants, API keys and the usage ledger."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.keys.choices import UsageStatus

KEY_PREFIX = "sk-dmx-"


class Tenant(models.Model):
    """An organisation that owns keys and is billed for their usage."""

    name = models.CharField(max_length=128)
    slug = models.SlugField(max_length=64, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="tenants", blank=True)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiKey(models.Model):
    """A developer's key. Only an HMAC of the secret is stored; the secret is shown once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="api_keys")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    name = models.CharField(max_length=128)
    key_id = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    allowed_models = models.JSONField(
        default=list, blank=True, help_text="Model names this key may use; empty means all."
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.display_prefix})"

    @property
    def display_prefix(self) -> str:
        """The part of the key that may be shown: enough to recognise it, useless to use it."""
        return f"{KEY_PREFIX}{self.key_id}_…"


class UsageRecord(models.Model):
    """One finished request: what it used and how it went. Written in batches from Redis."""

    request_id = models.CharField(max_length=64, unique=True)
    api_key = models.ForeignKey(ApiKey, on_delete=models.PROTECT, related_name="usage_records")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_records")
    created_at = models.DateTimeField(help_text="When the gateway received the request.")
    endpoint = models.CharField(max_length=32)
    model = models.CharField(max_length=128)
    model_version = models.CharField(max_length=64, blank=True)
    node = models.CharField(max_length=128, blank=True)
    stream = models.BooleanField(default=False)
    status = models.CharField(max_length=32, choices=UsageStatus.choices)
    http_status = models.PositiveSmallIntegerField()
    error_code = models.CharField(max_length=64, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    duration_ms = models.FloatField(default=0.0)
    time_to_first_token_ms = models.FloatField(null=True, blank=True)
    timings = models.JSONField(default=dict, blank=True, help_text="Gateway stage timings, ms.")

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Per-key usage pages and retention both scan by key and time.
            models.Index(fields=["api_key", "created_at"], name="usage_key_time_idx"),
            models.Index(fields=["created_at"], name="usage_time_idx"),
        ]

    def __str__(self) -> str:
        return self.request_id

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
