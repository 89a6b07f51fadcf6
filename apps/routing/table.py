"""The routing table in memory: an alias (e.g. "auto") resolved to a model for an intent."""

from __future__ import annotations

from dataclasses import dataclass, field

from apps.routing.work import WorkTable


@dataclass(frozen=True, slots=True)
class Route:
    model: str
    weight: float
    preferred_profiles: frozenset[str]
    # The priority tier of the requests routed here (PriorityTier; None: their key's), as
    # request_tier applies it.
    tier: int | None = None


def request_tier(key_tier: int, route_tier: int | None) -> int:
    """The tier a request runs at: its key's, lowered to its route's where that is lower.

    A route can only demote: a rule that puts summaries at batch must not lift a batch key's
    chat above the standard keys' it would otherwise queue behind, nor a standard key's above
    what it pays for; a priority key's summaries do drop to batch, as the operator asked.
    """
    return key_tier if route_tier is None else min(key_tier, route_tier)


@dataclass(frozen=True, slots=True)
class RoutingTable:
    version: int = -1
    # alias -> intent ("" for any) -> routes
    aliases: dict[str, dict[str, tuple[Route, ...]]] = field(default_factory=dict)
    # What requests generate, per model, intent and key: the router's predictions.
    work: WorkTable = field(default_factory=WorkTable)

    def is_alias(self, name: str) -> bool:
        return name in self.aliases

    def resolve(self, alias: str, intent: str, request_id: str) -> Route | None:
        """Pick a route for the intent (or the alias's catch-all), in proportion to the weights.

        The pick is a function of the request id, so a retried or replayed request lands on the
        same model, and the split over many requests follows the weights.
        """
        intents = self.aliases.get(alias)
        if not intents:
            return None
        routes = [r for r in intents.get(intent) or intents.get("") or () if r.weight > 0]
        if not routes:
            return None
        total = sum(route.weight for route in routes)
        point = int(request_id[-12:-4], 16) / 0xFFFFFFFF * total
        for route in routes:
            point -= route.weight
            if point < 0:
                return route
        return routes[-1]
