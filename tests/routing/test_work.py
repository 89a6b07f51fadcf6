"""Predicted decode work: the ledger's figures per model, intent and key, recomputed, published
with the routing table, and what the router predicts from them."""

import uuid

import pytest
from django.utils import timezone

from apps.billing.models import UsageRecord
from apps.routing.selectors import routing_table_load
from apps.routing.services import ROUTING_TABLE_VERSION, work_profiles_recompute
from apps.routing.tasks import work_profiles_recompute_task
from apps.routing.work import DEFAULT_COMPLETION_TOKENS, KEY_MIN_REQUESTS, WorkFigures, WorkTable
from dmxplatform.redis_client import sync_redis
from tests.keys.factories import make_api_key
from tests.routing.factories import make_model_entry, make_router, make_snapshot, route_request


def figures(p50: int) -> WorkFigures:
    return WorkFigures(requests=100, completion_p50=p50, completion_p95=p50 * 4)


TABLE = WorkTable(
    by_intent={("m", ""): figures(300), ("m", "code"): figures(600)},
    by_key={("m", "code", 7): figures(900)},
)


@pytest.mark.parametrize(
    ("intent", "key_id", "max_tokens", "predicted"),
    [
        ("code", 7, None, 900),  # the key's own history
        ("code", 8, None, 600),  # another key: the intent's
        ("chat", 7, None, 300),  # an intent without figures: the model's
        ("code", 7, 2048, 900),  # a generous cap changes nothing
        ("code", 7, 50, 50),  # a tight one is the most it can be
    ],
)
def test_the_prediction_is_the_most_specific_median_capped_by_max_tokens(
    intent, key_id, max_tokens, predicted
):
    assert TABLE.predict("m", intent, key_id, max_tokens) == predicted


def test_without_history_the_prediction_is_a_default_not_max_tokens():
    assert WorkTable().predict("m", "chat", None, None) == DEFAULT_COMPLETION_TOKENS
    assert WorkTable().predict("m", "chat", None, 8192) == DEFAULT_COMPLETION_TOKENS
    assert WorkTable().predict("m", "chat", None, 16) == 16


def test_the_router_predicts_a_request_that_comes_without_one():
    router = make_router(make_snapshot(name="a"))
    router.work = TABLE
    request = route_request(
        make_model_entry(name="m"), completion_tokens=None, max_tokens=4096, intent="code"
    )
    router.decide(request)
    assert request.completion_tokens == 600


def record(key, *, model, intent, completion, ttft_ms=100.0, status="ok", endpoint=None):
    return UsageRecord(
        request_id=f"req_{uuid.uuid4().hex}",
        api_key=key,
        tenant=key.tenant,
        created_at=timezone.now(),
        endpoint=endpoint or "chat.completions",
        model=model,
        intent=intent,
        status=status,
        http_status=200,
        completion_tokens=completion,
        duration_ms=ttft_ms * 10,
        time_to_first_token_ms=ttft_ms,
    )


@pytest.mark.django_db
@pytest.mark.usefixtures("private_redis")
def test_the_ledger_figures_are_recomputed_and_published_with_the_routing_table(
    django_capture_on_commit_callbacks,
):
    model = f"work-{uuid.uuid4().hex[:6]}"
    regular, _ = make_api_key()
    occasional, _ = make_api_key()
    rows = [  # a regular key's code requests: 1..KEY_MIN_REQUESTS tokens
        record(regular, model=model, intent="code", completion=n)
        for n in range(1, KEY_MIN_REQUESTS + 1)
    ]
    rows += [  # another key's few long ones: the intent's figures, not a key's of their own
        record(occasional, model=model, intent="code", completion=1000, ttft_ms=900.0)
        for _ in range(10)
    ]
    rows += [  # what says nothing of an answer's length
        record(regular, model=model, intent="code", completion=0, status="upstream_error"),
        record(regular, model=model, intent="", completion=0, endpoint="embeddings"),
    ]
    UsageRecord.objects.bulk_create(rows)
    redis = sync_redis()
    before = redis.get(ROUTING_TABLE_VERSION.key)
    with django_capture_on_commit_callbacks(execute=True):
        assert work_profiles_recompute_task() == 3  # the model, its code intent, the regular key
    assert redis.get(ROUTING_TABLE_VERSION.key) != before  # every gateway reloads the table

    work = routing_table_load(version=1).work
    key_figures = work.figures(model, "code", regular.id)
    assert key_figures.requests == KEY_MIN_REQUESTS
    assert key_figures.completion_p50 == round((KEY_MIN_REQUESTS + 1) / 2)
    intent_figures = work.figures(model, "code", occasional.id)
    assert intent_figures.requests == KEY_MIN_REQUESTS + 10
    assert intent_figures.completion_p95 == 1000
    assert intent_figures.ttft_p50_ms == 100.0 and intent_figures.ttft_p95_ms == 900.0
    assert intent_figures.latency_p95_ms == 9000.0
    assert work.figures(model, "chat", None) == work.figures(model, "", None)  # the model's

    # Recomputed as a whole: a window without the requests leaves nothing of them.
    later = timezone.now() + timezone.timedelta(days=30)
    with django_capture_on_commit_callbacks(execute=True):
        work_profiles_recompute(now=later)
    assert routing_table_load(version=2).work.figures(model, "code", regular.id) is None
