"""The management REST API, /api/v1/: each app's resources (its api/urls.py), one schema.

Paths have no trailing slash, like /v1. Whatever matches none of them is a 404 in the
platform's error shape, for every method.
"""

from django.urls import include, path, re_path

from dmxplatform.api import UnknownPath

app_name = "api"

urlpatterns = [
    path("", include("apps.keys.api.urls")),
    path("", include("apps.billing.api.urls")),
    path("", include("apps.gateway.api.urls")),
    path("", include("apps.models.api.urls")),
    path("", include("apps.hardware.api.management_urls")),
    path("", include("apps.routing.api.management_urls")),
    re_path(r"", UnknownPath.as_view()),
]
