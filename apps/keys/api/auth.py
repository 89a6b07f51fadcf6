"""Who calls the management API (/api/v1/) and what they may do: the facade every app's
management views build on.

A caller is a user, authenticated by a management token (`Authorization: Bearer dmx-mgmt-…`,
acting in the token's tenant within its scope) or by the portal's session (with CSRF, acting in
the tenant chosen in the portal). Objects of other tenants are never found (404, never 403:
their existence is not told); within their own tenant, members read, owners change, and a
read-only token reads only. Operator endpoints are found only by staff users, and change things
only for those whose console role (the `operator` group) may change the model.
"""

from __future__ import annotations

from contextlib import ExitStack

from django.contrib.auth import get_permission_codename
from django.db.models import Model
from django.http import Http404
from rest_framework import permissions
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    get_authorization_header,
)
from rest_framework.exceptions import (
    AuthenticationFailed,
    NotFound,
    PermissionDenied,
    ValidationError,
)
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request

from apps.keys.api.schema import ManagementAutoSchema
from apps.keys.models import KEY_PREFIX, ManagementToken, Membership
from apps.keys.selectors import membership_find
from apps.keys.services import management_token_authenticate
from dmxplatform.audit.entries import acting
from dmxplatform.credentials import bearer

# The portal keeps the tenant a user works in under this session key.
SESSION_TENANT = "dmx_tenant_id"


class ManagementTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[object, ManagementToken] | None:
        credential = bearer(get_authorization_header(request))
        if credential is None:
            return None
        if credential.startswith(KEY_PREFIX):
            raise AuthenticationFailed(
                "An API key is not a management credential: create a management token in the "
                "portal (Settings, Management tokens)."
            )
        token = management_token_authenticate(plaintext=credential)
        if token is None:
            raise AuthenticationFailed("Invalid, expired or revoked management token.")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="dmx-management"'


def request_membership(request: Request) -> Membership | None:
    """The caller's membership of the tenant it acts in (cached on the request)."""
    if not hasattr(request, "_dmx_membership"):
        token = request.auth if isinstance(request.auth, ManagementToken) else None
        user = request.user
        if token is not None:
            # A suspended tenant is no tenant to act in, as memberships_of says for sessions.
            found = Membership.objects.filter(
                tenant_id=token.tenant_id, tenant__is_active=True, user=user
            )
            membership = found.select_related("tenant__plan").first()
        elif user is not None and user.is_authenticated:
            membership = membership_find(user=user, tenant_id=request.session.get(SESSION_TENANT))
        else:
            membership = None
        request._dmx_membership = membership
    return request._dmx_membership


def _can_write(request: Request) -> bool:
    token = request.auth
    return not isinstance(token, ManagementToken) or token.can_write


class TenantMember(permissions.BasePermission):
    """Any member reads; changing anything needs a token that may write."""

    message = "This management token is read-only."

    def has_permission(self, request: Request, view) -> bool:
        if request.user is None or not request.user.is_authenticated:
            return False
        if request_membership(request) is None:
            raise Http404  # signed in, but in no tenant: there is nothing to find
        return request.method in permissions.SAFE_METHODS or _can_write(request)


class TenantOwner(TenantMember):
    """Members read; only owners change keys, members and limits."""

    def has_permission(self, request: Request, view) -> bool:
        if not super().has_permission(request, view):
            return False
        if (
            request.method not in permissions.SAFE_METHODS
            and not request_membership(request).is_owner
        ):
            raise PermissionDenied("Only the tenant's owners may do this.")
        return True


def operated_model(view) -> type[Model]:
    """The model an operator view changes: its `operated_model`, else its queryset's."""
    return getattr(view, "operated_model", None) or view.get_queryset().model


class Operator(permissions.BasePermission):
    """Staff only (anyone else finds nothing here); changing anything also needs the change
    permission on the view's model, as the admin's actions do (OperatorActions): the `viewer`
    group looks and changes nothing, the `operator` group and superusers change."""

    def has_permission(self, request: Request, view) -> bool:
        if request.user is None or not request.user.is_authenticated:
            return False
        if not request.user.is_staff:
            raise Http404
        if request.method in permissions.SAFE_METHODS:
            return True
        if not _can_write(request):
            raise PermissionDenied("This management token is read-only.")
        opts = operated_model(view)._meta
        if not request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}"):
            raise PermissionDenied(
                f"Changing {opts.verbose_name_plural} is for operators; this user may only look."
            )
        return True


class NewestFirst(CursorPagination):
    """Cursor pages (stable while rows are added, no COUNT): `?limit=` up to 500."""

    ordering = "-created_at"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500

    def decode_cursor(self, request: Request) -> Cursor | None:
        # DRF answers a cursor it cannot read with 404; it is a bad parameter, not a lost page.
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError(
                {self.cursor_query_param: "Invalid cursor: pass on `next` or `previous` as given."}
            ) from None


class ByName(NewestFirst):
    """Cursor pages of rows with a unique name and no creation time, by name."""

    ordering = "name"


class ManagementApiMixin:
    """What every management view shares: its callers, its pagination, its tenant.

    A view's rows come from its get_queryset (the caller's tenant's, through a selector); a
    `queryset = Model.objects.none()` beside it only names the model for the schema.
    """

    authentication_classes = [ManagementTokenAuthentication, SessionAuthentication]
    permission_classes = [TenantMember]
    pagination_class = NewestFirst
    schema = ManagementAutoSchema()

    def dispatch(self, request, *args, **kwargs):
        # What initial() names for the audit log holds for the rest of the call, no longer.
        with ExitStack() as self._audit_context:
            return super().dispatch(request, *args, **kwargs)

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        token = request.auth
        if isinstance(token, ManagementToken):
            # The audit log's middleware ran before DRF authenticated the token and saw nobody:
            # name the token's user as the actor of what this call changes, and the token.
            self._audit_context.enter_context(
                acting(
                    actor=request.user,
                    additional_data={"management_token": token.token_id, "name": token.name},
                )
            )

    @property
    def membership(self) -> Membership:
        return request_membership(self.request)

    @property
    def tenant(self):
        return self.membership.tenant

    def validated(self, serializer_class, *, partial: bool = False) -> dict:
        """The request body, checked by an input serializer (400 naming the field if not)."""
        serializer = serializer_class(data=self.request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def edited(self, instance, serializer_class):
        """`instance` with what a PATCH body sets, checked by `serializer_class`; unsaved."""
        for name, value in self.validated(serializer_class, partial=True).items():
            setattr(instance, name, value)
        return instance


class OperatorApiMixin(ManagementApiMixin):
    """Views of the whole platform, for operators (staff): not scoped to a tenant."""

    permission_classes = [Operator]
