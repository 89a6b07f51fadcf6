"""The management API's routing (/api/v1/routing-rules, canaries, weight-recomputations, and a
node's breaker), apart from the internal API."""

from django.urls import path

from apps.routing.api import management

urlpatterns = [
    path("routing-rules", management.RoutingRuleList.as_view(), name="routing-rule-list"),
    path(
        "routing-rules/<int:pk>", management.RoutingRuleDetail.as_view(), name="routing-rule-detail"
    ),
    path("canaries", management.CanaryList.as_view(), name="canary-list"),
    path("canaries/<int:pk>", management.CanaryDetail.as_view(), name="canary-detail"),
    path("canaries/<int:pk>/promote", management.CanaryPromote.as_view(), name="canary-promote"),
    path("canaries/<int:pk>/rollback", management.CanaryRollback.as_view(), name="canary-rollback"),
    path("nodes/<int:pk>/breaker/reset", management.BreakerReset.as_view(), name="breaker-reset"),
    path(
        "weight-recomputations",
        management.WeightRecomputationList.as_view(),
        name="weight-recomputation-list",
    ),
    path(
        "weight-recomputations/<int:pk>",
        management.WeightRecomputationDetail.as_view(),
        name="weight-recomputation-detail",
    ),
    path(
        "weight-recomputations/<int:pk>/apply",
        management.WeightRecomputationApply.as_view(),
        name="weight-recomputation-apply",
    ),
    path(
        "weight-recomputations/<int:pk>/reject",
        management.WeightRecomputationReject.as_view(),
        name="weight-recomputation-reject",
    ),
]
