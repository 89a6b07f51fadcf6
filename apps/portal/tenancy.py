"""The tenant a portal request acts in, and who may do what there.

The tenant is the one the user picked with the switcher (kept in the session under the key the
management API reads too, so both act in the same tenant), else their first. Another tenant's
objects are never found (404); within the tenant, members read and only owners change (403).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.keys.models import Membership
from apps.keys.selectors import SESSION_TENANT, membership_find

View = Callable[..., HttpResponse]


def current_membership(request: HttpRequest) -> Membership | None:
    """The signed-in user's membership of the tenant they act in (cached on the request)."""
    if not hasattr(request, "_portal_membership"):
        request._portal_membership = membership_find(
            user=request.user, tenant_id=request.session.get(SESSION_TENANT)
        )
    return request._portal_membership


def member_required(view: View) -> View:
    """Sign-in and a tenant; the view finds its membership in `request.membership`."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        membership = current_membership(request)
        if membership is None:
            # Signed in but in no tenant (an operator's account, or removed from the last one).
            return render(request, "portal/no_tenant.html", status=404)
        request.membership = membership
        return view(request, *args, **kwargs)

    return wrapped


def require_owner(request: HttpRequest) -> None:
    """Refuse a member what only owners may do; called once the object was found (so that
    another tenant's object is a 404 first)."""
    if not request.membership.is_owner:
        raise PermissionDenied("Only the tenant's owners may do this.")
