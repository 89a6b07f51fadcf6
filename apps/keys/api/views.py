"""The management API's keys, quotas, members, invitations and tokens (a tenant's own), and
tenants and plans (operators'). Each view checks its input, calls one service or selector and
serializes; who may call is apps.keys.api.auth's."""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.keys.api.auth import TenantApiMixin, TenantOwner
from apps.keys.api.filters import ApiKeyFilter, TenantFilter
from apps.keys.api.serializers import (
    ApiKeyInput,
    ApiKeyOutput,
    ApiKeyRotateInput,
    ApiKeyWithSecret,
    InvitationInput,
    InvitationOutput,
    MemberOutput,
    MemberRoleInput,
    PlanSerializer,
    QuotaStatusOutput,
    TenantInput,
    TenantOutput,
    TokenInput,
    TokenOutput,
    TokenWithSecret,
)
from apps.keys.models import ApiKey, Invitation, ManagementToken, Membership, Plan, Tenant
from apps.keys.selectors import (
    api_keys_of,
    management_tokens_of,
    quota_status,
    tenant_invitations_open,
    tenant_members,
)
from apps.keys.services import (
    api_key_create,
    api_key_revoke,
    api_key_rotate,
    api_key_update,
    invitation_withdraw,
    management_token_create,
    management_token_revoke,
    member_invite,
    member_remove,
    member_role_change,
    plan_delete,
    plan_save,
    tenant_approve,
    tenant_update,
)
from dmxplatform.api import ByName, OperatorApiMixin
from dmxplatform.api.schema import ERROR

# Keys ------------------------------------------------------------------------------------------


class KeyMixin(TenantApiMixin):
    queryset = ApiKey.objects.none()
    permission_classes = [TenantOwner]
    lookup_field = "key_id"

    def get_queryset(self):
        return api_keys_of(tenant=self.tenant)

    def shown_once(self, key: ApiKey, secret: str, status: int) -> Response:
        """The key as listed, with its secret: the only time the secret leaves the platform."""
        shown = self.get_queryset().get(pk=key.pk)
        shown.secret = secret
        return Response(ApiKeyWithSecret(shown).data, status=status)


@extend_schema_view(
    get=extend_schema(summary="List the tenant's keys", tags=["keys"]),
    post=extend_schema(
        summary="Create a key",
        description="Owners only. The response carries the key's secret, this once.",
        tags=["keys"],
        request=ApiKeyInput,
        responses={201: ApiKeyWithSecret},
    ),
)
class KeyList(KeyMixin, generics.ListAPIView):
    serializer_class = ApiKeyOutput
    filterset_class = ApiKeyFilter

    def post(self, request: Request) -> Response:
        fields = self.validated(ApiKeyInput)
        key, secret = api_key_create(tenant=self.tenant, created_by=request.user, **fields)
        return self.shown_once(key, secret, 201)


@extend_schema_view(
    get=extend_schema(summary="Show a key", tags=["keys"]),
    patch=extend_schema(
        summary="Change a key's name, expiry, allowed models and networks or limits",
        description="Owners only; limits must be within the tenant's plan.",
        tags=["keys"],
        request=ApiKeyInput,
        responses=ApiKeyOutput,
    ),
)
class KeyDetail(KeyMixin, generics.RetrieveAPIView):
    serializer_class = ApiKeyOutput

    def patch(self, request: Request, key_id: str) -> Response:
        api_key_update(key=self.edited(self.get_object(), ApiKeyInput))
        return Response(ApiKeyOutput(self.get_object()).data)


class KeyRotate(KeyMixin, generics.GenericAPIView):
    serializer_class = ApiKeyRotateInput

    @extend_schema(
        summary="Give a key a new secret",
        description="Owners only. The old secret keeps working for `grace_seconds` (0 to 24 h); "
        "the response carries the new secret, this once.",
        tags=["keys"],
        request=ApiKeyRotateInput,
        responses=ApiKeyWithSecret,
    )
    def post(self, request: Request, key_id: str) -> Response:
        key = self.get_object()
        grace = timedelta(seconds=self.validated(ApiKeyRotateInput)["grace_seconds"])
        key, secret = api_key_rotate(key=key, grace=grace)
        return self.shown_once(key, secret, 200)


