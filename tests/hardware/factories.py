from __future__ import annotations

from apps.hardware.models import NodeToken
from apps.hardware.services import node_token_create


def make_node_token(name: str = "test") -> tuple[NodeToken, str]:
    return node_token_create(name=name)
