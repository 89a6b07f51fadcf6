"""The routing admin: a decision's candidates and a recomputation's proposal, rendered as tables."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.routing.choices import DecisionOutcome, RecomputationStatus
from apps.routing.models import RoutingDecision, WeightRecomputation

pytestmark = pytest.mark.django_db


def test_a_decision_shows_every_candidate_with_its_verdict_and_scores(admin_client):
    decision = RoutingDecision.objects.create(
        request_id=f"req_{uuid.uuid4().hex}",
        created_at=timezone.now(),
        requested_model="auto",
        model="m",
        outcome=DecisionOutcome.ROUTED,
        chosen_node="gpu-a",
        candidates={
            "pool": "canary",
            "fallback": True,
            "nodes": [
                {
                    "node": "gpu-a",
                    "version": "v2",
                    "rejected_by": None,
                    "total": 0.91,
                    "scores": {"queue": 0.5, "kv_cache": 0.25},
                },
                {
                    "node": "<b>gpu-b</b>",
                    "version": "v1",
                    "rejected_by": "temperature",
                    "total": 0,
                    "scores": {},
                },
            ],
        },
    )

    page = admin_client.get(f"/admin/routing/routingdecision/{decision.pk}/change/")

    assert page.status_code == 200
    text = page.content.decode()
    assert "pool: canary (fallback" in text
    assert "<td>gpu-a</td>" in text and "<td>eligible</td>" in text
    assert "<code>queue=0.5</code>" in text and "<code>kv_cache=0.25</code>" in text
    assert "<td>temperature</td>" in text
    # A node name is data, never markup.
    assert "&lt;b&gt;gpu-b&lt;/b&gt;" in text and "<b>gpu-b</b>" not in text


def test_a_recomputation_shows_old_and_new_weights_with_their_figures(admin_client):
    now = timezone.now()
    recomputation = WeightRecomputation.objects.create(
        window_start=now - timedelta(days=1),
        window_end=now,
        status=RecomputationStatus.PROPOSED,
        changes=[
            {
                "rule": 1,
                "alias": "auto",
                "intent": "",
                "model": "fast",
                "old": 1.0,
                "new": 1.3,
                "figures": {"requests": 60, "p95_ms": 100.0},
            },
        ],
    )

    page = admin_client.get(f"/admin/routing/weightrecomputation/{recomputation.pk}/change/")

    assert page.status_code == 200
    text = page.content.decode()
    assert "<td>auto/*</td>" in text and "<td>fast</td>" in text
    assert "<td>1.0</td>" in text and "<td>1.3</td>" in text
    assert "<code>requests=60</code>" in text and "<code>p95_ms=100.0</code>" in text
