"""Stored responses, the next turn over `previous_response_id`, and background runs, with
OpenAI's own client against the running platform (two gateway replicas, a real vLLM worker,
Celery draining into PostgreSQL): what OpenAI's Responses API promises a client that keeps
state on the server."""

from __future__ import annotations

import openai
import pytest

from apps.billing.models import UsageRecord
from apps.gateway.models import StoredResponse
from apps.gateway.response_records import hot_key
from apps.gateway.services import sensitive_term_create, sensitive_term_delete
from dmxplatform.redis_client import sync_redis
from tests.gateway.test_openai_client import usage_row
from tests.keys.factories import make_api_key
from tests.stack import DRAIN_TIMEOUT, wait_for

MODEL = "dmx-tiny"
TERM = "zyxwvutsr"
RUNNING = ("queued", "in_progress")


@pytest.fixture
def client(platform) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)


@pytest.fixture
def replica(platform) -> openai.OpenAI:
    """The same key on the other gateway replica."""
    return openai.OpenAI(base_url=platform.api_urls[-1], api_key=platform.api_key, max_retries=0)


def request_id_of(response_id: str) -> str:
    """The request that made a response: their ids share the hex part."""
    return "req_" + response_id.removeprefix("resp_")


def billed(response_id: str) -> UsageRecord:
    """The usage record of the request that made the response, once the ledger has it."""
    return usage_row(request_id_of(response_id))


def in_background(client: openai.OpenAI, text: str, tokens: int, **fields):
    """A background response of exactly `tokens` tokens (ignore_eos)."""
    return client.responses.create(
        model=MODEL,
        input=text,
        max_output_tokens=tokens,
        background=True,
        extra_body={"ignore_eos": True},
        **fields,
    )


def finished(client: openai.OpenAI, response_id: str, what: str):
    """The response once its run has ended."""
    return wait_for(
        lambda: (r := client.responses.retrieve(response_id)).status not in RUNNING and r,
        timeout=60,
        what=what,
    )


