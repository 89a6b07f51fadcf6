"""The management API's routing table (/api/v1/routing-rules), apart from the internal API."""

from django.urls import path

from apps.routing.api import management

urlpatterns = [
    path("routing-rules", management.RoutingRuleList.as_view(), name="routing-rule-list"),
    path(
        "routing-rules/<int:pk>", management.RoutingRuleDetail.as_view(), name="routing-rule-detail"
    ),
]
