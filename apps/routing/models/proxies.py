"""Other apps' rows seen from routing's side, for the admin: canaries and circuit breakers."""

from __future__ import annotations

from apps.hardware.models import Node
from apps.models.models import ModelVersion


class Canary(ModelVersion):
    class Meta:
        proxy = True
        verbose_name = "canary release"


class NodeBreaker(Node):
    class Meta:
        proxy = True
        verbose_name = "circuit breaker"
