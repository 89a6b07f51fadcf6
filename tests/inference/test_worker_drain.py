"""An operator's drain reaches a real worker on its next heartbeat's answer: it says so once, in
its log, with what it still has in flight, and says so again when undrained."""

from __future__ import annotations

from apps.hardware.models import Node
from apps.hardware.services import node_drain, node_undrain
from tests.conftest import fleet_node
from tests.stack import wait_for

DRAINED = "drained by an operator: no new requests will come; 0 in flight"
UNDRAINED = "undrained by an operator: new requests will come again"


def test_the_worker_learns_its_drain_from_the_heartbeat_answer(platform, committed):
    worker = platform.workers["dmx-tiny-v2"]
    node = Node.objects.get(name=worker.node_name)

    def said(line: str) -> int:
        return worker.log_path.read_text(errors="replace").count(line)

    before = said(DRAINED)
    try:
        node_drain(node=node)
        wait_for(lambda: said(DRAINED) > before, timeout=10, what="the worker to log its drain")
        # Said once, not again on each heartbeat that still answers drained: four more land.
        landed: set[float] = set()

        def four_more_heartbeats() -> bool:
            node = fleet_node(worker.node_name)
            landed.add(node.heartbeat_at if node else 0.0)
            return len(landed) > 4

        wait_for(four_more_heartbeats, timeout=30, interval=0.05, what="four more heartbeats")
        assert said(DRAINED) == before + 1
    finally:
        node_undrain(node=node)
    wait_for(lambda: said(UNDRAINED) > 0, timeout=10, what="the worker to log its undrain")
    assert worker.alive()
