"""The management API's keys, quotas, members, invitations, tokens, tenants and plans."""

from django.urls import path, register_converter

from apps.keys.api import views
from dmxplatform.credentials import ID_ALPHABET, ID_LENGTH


class CredentialId:
    """A key's or token's public id; anything else is not looked up (an unknown URL, 404)."""

    regex = f"[{ID_ALPHABET}]{{{ID_LENGTH}}}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(CredentialId, "credential_id")

urlpatterns = [
    path("keys", views.KeyList.as_view(), name="key-list"),
    path("keys/<credential_id:key_id>", views.KeyDetail.as_view(), name="key-detail"),
    path("keys/<credential_id:key_id>/rotate", views.KeyRotate.as_view(), name="key-rotate"),
    path("keys/<credential_id:key_id>/revoke", views.KeyRevoke.as_view(), name="key-revoke"),
    path("quotas", views.QuotaList.as_view(), name="quota-list"),
    path("members", views.MemberList.as_view(), name="member-list"),
    path("members/<int:pk>", views.MemberDetail.as_view(), name="member-detail"),
    path("invitations", views.InvitationList.as_view(), name="invitation-list"),
    path("invitations/<int:pk>", views.InvitationDetail.as_view(), name="invitation-detail"),
    path("tokens", views.TokenList.as_view(), name="token-list"),
    path("tokens/<credential_id:token_id>", views.TokenDetail.as_view(), name="token-detail"),
    path(
        "tokens/<credential_id:token_id>/revoke",
        views.TokenRevoke.as_view(),
        name="token-revoke",
    ),
    path("tenants", views.TenantList.as_view(), name="tenant-list"),
    path("tenants/<int:pk>", views.TenantDetail.as_view(), name="tenant-detail"),
    path("tenants/<int:pk>/approve", views.TenantApprove.as_view(), name="tenant-approve"),
    path("plans", views.PlanList.as_view(), name="plan-list"),
    path("plans/<int:pk>", views.PlanDetail.as_view(), name="plan-detail"),
]
