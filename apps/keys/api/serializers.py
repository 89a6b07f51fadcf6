"""What the management API reads and writes for keys, quotas, members, tokens and (for
operators) tenants and plans. Inputs are checked here; services do the writes."""

from __future__ import annotations

from rest_framework import serializers

from apps.keys.choices import MemberRole, QuotaPeriod, TokenScope
from apps.keys.models import (
    ApiKey,
    Invitation,
    ManagementToken,
    Membership,
    Plan,
    PlanQuota,
    Tenant,
)
from apps.keys.services import LIMIT_NAMES, MAX_ROTATION_GRACE

QUOTA_SCOPES = [("tenant", "The tenant's plan"), ("key", "One key's own quota")]
# Enough for any real allowlist; a key's record is read on every request.
MAX_LIST_ITEMS = 100
# The longest CIDR text: a full IPv6 address and its prefix length.
MAX_NETWORK_LENGTH = 43


def _names(**options) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=128),
        max_length=MAX_LIST_ITEMS,
        required=False,
        help_text="Model names this key may use; empty means all.",
        **options,
    )


def _networks(**options) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=MAX_NETWORK_LENGTH),
        max_length=MAX_LIST_ITEMS,
        required=False,
        help_text='Client networks in CIDR form, e.g. ["10.0.0.0/8"]; empty means any.',
        **options,
    )


# Keys ------------------------------------------------------------------------------------------


class ApiKeyOutput(serializers.ModelSerializer):
    prefix = serializers.CharField(
        source="display_prefix", help_text="Enough of the key to recognise it; not usable."
    )
    created_by = serializers.EmailField(source="created_by.email", allow_null=True)
    last_used_at = serializers.DateTimeField(allow_null=True)
    month_tokens = serializers.IntegerField(help_text="Tokens used this calendar month (UTC).")
    allowed_models = _names(read_only=True)
    allowed_networks = _networks(read_only=True)
    grace_ends_at = serializers.DateTimeField(
        source="previous_secret_expires_at",
        allow_null=True,
        help_text="After a rotation, when the old secret stops working.",
    )

    class Meta:
        model = ApiKey
        fields = [
            "key_id",
            "name",
            "prefix",
            "created_at",
            "created_by",
            "last_used_at",
            "month_tokens",
            "expires_at",
            "revoked_at",
            "grace_ends_at",
            "allowed_models",
            "allowed_networks",
            "priority",
            *LIMIT_NAMES,
            "token_quota",
            "token_quota_period",
        ]
        read_only_fields = fields


class ApiKeyWithSecret(ApiKeyOutput):
    secret = serializers.CharField(help_text="The key itself: shown this once, never again.")

    class Meta(ApiKeyOutput.Meta):
        fields = [*ApiKeyOutput.Meta.fields, "secret"]
        read_only_fields = fields


class ApiKeyInput(serializers.ModelSerializer):
    """A key's settings; its limits must be within the tenant's plan."""

    allowed_models = _names()
    allowed_networks = _networks()

    class Meta:
        model = ApiKey
        fields = [
            "name",
            "expires_at",
            "allowed_models",
            "allowed_networks",
            *LIMIT_NAMES,
            "token_quota",
            "token_quota_period",
        ]


class ApiKeyRotateInput(serializers.Serializer):
    grace_seconds = serializers.IntegerField(
        min_value=0,
        max_value=int(MAX_ROTATION_GRACE.total_seconds()),
        help_text="How long the old secret keeps working, 0 to 86400 seconds.",
    )


# Quotas -------------------------------------------------------------------------------------------


class QuotaStatusOutput(serializers.Serializer):
    scope = serializers.ChoiceField(choices=QUOTA_SCOPES)
    key_id = serializers.CharField(help_text="The key, for a key's quota; empty otherwise.")
    period = serializers.ChoiceField(choices=QuotaPeriod.choices)
    model = serializers.CharField(help_text="Empty: all models together.")
    limit = serializers.IntegerField()
    used = serializers.IntegerField(help_text="This period, in-flight reservations included.")
    remaining = serializers.IntegerField()
    resets_at = serializers.DateTimeField()


# Members, invitations, management tokens -------------------------------------------------------


class MemberOutput(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email")

    class Meta:
        model = Membership
        fields = ["id", "email", "role", "created_at"]
        read_only_fields = fields


class MemberRoleInput(serializers.Serializer):
    role = serializers.ChoiceField(choices=MemberRole.choices)


class InvitationOutput(serializers.ModelSerializer):
    invited_by = serializers.EmailField(source="invited_by.email", allow_null=True)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "invited_by", "created_at", "expires_at"]
        read_only_fields = fields


class InvitationInput(serializers.Serializer):
    email = serializers.EmailField(max_length=254)
    role = serializers.ChoiceField(choices=MemberRole.choices, default=MemberRole.MEMBER)


class TokenOutput(serializers.ModelSerializer):
    prefix = serializers.CharField(source="display_prefix")

    class Meta:
        model = ManagementToken
        fields = [
            "token_id",
            "name",
            "prefix",
            "scope",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        ]
        read_only_fields = fields


class TokenWithSecret(TokenOutput):
    secret = serializers.CharField(help_text="The token itself: shown this once, never again.")

    class Meta(TokenOutput.Meta):
        fields = [*TokenOutput.Meta.fields, "secret"]
        read_only_fields = fields


class TokenInput(serializers.Serializer):
    name = serializers.CharField(max_length=128)
    scope = serializers.ChoiceField(choices=TokenScope.choices)
    expires_at = serializers.DateTimeField(help_text="Within the next year.")


# Operators: tenants and plans ------------------------------------------------------------------


class TenantOutput(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "plan", "is_active", "approved_at", "created_at"]
        read_only_fields = fields


class TenantInput(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["plan", "is_active"]


class PlanQuotaSerializer(serializers.ModelSerializer):
    class Meta:
        model = PlanQuota
        fields = ["period", "model", "tokens"]


class PlanSerializer(serializers.ModelSerializer):
    """A plan with its token quotas; given quotas replace the plan's."""

    quotas = PlanQuotaSerializer(many=True, required=False, max_length=MAX_LIST_ITEMS)

    class Meta:
        model = Plan
        fields = ["id", "name", "description", *LIMIT_NAMES, "price_multiplier", "quotas"]
        read_only_fields = ["id"]
        # Uniqueness is the service's to check (full_clean), with the rest of the plan.
        extra_kwargs = {"name": {"validators": []}}
