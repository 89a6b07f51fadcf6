from django.urls import path

from apps.routing.api import views

urlpatterns = [
    path(
        "alerts/alertmanager",
        views.AlertmanagerWebhookView.as_view(),
        name="alertmanager-webhook",
    ),
]
