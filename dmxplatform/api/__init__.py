"""What every management API view (/api/v1/) shares, whichever app owns it: its callers, its
pagination, its schema, its audit actor, its input checks; and the operators' permission.

Who a caller is comes from the identity app, named in settings (DMX_MANAGEMENT_API: the
authentication classes, the tenant member's and owner's permissions, and the tenant a call acts
in), the way Django names its authentication backends: no app imports another to build its API.
A credential that may not write says so with `can_write = False`; one that names an actor for
the audit log gives `audit_identity`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from functools import cache

from django.conf import settings
from django.contrib.auth import get_permission_codename
from django.db.models import Model
from django.http import Http404
from django.utils.module_loading import import_string
from drf_spectacular.utils import extend_schema
from rest_framework import permissions
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.views import APIView

from dmxplatform.api.schema import ManagementAutoSchema
from dmxplatform.audit.entries import acting


@cache
def _configured(name: str) -> tuple[type, ...]:
    return tuple(import_string(path) for path in settings.DMX_MANAGEMENT_API[name])


@cache
def _tenant_of() -> Callable[[Request], int]:
    return import_string(settings.DMX_MANAGEMENT_API["TENANT_OF"])


def can_write(request: Request) -> bool:
    """Whether the caller's credential may change things (a session may; a token says)."""
    return getattr(request.auth, "can_write", True)


def operated_model(view) -> type[Model]:
    """The model an operator view changes: its `operated_model`, else its queryset's."""
    return getattr(view, "operated_model", None) or view.get_queryset().model


class Operator(permissions.BasePermission):
    """Staff only (anyone else finds nothing here); changing anything also needs the change
    permission on the view's model, as the admin's actions do (OperatorActions): the `viewer`
    group looks and changes nothing, the `operator` group and superusers change."""

    operators_only = True  # for the schema's 404 description

    def has_permission(self, request: Request, view) -> bool:
        if request.user is None or not request.user.is_authenticated:
            return False
        if not request.user.is_staff:
            raise Http404
        if request.method in permissions.SAFE_METHODS:
            return True
        if not can_write(request):
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
    """What every management view shares: its callers (a tenant's members unless the view says
    otherwise), its pagination, its schema and its audit actor.

    A view's rows come from its get_queryset (through a selector); a
    `queryset = Model.objects.none()` beside it only names the model for the schema.
    """

    pagination_class = NewestFirst
    schema = ManagementAutoSchema()

    def get_authenticators(self):
        return [authentication() for authentication in _configured("AUTHENTICATION_CLASSES")]

    def get_permissions(self):
        if self.permission_classes:
            return super().get_permissions()
        return [permission() for permission in _configured("MEMBER_PERMISSION_CLASSES")]

    def dispatch(self, request, *args, **kwargs):
        # What initial() names for the audit log holds for the rest of the call, no longer.
        with ExitStack() as self._audit_context:
            return super().dispatch(request, *args, **kwargs)

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        identity = getattr(request.auth, "audit_identity", None)
        if identity is not None:
            # The audit log's middleware ran before DRF authenticated the token and saw nobody:
            # name the token's user as the actor of what this call changes, and the token.
            self._audit_context.enter_context(acting(actor=request.user, additional_data=identity))

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


class TenantScopedApiMixin(ManagementApiMixin):
    """A tenant's own views in an app below the identity app (billing), which cannot use its
    TenantApiMixin: members read; in an `owners_change` view only owners change. The tenant is
    the one the member permission found the caller in."""

    owners_change = False

    def get_permissions(self):
        if self.owners_change and not self.permission_classes:
            return [permission() for permission in _configured("OWNER_PERMISSION_CLASSES")]
        return super().get_permissions()

    @property
    def tenant_id(self) -> int:
        return _tenant_of()(self.request)


class OperatorApiMixin(ManagementApiMixin):
    """Views of the whole platform, for operators (staff): not scoped to a tenant."""

    permission_classes = [Operator]


@extend_schema(exclude=True)
class UnknownPath(APIView):
    """A 404 in the platform's error shape for any method, rather than Django's HTML page."""

    def initial(self, request: Request, *args, **kwargs) -> None:
        raise NotFound(f"Invalid URL ({request.method} {request.path}).")
