import hashlib

from apps.routing.table import Route, RoutingTable

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
