"""What every portal page's layout shows: the tenant the user works in and the others they
may switch to (templates/portal/base.html, which the allauth pages extend too)."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from apps.keys.selectors import memberships_of
from apps.portal.tenancy import current_membership


def portal(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    # Lazy: pages that never draw the portal's header (the admin) cost no query.
    return {
        "portal_membership": SimpleLazyObject(lambda: current_membership(request)),
        "portal_memberships": SimpleLazyObject(lambda: list(memberships_of(user=user))),
    }
