"""The demo set-up (manage.py dmx_demo, scripts/dev.sh): the alias `auto` on a fresh database,
created once, and an operator's later change of it kept."""

import json
import time

import pytest
from django.core.management import call_command

from apps.billing.pricing import price_book_load
from apps.models.choices import ModelKind
from apps.models.models import LlmModel
from apps.routing.models import RoutingRule
from apps.routing.selectors import routing_table_load
from config.demo import DEMO_ALIAS

pytestmark = pytest.mark.django_db


def demo(capsys, *extra: str) -> dict:
    call_command("dmx_demo", "--model-name", "dmx-tiny", *extra)
    return json.loads(capsys.readouterr().out)


def test_auto_sends_code_to_the_code_model_and_the_rest_to_the_general_one(capsys):
    created = demo(capsys, "--code-model-name", "dmx-tiny-code")
    assert created["api_key"] and created["operator_password"]

    table = routing_table_load(version=1)
    request_id = "req_" + "0" * 32
    assert table.resolve(DEMO_ALIAS, "code", request_id).model == "dmx-tiny-code"
    for intent in ("chat", "summarization", ""):  # "": a label the classifier is unsure of
        assert table.resolve(DEMO_ALIAS, intent, request_id).model == "dmx-tiny"


def test_a_second_run_creates_nothing_and_keeps_the_operators_change(capsys):
    demo(capsys, "--code-model-name", "dmx-tiny-code")
    RoutingRule.objects.filter(alias=DEMO_ALIAS, intent="code").update(weight=3.0)

    again = demo(capsys, "--code-model-name", "dmx-tiny-code")
    assert (again["api_key"], again["operator_password"], again["node_token"]) == (None,) * 3
    rules = RoutingRule.objects.filter(alias=DEMO_ALIAS)
    assert sorted(rules.values_list("intent", "model__name", "weight")) == [
        ("", "dmx-tiny", 1.0),
        ("code", "dmx-tiny-code", 3.0),
    ]


def test_without_a_code_model_there_is_no_alias(capsys):
    demo(capsys)
    assert not RoutingRule.objects.exists()


def test_a_rules_tier_is_in_the_routing_table(capsys):
    demo(capsys, "--code-model-name", "dmx-tiny-code")
    RoutingRule.objects.filter(alias=DEMO_ALIAS, intent="code").update(tier=0)
    table = routing_table_load(version=2)
    request_id = "req_" + "0" * 32
    assert table.resolve(DEMO_ALIAS, "code", request_id).tier == 0
    assert table.resolve(DEMO_ALIAS, "chat", request_id).tier is None


def test_the_embedding_model_is_priced_so_that_its_requests_are_billed(capsys):
    """dev.sh's embeddings example was once refused with model_not_priced."""
    demo(capsys, "--embed-model-name", "dmx-tiny-embed")
    model = LlmModel.objects.get(name="dmx-tiny-embed")
    assert model.kind == ModelKind.EMBED
    book = price_book_load()
    assert all(book.rates(v.id, time.time()) for v in model.versions.all())