class KeyRevoke(KeyMixin, generics.GenericAPIView):
    serializer_class = ApiKeyOutput

    @extend_schema(
        summary="Revoke a key",
        description="Owners only. Every gateway refuses the key within a second.",
        tags=["keys"],
        request=None,
        responses=ApiKeyOutput,
    )
    def post(self, request: Request, key_id: str) -> Response:
        api_key_revoke(key=self.get_object())
        return Response(ApiKeyOutput(self.get_object()).data)


# Quotas ----------------------------------------------------------------------------------------


class QuotaList(TenantApiMixin, APIView):
    pagination_class = None  # a handful per tenant: its plan's and its keys' own

    @extend_schema(
        summary="List the tenant's token quotas and what remains of them this period",
        tags=["quotas"],
        responses=QuotaStatusOutput(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(QuotaStatusOutput(quota_status(tenant=self.tenant), many=True).data)


# Members and invitations -----------------------------------------------------------------------


class MemberMixin(TenantApiMixin):
    queryset = Membership.objects.none()
    permission_classes = [TenantOwner]
    serializer_class = MemberOutput

    def get_queryset(self):
        return tenant_members(tenant=self.tenant)


@extend_schema_view(get=extend_schema(summary="List the tenant's members", tags=["members"]))
class MemberList(MemberMixin, generics.ListAPIView):
    pass


@extend_schema_view(
    get=extend_schema(summary="Show a member", tags=["members"]),
    patch=extend_schema(
        summary="Change a member's role",
        description="Owners only; a tenant keeps at least one owner.",
        tags=["members"],
        request=MemberRoleInput,
        responses=MemberOutput,
    ),
    delete=extend_schema(
        summary="Remove a member",
        description="Owners only; a tenant keeps at least one owner.",
        tags=["members"],
        responses={204: None, 400: OpenApiResponse(ERROR, description="The last owner.")},
    ),
)
class MemberDetail(MemberMixin, generics.RetrieveAPIView):
    def patch(self, request: Request, pk: int) -> Response:
        membership = self.get_object()
        role = self.validated(MemberRoleInput)["role"]
        return Response(MemberOutput(member_role_change(membership=membership, role=role)).data)

    def delete(self, request: Request, pk: int) -> Response:
        member_remove(membership=self.get_object())
        return Response(status=204)


class InvitationMixin(TenantApiMixin):
    queryset = Invitation.objects.none()
    permission_classes = [TenantOwner]
    serializer_class = InvitationOutput

    def get_queryset(self):
        return tenant_invitations_open(tenant=self.tenant).select_related("invited_by")


@extend_schema_view(
    get=extend_schema(summary="List the tenant's open invitations", tags=["members"]),
    post=extend_schema(
        summary="Invite someone by email",
        description="Owners only. The mail carries the only copy of the invitation's link.",
        tags=["members"],
        request=InvitationInput,
        responses={201: InvitationOutput},
    ),
)
class InvitationList(InvitationMixin, generics.ListAPIView):
    def post(self, request: Request) -> Response:
        fields = self.validated(InvitationInput)
        invitation = member_invite(
            tenant=self.tenant,
            invited_by=request.user,
            accept_url=lambda token: request.build_absolute_uri(
                reverse("portal:invitation_accept", args=[token])
            ),
            **fields,
        )
        return Response(InvitationOutput(invitation).data, status=201)


@extend_schema_view(
    get=extend_schema(summary="Show an open invitation", tags=["members"]),
    delete=extend_schema(
        summary="Withdraw an invitation",
        description="Owners only: its link no longer lets anyone in.",
        tags=["members"],
        responses={204: None},
    ),
)
class InvitationDetail(InvitationMixin, generics.RetrieveAPIView):
    def delete(self, request: Request, pk: int) -> Response:
        invitation_withdraw(invitation=self.get_object())
        return Response(status=204)


# Management tokens (the caller's own) ----------------------------------------------------------


class TokenMixin(TenantApiMixin):
    queryset = ManagementToken.objects.none()
    serializer_class = TokenOutput
    lookup_field = "token_id"

    def get_queryset(self):
        return management_tokens_of(user=self.request.user, tenant=self.tenant)


@extend_schema_view(
    get=extend_schema(summary="List your management tokens in this tenant", tags=["tokens"]),
    post=extend_schema(
        summary="Create a management token",
        description="It acts as you in this tenant, within its scope, until it expires (within a "
        "year). The response carries its secret, this once.",
        tags=["tokens"],
        request=TokenInput,
        responses={201: TokenWithSecret},
    ),
)
class TokenList(TokenMixin, generics.ListAPIView):
    def post(self, request: Request) -> Response:
        fields = self.validated(TokenInput)
        token, secret = management_token_create(user=request.user, tenant=self.tenant, **fields)
        token.secret = secret
        return Response(TokenWithSecret(token).data, status=201)


@extend_schema_view(
    get=extend_schema(summary="Show one of your management tokens", tags=["tokens"])
)
class TokenDetail(TokenMixin, generics.RetrieveAPIView):
    pass


class TokenRevoke(TokenMixin, generics.GenericAPIView):
    @extend_schema(
        summary="Revoke one of your management tokens",
        tags=["tokens"],
        request=None,
        responses=TokenOutput,
    )
    def post(self, request: Request, token_id: str) -> Response:
        token: ManagementToken = self.get_object()
        return Response(TokenOutput(management_token_revoke(token=token)).data)


# Operators: tenants and plans ------------------------------------------------------------------


class TenantMixin(OperatorApiMixin):
    serializer_class = TenantOutput

    def get_queryset(self):
        return Tenant.objects.all()


@extend_schema_view(get=extend_schema(summary="List tenants (operators)", tags=["tenants"]))
class TenantList(TenantMixin, generics.ListAPIView):
    filterset_class = TenantFilter


@extend_schema_view(
    get=extend_schema(summary="Show a tenant (operators)", tags=["tenants"]),
    patch=extend_schema(
        summary="Change a tenant's plan or suspend it (operators)",
        description="A suspended tenant's keys are refused by every gateway within a second.",
        tags=["tenants"],
        request=TenantInput,
        responses=TenantOutput,
    ),
)
class TenantDetail(TenantMixin, generics.RetrieveAPIView):
    def patch(self, request: Request, pk: int) -> Response:
        tenant = tenant_update(tenant=self.edited(self.get_object(), TenantInput))
        return Response(TenantOutput(tenant).data)


class TenantApprove(TenantMixin, generics.GenericAPIView):
    @extend_schema(
        summary="Approve a tenant waiting for approval (operators)",
        description="Its members can create keys from then on.",
        tags=["tenants"],
        request=None,
        responses=TenantOutput,
    )
    def post(self, request: Request, pk: int) -> Response:
        return Response(TenantOutput(tenant_approve(tenant=self.get_object())).data)


class PlanMixin(OperatorApiMixin):
    serializer_class = PlanSerializer
    pagination_class = ByName

    def get_queryset(self):
        return Plan.objects.prefetch_related("quotas")


@extend_schema_view(
    get=extend_schema(summary="List plans (operators)", tags=["plans"]),
    post=extend_schema(
        summary="Create a plan with its quotas (operators)",
        tags=["plans"],
        responses={201: PlanSerializer},
    ),
)
class PlanList(PlanMixin, generics.ListAPIView):
    def post(self, request: Request) -> Response:
        fields = self.validated(PlanSerializer)
        quotas = fields.pop("quotas", [])
        plan = plan_save(plan=Plan(**fields), quotas=quotas)
        return Response(PlanSerializer(plan).data, status=201)


@extend_schema_view(
    get=extend_schema(summary="Show a plan (operators)", tags=["plans"]),
    patch=extend_schema(
        summary="Change a plan; given quotas replace its quotas (operators)",
        description="Every gateway applies the change to the plan's tenants within a second.",
        tags=["plans"],
    ),
    delete=extend_schema(
        summary="Delete a plan no tenant is on (operators)",
        tags=["plans"],
        responses={204: None, 400: OpenApiResponse(ERROR, description="Tenants are on it.")},
    ),
)
class PlanDetail(PlanMixin, generics.RetrieveAPIView):
    def patch(self, request: Request, pk: int) -> Response:
        plan = self.get_object()
        fields = self.validated(PlanSerializer, partial=True)
        quotas = fields.pop("quotas", None)
        for name, value in fields.items():
            setattr(plan, name, value)
        plan = plan_save(plan=plan, quotas=quotas)
        return Response(PlanSerializer(self.get_queryset().get(pk=plan.pk)).data)

    def delete(self, request: Request, pk: int) -> Response:
        plan_delete(plan=self.get_object())
        return Response(status=204)
