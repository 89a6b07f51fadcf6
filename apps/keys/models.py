"""Identity: tenants, their members, API keys, plans and their rate limits, management tokens."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from apps.keys.choices import MemberRole, PriorityTier, QuotaPeriod, TokenScope
from apps.keys.validators import validate_networks

KEY_PREFIX = "sk-dmx-"
# Management tokens look nothing like API keys, so that neither is ever taken for the other.
MANAGEMENT_TOKEN_PREFIX = "dmx-mgmt-"


class RateLimits(models.Model):
    """Per-minute limits and concurrency; empty means unlimited. Shared by plans and keys."""

    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Prompt plus completion tokens.",
    )
    max_concurrent_requests = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )

    class Meta:
        abstract = True


class Plan(RateLimits):
    """What a tenant may use: rate limits for the tenant as a whole, and token quotas."""

    name = models.CharField(max_length=64, unique=True)
    description = models.CharField(max_length=255, blank=True)
    price_multiplier = models.DecimalField(
        max_digits=6,
        decimal_places=4,
        default=1,
        validators=[MinValueValidator(0)],
        help_text="Applied to every price for the plan's tenants: 0.8 is a 20% discount.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class PlanQuota(models.Model):
    """A cap on tokens per calendar period (UTC), for all models or for one."""

    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="quotas")
    period = models.CharField(max_length=8, choices=QuotaPeriod.choices)
    model = models.CharField(max_length=128, blank=True, help_text="Empty: all models together.")
    tokens = models.PositiveBigIntegerField(validators=[MinValueValidator(1)])

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["plan", "period", "model"], name="plan_quota_unique_period_model"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tokens} tokens per {self.period}" + (
            f" of {self.model}" if self.model else ""
        )


class Tenant(models.Model):
    """An organisation that owns keys and is billed for their usage."""

    name = models.CharField(max_length=128)
    slug = models.SlugField(max_length=64, unique=True)
    plan = models.ForeignKey(
        Plan,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="tenants",
        help_text="Empty: no tenant-wide limits.",
    )
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="tenants", blank=True
    )
    is_active = models.BooleanField(default=True)
    approved_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Empty: waiting for an operator's approval (DMX_ACCOUNT_APPROVAL_REQUIRED); "
        "no key can be created until then.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_approved(self) -> bool:
        return self.approved_at is not None


class Membership(models.Model):
    """A user's place in a tenant."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=8, choices=MemberRole.choices, default=MemberRole.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"

    @property
    def is_owner(self) -> bool:
        return self.role == MemberRole.OWNER


class Invitation(models.Model):
    """An owner's invitation of someone, by email, into a tenant; only a hash of its token is
    kept, and it is good for one acceptance by a user with that verified address."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=8, choices=MemberRole.choices, default=MemberRole.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.email} to {self.tenant}"


class ApiKey(RateLimits):
    """A developer's key. Only an HMAC of the secret is stored; the secret is shown once.

    The key's own limits apply on top of its tenant's plan: a key can be held tighter than its
    plan, never looser, since both are checked.
    """

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
    allowed_networks = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_networks],
        help_text='Client networks in CIDR form, e.g. ["10.0.0.0/8"]; empty means any.',
    )
    priority = models.PositiveSmallIntegerField(
        choices=PriorityTier.choices, default=PriorityTier.STANDARD
    )
    signing_required = models.BooleanField(
        default=False, help_text="Requests must carry X-DMX-Timestamp and X-DMX-Signature."
    )
    signing_secret_encrypted = models.TextField(blank=True, editable=False)
    token_quota = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="This key's own cap on tokens per period, within the plan's.",
    )
    token_quota_period = models.CharField(
        max_length=8, choices=QuotaPeriod.choices, default=QuotaPeriod.MONTH
    )
    # The secret a rotation replaced, still accepted until previous_secret_expires_at, so that
    # clients can move to the new one without an outage.
    previous_secret_hash = models.CharField(max_length=64, blank=True, editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
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


class ManagementToken(models.Model):
    """A credential for the management API (/api/v1/), acting as its user in one tenant, within
    its scope. Stored like API keys (an HMAC of the secret); never accepted by /v1, and an API
    key is never accepted here."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="management_tokens"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="management_tokens")
    name = models.CharField(max_length=128)
    token_id = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    scope = models.CharField(max_length=8, choices=TokenScope.choices, default=TokenScope.READ)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.display_prefix})"

    @property
    def display_prefix(self) -> str:
        return f"{MANAGEMENT_TOKEN_PREFIX}{self.token_id}_…"

    @property
    def can_write(self) -> bool:
        return self.scope == TokenScope.WRITE

    @property
    def audit_identity(self) -> dict[str, str]:
        """What the audit log records beside the token's user for what a call changes."""
        return {"management_token": self.token_id, "name": self.name}