def test_a_response_is_stored_retrieved_listed_and_deleted(client, replica, committed):
    raw = client.responses.with_raw_response.create(
        model=MODEL, instructions="Be brief.", input="Say something.", max_output_tokens=6
    )
    response = raw.parse()
    assert response.store is True  # OpenAI's default
    # At once, and on the other replica: the answer's last bytes came after its Redis copy.
    again = replica.responses.with_raw_response.retrieve(response.id).http_response.json()
    assert again == raw.http_response.json()
    items = client.responses.input_items.list(response.id)
    assert [(item.type, item.role) for item in items.data] == [("message", "user")]
    assert items.data[0].content[0].text == "Say something."  # instructions are no item
    # Durable: drained into PostgreSQL, with the tenant's usage.
    row = wait_for(
        lambda: StoredResponse.objects.filter(id=response.id).first(),
        timeout=DRAIN_TIMEOUT,
        what="the stored response's row",
    )
    assert row.response == again
    assert row.size_bytes > 0 and row.status == response.status == again["status"]
    record = usage_row(raw.headers["x-request-id"])
    assert record.prompt_tokens == response.usage.input_tokens
    # Read from the row once the Redis copy has gone.
    tenant_id = row.tenant_id
    sync_redis().delete(hot_key(tenant_id, response.id))
    assert client.responses.retrieve(response.id).output[0].id == response.output[0].id

    deleted = client.responses.delete(response.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    for reader in (client, replica):
        with pytest.raises(openai.NotFoundError) as raised:
            reader.responses.retrieve(response.id)
        assert raised.value.body["code"] == "response_not_found"
    row.refresh_from_db()
    assert row.deleted_at is not None and row.response == {} and row.input_items == []


def test_a_response_deleted_before_the_drain_stays_deleted(client, committed):
    """Deleted at once, while its record still waits in the durable stream: the drain must not
    bring it back."""
    response = client.responses.create(model=MODEL, input="Forget me.", max_output_tokens=2)
    client.responses.delete(response.id)
    record = billed(response.id)  # the stream was drained
    assert record.endpoint == "responses"
    row = wait_for(
        lambda: StoredResponse.objects.filter(id=response.id).first(),
        timeout=DRAIN_TIMEOUT,
        what="the deleted response's row",
    )
    assert row.deleted_at is not None and row.response == {}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_stored_responses_answer_only_where_the_key_may_be_used(platform, committed):
    """The stored-response calls authenticate as /v1 does: a key limited to other networks
    cannot read, delete or cancel from here."""
    from tests.keys.factories import make_tenant

    tenant = make_tenant()
    _, open_key = make_api_key(tenant=tenant, name="anywhere")
    _, fenced = make_api_key(tenant=tenant, name="fenced", allowed_networks=["10.9.8.0/24"])
    mine = openai.OpenAI(base_url=platform.api_url, api_key=open_key, max_retries=0)
    response = mine.responses.create(model=MODEL, input="Hi.", max_output_tokens=2)
    other = openai.OpenAI(base_url=platform.api_url, api_key=fenced, max_retries=0)
    for attempt in (
        lambda: other.responses.retrieve(response.id),
        lambda: other.responses.delete(response.id),
        lambda: other.responses.input_items.list(response.id),
    ):
        with pytest.raises(openai.PermissionDeniedError) as raised:
            attempt()
        assert raised.value.body["code"] == "ip_not_allowed"
    assert mine.responses.retrieve(response.id).id == response.id


def test_store_false_keeps_nothing(client, committed):
    response = client.responses.create(
        model=MODEL, input="Say something.", max_output_tokens=4, store=False
    )
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(
            model=MODEL, input="Go on.", max_output_tokens=4, previous_response_id=response.id
        )
    assert raised.value.body["param"] == "previous_response_id"


def test_another_tenant_gets_404_for_every_path(platform, client, committed):
    response = client.responses.create(model=MODEL, input="Mine.", max_output_tokens=4)
    _, secret = make_api_key(name="other tenant")
    other = openai.OpenAI(base_url=platform.api_url, api_key=secret, max_retries=0)
    calls = (
        lambda: other.responses.retrieve(response.id),
        lambda: other.responses.input_items.list(response.id),
        lambda: other.responses.delete(response.id),
        lambda: other.responses.cancel(response.id),
        lambda: other.responses.create(
            model=MODEL, input="Yours?", max_output_tokens=4, previous_response_id=response.id
        ),
    )
    for attempt in calls:
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert client.responses.retrieve(response.id).id == response.id  # still there


def test_the_next_turn_carries_the_conversation_counted_and_billed(client, replica, committed):
    first = client.responses.create(
        model=MODEL, input="My name is Ada.", max_output_tokens=8, extra_body={"ignore_eos": True}
    )
    raw = replica.responses.with_raw_response.create(
        model=MODEL,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=5,
    )
    second = raw.parse()
    assert second.previous_response_id == first.id
    # The history is part of the prompt: the first turn's input and its 8 output tokens, then
    # the new message, each wrapped by the chat template.
    assert second.usage.input_tokens > first.usage.input_tokens + 8
    record = usage_row(raw.headers["x-request-id"])
    assert (record.prompt_tokens, record.completion_tokens) == (
        second.usage.input_tokens,
        second.usage.output_tokens,
    )
    # The same prompt sent in full is counted the same: the chain is the conversation.
    spelled_out = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        max_output_tokens=1,
        store=False,
    )
    assert spelled_out.usage.input_tokens == second.usage.input_tokens
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [item.id for item in items[:2]] == [
        client.responses.input_items.list(first.id).data[0].id,
        first.output[0].id,
    ]
    assert items[-1].content[0].text == "What is my name?"
    page = client.responses.input_items.list(second.id, order="asc", limit=1, after=items[0].id)
    assert [item.id for item in page.data] == [items[1].id] and page.has_more


def test_input_tokens_counts_a_turn_as_it_is_then_billed(client, committed):
    """OpenAI's token counting, for a turn that continues a stored response: the count is the
    prompt the turn is then held and billed at, and counting stores and records nothing."""
    first = client.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=4)
    params = {"model": MODEL, "input": "And yours?", "previous_response_id": first.id}
    raw = client.responses.input_tokens.with_raw_response.count(**params)
    counted = raw.parse()
    assert counted.object == "response.input_tokens" and counted.input_tokens > 0
    created = client.responses.with_raw_response.create(max_output_tokens=2, **params)
    assert usage_row(created.headers["x-request-id"]).prompt_tokens == counted.input_tokens
    assert created.parse().usage.input_tokens == counted.input_tokens
    assert not UsageRecord.objects.filter(request_id=raw.headers["x-request-id"]).exists()


def test_the_stored_history_is_screened_as_any_prompt(client, committed):
    """A term blocked after a turn was stored refuses the next turn: the history is prompt."""
    first = client.responses.create(model=MODEL, input=f"Say {TERM}.", max_output_tokens=2)
    term = sensitive_term_create(term=TERM, category="test", action="block")
    try:
        refused = wait_for(
            lambda: _refusal(client, first.id),
            timeout=5,
            what="the term to be live",
        )
        assert (refused["code"], refused["param"]) == ("content_policy_violation", "input")
    finally:
        sensitive_term_delete(sensitive_term=term)


def _refusal(client: openai.OpenAI, previous: str) -> dict | None:
    try:
        client.responses.create(
            model=MODEL, input="Go on.", max_output_tokens=1, previous_response_id=previous
        )
    except openai.BadRequestError as error:
        return error.body
    return None


