"""The content filter through the running gateways: live edits, blocked prompts, streamed output."""

from __future__ import annotations

import time

import openai
import pytest
from tokenizers import Tokenizer

from apps.billing.models import UsageRecord
from apps.gateway.services import sensitive_term_create, sensitive_term_delete
from tests.http import call
from tests.stack import TINY_MODEL_DIR, wait_for

TERM = "你好你好"


@pytest.fixture
def blocked_term(committed):
    term = sensitive_term_create(term=TERM, category="test", action="block")
    yield term
    sensitive_term_delete(sensitive_term=term)


def ask(api_url: str, key: str, content: str):
    body = {
        "model": "dmx-tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
    }
    return call("POST", api_url + "/chat/completions", key=key, json_body=body)


def test_a_new_term_blocks_prompts_on_every_replica_within_two_seconds(platform, blocked_term):
    added_at = time.monotonic()
    for api_url in platform.api_urls:
        reply = wait_for(
            lambda url=api_url: (
                (r := ask(url, platform.api_key, "请说 你 好 你 好 吧")).status == 400 and r
            ),
            timeout=2.0 - (time.monotonic() - added_at),
            interval=0.05,
            what=f"the term to be live at {api_url}",
        )
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("content_policy_violation", "messages")
    assert ask(platform.api_url, platform.api_key, "你好").status == 200  # half a term is fine


def test_streamed_output_that_forms_a_term_is_cut_with_content_filter(platform, blocked_term):
    # Bias the tiny model towards the token "你好", so its output runs "你好你好…" and the
    # term only forms across two chunks.
    tokenizer = Tokenizer.from_file(str(TINY_MODEL_DIR / "tokenizer.json"))
    ids = tokenizer.encode("你好", add_special_tokens=False).ids
    assert len(ids) == 1
    wait_for(
        lambda: ask(platform.api_url, platform.api_key, TERM).status == 400,
        timeout=2,
        what="the term to be live",
    )
    client = openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="dmx-tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=50,
        stream=True,
        stream_options={"include_usage": True},
        logit_bias={str(ids[0]): 100},
    )
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["content_filter"]
    assert TERM not in text
    assert chunks[-1].usage is not None and 0 < chunks[-1].usage.completion_tokens < 50
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=raw.headers["x-request-id"]).first(),
        timeout=15,
        what="the usage record",
    )
    assert record.status == "content_filtered"
    assert record.completion_tokens == chunks[-1].usage.completion_tokens


def test_the_intent_label_goes_into_the_usage_record(platform, committed):
    reply = ask(platform.api_url, platform.api_key, "Write a Python function that reverses a list.")
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=reply.headers["x-request-id"]).first(),
        timeout=15,
        what="the usage record",
    )
    assert record.intent == "code"
    assert record.estimated_prompt_tokens == record.prompt_tokens  # the gateway counts exactly
    assert record.context_limit == 2048
