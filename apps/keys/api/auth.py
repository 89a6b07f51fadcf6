"""Who calls the management API (/api/v1/) and what a tenant's members may do there: the
identity behind dmxplatform.api (settings.DMX_MANAGEMENT_API names these classes).

A caller is a user, authenticated by a management token (`Authorization: Bearer dmx-mgmt-…`,
acting in the token's tenant within its scope) or by the portal's session (with CSRF, acting in
the tenant chosen in the portal). Objects of other tenants are never found (404, never 403:
their existence is not told); within their own tenant, members read, owners change, and a
read-only token reads only. Operator endpoints are found only by staff users, and change things
only for those whose console role (the `operator` group) may change the model.
"""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import permissions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.request import Request

from apps.keys.models import KEY_PREFIX, ManagementToken, Membership
from apps.keys.selectors import SESSION_TENANT, membership_find
from apps.keys.services import management_token_authenticate
from dmxplatform.api import ManagementApiMixin, can_write
from dmxplatform.credentials import bearer


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


def request_tenant_id(request: Request) -> int:
    """The id of the tenant the caller acts in, for views behind TenantMember (which found it):
    dmxplatform.api's TENANT_OF, for the apps below this one."""
    return request_membership(request).tenant_id


class TenantMember(permissions.BasePermission):
    """Any member reads; changing anything needs a token that may write."""

    message = "This management token is read-only."

    def has_permission(self, request: Request, view) -> bool:
        if request.user is None or not request.user.is_authenticated:
            return False
        if request_membership(request) is None:
            raise Http404  # signed in, but in no tenant: there is nothing to find
        return request.method in permissions.SAFE_METHODS or can_write(request)


class TenantOwner(TenantMember):
    """Members read; only owners change keys, members and limits."""

    owners_only = True  # for the schema's 403 description

    def has_permission(self, request: Request, view) -> bool:
        if not super().has_permission(request, view):
            return False
        if (
            request.method not in permissions.SAFE_METHODS
            and not request_membership(request).is_owner
        ):
            raise PermissionDenied("Only the tenant's owners may do this.")
        return True


class TenantApiMixin(ManagementApiMixin):
    """A tenant's own views: its members read, `TenantOwner` views let owners change."""

    @property
    def membership(self) -> Membership:
        return request_membership(self.request)

    @property
    def tenant(self):
        return self.membership.tenant


class ManagementTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.keys.api.auth.ManagementTokenAuthentication"
    name = "managementToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A management token from the portal (Tokens): "
            "`Authorization: Bearer dmx-mgmt-...`. API keys (`sk-dmx-...`) are refused.",
        }
