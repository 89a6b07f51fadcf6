"""An alias routed by intent, end to end: an operator changes a routing rule in the admin (a real
POST, as a logged-in operator), and the next request of that intent goes to the rule's new model,
at the rule's tier, whichever gateway replica takes it."""

from __future__ import annotations

from django.test import Client

from apps.billing.models import UsageRecord
from apps.keys.choices import PriorityTier
from apps.models.models import LlmModel
from apps.routing.models import RoutingDecision, RoutingRule
from apps.routing.services import routing_rule_delete
from tests.conftest import SERVED_MODELS, wait_for_refresh, wait_until_served
from tests.http import call
from tests.keys.factories import make_staff
from tests.stack import wait_for

# Its own alias: the rules of other tests' aliases are not this test's to change.
ALIAS = "auto-e2e"
GENERAL, OTHER = SERVED_MODELS  # dmx-tiny, dmx-tiny-b
CODE_PROMPT = "Write a Python function that reverses a list."
CHAT_PROMPT = "Hello! How are you today?"
RULES = "/admin/routing/routingrule/"


def ask(url: str, key: str, content: str) -> str:
    body = {"model": ALIAS, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    reply = call("POST", url + "/chat/completions", key=key, json_body=body)
    assert reply.status == 200, reply.body
    return reply.headers["x-request-id"]


def served(request_id: str) -> UsageRecord:
    """The request's usage record, once the ledger has it."""
    return wait_for(
        lambda: UsageRecord.objects.filter(request_id=request_id).first(),
        timeout=20,
        what=f"the usage record of {request_id}",
    )


def decision(request_id: str) -> RoutingDecision:
    return wait_for(
        lambda: RoutingDecision.objects.filter(request_id=request_id).first(),
        timeout=20,
        what=f"the routing decision of {request_id}",
    )


def rule_form(*, intent: str, model: str, tier: int | None = None) -> dict[str, str]:
    """The admin's rule form as an operator fills it in."""
    return {
        "alias": ALIAS,
        "intent": intent,
        "model": str(LlmModel.objects.get(name=model).id),
        "weight": "1",
        "hardware_preference": "[]",
        "tier": "" if tier is None else str(tier),
        "is_active": "on",
    }


def admin_post(operator: Client, path: str, form: dict[str, str]) -> None:
    page = operator.post(path, form)
    # The admin answers a saved form with a redirect, an invalid one with the form again.
    assert page.status_code == 302, page.content.decode()[:2000]


def serving(platform, model: str) -> None:
    """Make sure a node serves `model`: earlier tests stop the stack's workers on purpose
    (tests/gateway/test_node_liveness.py leaves dmx-tiny-b stopped)."""
    worker = platform.workers[model]
    if not worker.alive():
        worker = platform.stack.start_worker(model_name=model, node_token=platform.node_token)
        platform.workers[model] = worker
    wait_until_served(platform, model, worker)


def test_an_admin_change_of_a_rule_moves_the_next_request_on_every_replica(platform, committed):
    for model in (GENERAL, OTHER):
        serving(platform, model)
    operator = Client()
    operator.force_login(make_staff("operator"))
    try:
        admin_post(operator, RULES + "add/", rule_form(intent="", model=GENERAL))
        admin_post(operator, RULES + "add/", rule_form(intent="code", model=OTHER))
        code_rule = RoutingRule.objects.get(alias=ALIAS, intent="code")
        wait_for_refresh(platform)

        for url in platform.api_urls:
            code = ask(url, platform.api_key, CODE_PROMPT)
            chat = ask(url, platform.api_key, CHAT_PROMPT)
            record = served(code)
            assert (record.model, served(chat).model) == (OTHER, GENERAL)
            assert record.node == platform.workers[OTHER].node_name
            assert record.intent == "code" and not record.intent_low_confidence
            assert record.intent_confidence >= 0.5
            logged = decision(code)
            assert (logged.requested_model, logged.model, logged.intent) == (ALIAS, OTHER, "code")
            assert logged.priority == PriorityTier.STANDARD  # the key's: the rule has no tier

        # The operator sends code to the general model, at batch tier.
        admin_post(
            operator,
            f"{RULES}{code_rule.id}/change/",
            rule_form(intent="code", model=GENERAL, tier=PriorityTier.BATCH),
        )
        wait_for_refresh(platform)

        general_nodes = {platform.workers[name].node_name for name in ("dmx-tiny", "dmx-tiny-v2")}
        for url in platform.api_urls:
            code = ask(url, platform.api_key, CODE_PROMPT)
            assert served(code).model == GENERAL and served(code).node in general_nodes
            logged = decision(code)
            assert (logged.model, logged.intent, logged.priority) == (
                GENERAL,
                "code",
                PriorityTier.BATCH,
            )
    finally:
        for rule in RoutingRule.objects.filter(alias=ALIAS):
            routing_rule_delete(rule=rule)
