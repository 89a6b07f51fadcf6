"""Django URLs: the portal and its accounts, the management API and its schema, the admin, the
internal node API, health and metrics.

The OpenAI-compatible /v1 surface is not here: config.asgi routes it to the gateway's own
ASGI endpoints before Django's request handling, keeping the hot path off sync middleware.
"""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from config.exposition import metrics
from dmxplatform.health import health

urlpatterns = [
    path("accounts/", include("allauth.urls")),
    path("api/v1/", include("config.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("admin/", admin.site.urls),
    path("internal/v1/", include("apps.hardware.api.urls")),
    path("internal/v1/", include("apps.routing.api.urls")),
    path("health", health, name="health"),
    path("metrics", metrics, name="metrics"),
    path("", include("apps.portal.urls")),
]