def test_a_background_response_runs_is_polled_and_billed(client, replica, committed):
    queued = in_background(client, "Tell me a story.", 24)
    assert queued.status == "queued" and queued.background is True and queued.output == []
    done = finished(replica, queued.id, "the background response to finish")
    # All 24 tokens (ignore_eos): it ends at its budget, as Responses says, incomplete.
    assert done.status == "incomplete" and done.incomplete_details.reason == "max_output_tokens"
    assert done.usage.output_tokens == 24 and done.output_text
    record = billed(queued.id)
    assert (record.prompt_tokens, record.completion_tokens) == (done.usage.input_tokens, 24)
    # Its events, from any replica, from where the client stopped reading.
    events = list(replica.responses.retrieve(queued.id, stream=True, starting_after=2))
    numbers = [event.sequence_number for event in events]
    assert numbers[0] == 3 and numbers == list(range(3, 3 + len(numbers)))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == done.output_text
    with pytest.raises(openai.BadRequestError):  # it has finished: nothing to cancel
        client.responses.cancel(queued.id)


def test_a_background_response_streams_to_its_client_and_survives_it(client, committed):
    stream = in_background(client, "Tell me a story.", 40, stream=True)
    first = next(iter(stream))
    assert first.type == "response.created" and first.response.status == "queued"
    stream.close()  # the client leaves: the run goes on
    done = finished(client, first.response.id, "the background response to finish without it")
    assert done.status == "incomplete" and done.usage.output_tokens == 40


def test_a_cancelled_background_response_stops_and_bills_what_it_generated(
    client, replica, committed
):
    queued = in_background(client, "Count to a thousand.", 1500)
    wait_for(
        lambda: client.responses.retrieve(queued.id).status == "in_progress",
        timeout=60,
        what="the run to start",
    )
    cancelled = replica.responses.cancel(queued.id)  # on the replica that does not run it
    assert cancelled.status == "cancelled"
    final = wait_for(
        lambda: (
            client.responses.retrieve(queued.id).status == "cancelled"
            and StoredResponse.objects.filter(id=queued.id).first()
        ),
        timeout=30,
        what="the cancelled run's stored record",
    )
    record = billed(queued.id)
    assert record.status == "client_disconnected"
    assert 0 < record.completion_tokens < 1500
    text = "".join(
        part["text"] for item in final.response["output"] for part in item.get("content", ())
    )
    assert text and final.response["output"][-1]["status"] == "incomplete"
    assert client.responses.cancel(queued.id).status == "cancelled"  # idempotent


def test_a_background_request_over_its_limits_is_refused_not_queued(platform, committed):
    """Admission comes before the answer: a key at its request rate gets its 429 (and
    Retry-After) at once, and nothing is stored for the refused request."""
    _, secret = make_api_key(name="one a minute", requests_per_minute=1)
    limited = openai.OpenAI(base_url=platform.api_url, api_key=secret, max_retries=0)
    first = limited.responses.create(model=MODEL, input="Hi.", max_output_tokens=2, background=True)
    assert first.status == "queued"
    with pytest.raises(openai.RateLimitError) as raised:
        limited.responses.create(model=MODEL, input="Again.", max_output_tokens=2, background=True)
    assert raised.value.response.headers.get("retry-after")
    refused = raised.value.response.headers["x-request-id"].removeprefix("req_")
    billed_first = billed(first.id)
    assert billed_first.status == "ok"
    # Drained in order after the first: no stored row for the refused one.
    wait_for(
        lambda: StoredResponse.objects.filter(id=first.id).exists(),
        timeout=DRAIN_TIMEOUT,
        what="the first background response's row",
    )
    assert not StoredResponse.objects.filter(id="resp_" + refused).exists()


def test_an_agent_continues_its_conversation_by_previous_response_id(platform, committed):
    """Two runs of an OpenAI agent, the second sending only its new message and the first
    run's last response id: the platform supplies the conversation."""
    from agents import RunConfig, Runner

    from tests.gateway.test_api_surface import weather_agent

    calls: list[str] = []
    agent = weather_agent(platform, calls)
    config = RunConfig(tracing_disabled=True)
    first = Runner.run_sync(agent, "Weather in Paris?", run_config=config)
    second = Runner.run_sync(
        agent, "And in Oslo?", run_config=config, previous_response_id=first.last_response_id
    )
    assert len(calls) == 2 and second.final_output == f"Sunny in {calls[1]}."
    stored = wait_for(
        lambda: StoredResponse.objects.filter(id=second.last_response_id).first(),
        timeout=DRAIN_TIMEOUT,
        what="the second turn's stored response",
    )
    assert stored.previous_response_id == first.last_response_id
    kinds = [(item["type"], item.get("role")) for item in stored.input_items]
    assert kinds[0] == ("message", "user") and ("function_call", None) in kinds
    assert stored.input_items[0]["content"][0]["text"] == "Weather in Paris?"
    assert stored.input_items[-1]["content"][0]["text"] == "And in Oslo?"
