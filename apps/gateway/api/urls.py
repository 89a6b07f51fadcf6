"""The management API's gateway resources: the usage of stored responses."""

from django.urls import path

from apps.gateway.api import views

urlpatterns = [
    path(
        "usage/stored-responses",
        views.StoredResponsesUsage.as_view(),
        name="usage-stored-responses",
    ),
]
