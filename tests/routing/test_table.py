import hashlib

from apps.keys.choices import PriorityTier
from apps.models.catalog import Catalog
from apps.routing.dispatcher import Dispatcher
from apps.routing.table import Route, RoutingTable, request_tier
from tests.routing.factories import NoRedis, make_model_entry

TABLE = RoutingTable(
    version=1,
    aliases={
        "auto": {
            "code": (Route("coder", 3.0, frozenset({"h100"})), Route("general", 1.0, frozenset())),
            "": (Route("general", 1.0, frozenset()),),
        }
    },
)


def test_intent_rules_first_then_catch_all():
    assert TABLE.resolve("auto", "chat", "req_" + "0" * 32).model == "general"
    assert TABLE.resolve("nope", "chat", "req_" + "0" * 32) is None
    assert not TABLE.is_alias("general")


def test_split_follows_the_weights_and_is_stable_per_request():
    ids = ["req_" + hashlib.md5(str(i).encode()).hexdigest() for i in range(4000)]
    picks = [TABLE.resolve("auto", "code", rid).model for rid in ids]
    share = picks.count("coder") / len(picks)
    assert 0.70 < share < 0.80
    assert picks == [TABLE.resolve("auto", "code", rid).model for rid in ids]


def test_a_route_tier_lowers_the_key_tier_and_never_raises_it():
    batch, standard, priority = PriorityTier.BATCH, PriorityTier.STANDARD, PriorityTier.PRIORITY
    assert request_tier(priority, None) == priority  # a rule without a tier: the key's
    assert request_tier(priority, batch) == batch  # summaries at batch, even a priority key's
    assert request_tier(standard, batch) == batch
    assert request_tier(batch, priority) == batch  # no rule lifts a key above what it pays for
    assert request_tier(standard, priority) == standard


def test_a_request_resolved_through_an_alias_runs_at_its_route_tier():
    table = RoutingTable(
        version=1,
        aliases={
            "auto": {
                "summarization": (Route("general", 1.0, frozenset(), tier=PriorityTier.BATCH),),
                "": (Route("general", 1.0, frozenset()),),
            }
        },
    )
    dispatcher = Dispatcher(NoRedis())
    dispatcher.table = table
    dispatcher.catalog = Catalog(version=1, models={"general": make_model_entry(name="general")})
    request_id = "req_" + "0" * 32

    def resolved(name: str, intent: str):
        return dispatcher.resolve(name, intent=intent, request_id=request_id, allows=lambda _: True)

    summary = resolved("auto", "summarization")
    assert summary.model.name == "general"
    assert summary.priority(PriorityTier.PRIORITY) == PriorityTier.BATCH
    # The default route (also where a label the classifier is unsure of goes) has no tier.
    assert resolved("auto", "").priority(PriorityTier.PRIORITY) == PriorityTier.PRIORITY
    # A request that names its model takes no rule's tier.
    assert resolved("general", "summarization").priority(PriorityTier.STANDARD) == (
        PriorityTier.STANDARD
    )
