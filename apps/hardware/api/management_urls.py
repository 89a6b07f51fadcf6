"""The management API's nodes (/api/v1/nodes), apart from the internal node API in urls.py."""

from django.urls import path

from apps.hardware.api import management

urlpatterns = [
    path("nodes", management.NodeList.as_view(), name="node-list"),
    path("nodes/<int:pk>", management.NodeDetail.as_view(), name="node-detail"),
    path("nodes/<int:pk>/drain", management.NodeDrain.as_view(), name="node-drain"),
    path("nodes/<int:pk>/undrain", management.NodeUndrain.as_view(), name="node-undrain"),
]
