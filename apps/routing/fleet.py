"""Each gateway process's in-memory copy of live node state, refreshed from Redis: one immutable
snapshot per refresh, and this process's own requests in flight beside it."""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from apps.hardware.nodestate import NodeSnapshot, now
from inference.prefix_cache import PrefixFilter

# Block hashes remembered per node for prefix matching: about what an 80 GB GPU's KV cache holds
# of an 8B model (430k tokens in 512-token blocks), so the index forgets about when the node does.
PREFIX_INDEX_BLOCKS = 1024

T = TypeVar("T")


@dataclass(slots=True)
class NodeWork:
    """What this process sent a node and it has not finished: prompt tokens still to prefill
    (the request's first token has not come), tokens still to decode."""

    requests: int = 0
    prefilling: int = 0  # requests among them without a first token yet
    prefill_tokens: int = 0
    decode_tokens: int = 0
    # Since the node's last heartbeat: requests begun less ended, begun less prefilled. What
    # the heartbeat counted of ours is what is in flight now less these.
    new_requests: int = 0
    new_prefilling: int = 0


@dataclass(slots=True)
class Ticket:
    node_id: int
    prompt_tokens: int
    completion_tokens: int
    prefilled: bool = False


@dataclass(frozen=True, eq=False)
class FleetSnapshot:
    """The fleet as one refresh read it, never changed: its nodes by model and by id. What
    routing derives from node state alone (a node's rates, a model's prefill scale, an engine's
    decoded prefix filter) is computed at most once per snapshot and kept on it (`derive`), so
    it can never outlive the state it came from."""

    by_model: dict[str, list[NodeSnapshot]] = field(default_factory=dict)
    by_id: dict[int, NodeSnapshot] = field(default_factory=dict)
    _derived: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def decode(cls, raw: dict[bytes, bytes]) -> FleetSnapshot:
        """The snapshot of the fleet hash's entries (nodestate.fleet_key)."""
        by_model: dict[str, list[NodeSnapshot]] = defaultdict(list)
        for value in raw.values():
            node = NodeSnapshot.decode(value)
            by_model[node.model].append(node)
        for nodes in by_model.values():
            nodes.sort(key=lambda node: node.id)
        by_id = {node.id: node for nodes in by_model.values() for node in nodes}
        return cls(by_model=dict(by_model), by_id=by_id)

    def derive(self, key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()`'s value, computed once for this snapshot."""
        try:
            return self._derived[key]
        except KeyError:
            value = self._derived[key] = compute()
            return value

    def prefix_filter(self, node_id: int) -> PrefixFilter | None:
        """The node's engine's prefix filter, decoded once."""
        return self.derive(("prefix_filter", node_id), lambda: self._decode_filter(node_id))

    def _decode_filter(self, node_id: int) -> PrefixFilter | None:
        node = self.by_id.get(node_id)
        text = node.engine.prefix_filter if node is not None else None
        try:
            return PrefixFilter.decode(text) if text else None
        except ValueError:  # not base64: a worker's bug must not break routing
            return None


class FleetView:
    """A gateway process's view of the fleet: the snapshot of the last refresh, and beside it
    what this process has in flight on each node (`begin`, `prefilled`, `end`), which the
    snapshot's heartbeats cannot say yet.

    The heartbeat load is up to a heartbeat interval old; counting our own in-flight requests
    on top keeps a burst from piling onto the node that looked idle at the last refresh.
    """

    def __init__(self, *, stale_after: float) -> None:
        self.stale_after = stale_after
        self.snapshot = FleetSnapshot()
        self.work: defaultdict[int, NodeWork] = defaultdict(NodeWork)
        # Per node, the block hashes of prompts this process sent there, least recent first: an
        # approximation of its prefix cache built from our own routing.
        self.prefixes: defaultdict[int, OrderedDict[int, None]] = defaultdict(OrderedDict)

    def replace(self, raw: dict[bytes, bytes]) -> None:
        """Swap in the nodes read from the fleet hash."""
        previous = self.snapshot.by_id
        self.snapshot = FleetSnapshot.decode(raw)
        for node_id, work in self.work.items():
            node, before = self.snapshot.by_id.get(node_id), previous.get(node_id)
            if node is not None and (before is None or before.heartbeat_at != node.heartbeat_at):
                work.new_requests = work.new_prefilling = 0

    def get(self, node_id: int) -> NodeSnapshot | None:
        """A node's latest state, as of the last refresh."""
        return self.snapshot.by_id.get(node_id)

    def all_nodes(self) -> list[NodeSnapshot]:
        """Every registered node, of every model."""
        return [node for nodes in self.snapshot.by_model.values() for node in nodes]

    def nodes(self, model: str) -> list[NodeSnapshot]:
        """Every node registered for `model`, live or not."""
        return self.snapshot.by_model.get(model, [])

    def live_nodes(self, model: str) -> list[NodeSnapshot]:
        """Nodes serving `model` that are up and have sent a recent heartbeat."""
        t = now()
        return [n for n in self.nodes(model) if n.is_live(now=t, stale_after=self.stale_after)]

    def live_models(self) -> set[str]:
        t = now()
        return {
            model
            for model, nodes in self.snapshot.by_model.items()
            if any(n.is_live(now=t, stale_after=self.stale_after) for n in nodes)
        }

    def kv_pressure(self, model: str) -> float | None:
        """Mean KV-cache use of the live nodes serving `model`, or None when none is live."""
        nodes = self.live_nodes(model)
        if not nodes:
            return None
        return sum(node.engine.kv_cache_usage for node in nodes) / len(nodes)

    def in_flight(self, node_id: int) -> int:
        """Requests this process sent the node that have not ended."""
        work = self.work.get(node_id)
        return work.requests if work is not None else 0

    def queued(self, node: NodeSnapshot) -> int:
        """Requests on a node: what it reported plus what this process sent since."""
        engine = node.engine
        return engine.num_requests_running + engine.num_requests_waiting + self.in_flight(node.id)

    def others_on(self, node: NodeSnapshot, *, since: float) -> int:
        """Requests on a node besides one of this process's, in flight there since `since`
        (wall clock): this process's own others, or the engine's last count, whichever is more
        (other gateways' requests only the engine sees). The engine counts ours too when its
        heartbeat came after we sent it; one from before cannot."""
        latest = self.get(node.id) or node
        engine = latest.engine.num_requests_running + latest.engine.num_requests_waiting
        if latest.heartbeat_at > since:
            engine -= 1
        return max(self.in_flight(node.id) - 1, engine, 0)

    def begin(
        self, node_id: int, *, prompt_tokens: int, completion_tokens: int, blocks=()
    ) -> Ticket:
        """A request went to a node: its work counts there until end()."""
        work = self.work[node_id]
        work.requests += 1
        work.prefilling += 1
        work.new_requests += 1
        work.new_prefilling += 1
        work.prefill_tokens += prompt_tokens
        work.decode_tokens += completion_tokens
        if blocks:
            index = self.prefixes[node_id]
            for block in blocks:
                index[block] = None
                index.move_to_end(block)
            while len(index) > PREFIX_INDEX_BLOCKS:
                index.popitem(last=False)
        return Ticket(node_id, prompt_tokens, completion_tokens)

    def prefilled(self, ticket: Ticket) -> None:
        """The request's first token came: its prompt is no longer queued work."""
        if not ticket.prefilled:
            ticket.prefilled = True
            work = self.work[ticket.node_id]
            work.prefilling -= 1
            work.new_prefilling -= 1
            work.prefill_tokens -= ticket.prompt_tokens

    def end(self, ticket: Ticket) -> None:
        self.prefilled(ticket)
        work = self.work[ticket.node_id]
        work.requests -= 1
        work.new_requests -= 1
        work.decode_tokens -= ticket.completion_tokens

    def cached_blocks(self, node_id: int, blocks) -> int:
        """Leading blocks of a prompt the node likely holds: this process last sent them there,
        or its engine's KV-cache events say it holds them (whoever sent them)."""
        index = self.prefixes.get(node_id)
        held = self.snapshot.prefix_filter(node_id)
        if not index and held is None:
            return 0
        index = index or ()
        count = 0
        for block in blocks:
            if block not in index and (held is None or block not in held):
                break
            count += 1
        return count
