"""The realistic workload (bench/workload.py) is what its docstring says it is: drawn from the
published trace and the human-written prompts, in the stated shares, and valid on the wire."""

import gzip
import json
import statistics

import pytest

from bench import workload

COUNT = 4_096


@pytest.fixture(scope="module")
def requests():
    return workload.draw(COUNT, model="m", embed_model="e")


def _prompt_bytes(request: workload.Request) -> int:
    body = request.body
    messages = body.get("messages") or body.get("input")
    if isinstance(messages, str):
        return len(messages.encode())
    system = body.get("system") or body.get("instructions") or ""
    return len(system.encode()) + sum(len(m["content"].encode()) for m in messages)


def test_the_same_seed_draws_the_same_requests(requests):
    assert workload.draw(50, model="m", embed_model="e") == requests[:50]
    assert workload.draw(50, model="m", embed_model="e", seed=2) != requests[:50]


def test_endpoints_and_streams_come_in_their_shares(requests):
    for endpoint, share in workload.ENDPOINT_SHARES.items():
        drawn = sum(r.endpoint == endpoint for r in requests) / COUNT
        assert abs(drawn - share) < 0.03, (endpoint, drawn)
    generating = [r for r in requests if r.endpoint != "embeddings"]
    streamed = sum(r.stream for r in generating) / len(generating)
    assert abs(streamed - workload.STREAM_SHARE) < 0.03
    assert not any(r.stream for r in requests if r.endpoint == "embeddings")
    assert all(r.body.get("stream", False) == r.stream for r in requests)


def test_prompt_sizes_follow_the_trace_up_to_the_cap(requests):
    sizes = [_prompt_bytes(r) for r in requests if r.endpoint != "embeddings"]
    assert max(sizes) <= workload.MAX_PROMPT_BYTES
    lengths = workload.trace_lengths()
    expected = statistics.median(
        min(tokens * workload.BYTES_PER_TOKEN, workload.MAX_PROMPT_BYTES) for tokens, _ in lengths
    )
    # Built of whole records, conversations fall a little short of the drawn size.
    assert 0.8 * expected <= statistics.median(sizes) <= 1.05 * expected
    completions = [
        r.body.get("max_tokens") or r.body.get("max_output_tokens")
        for r in requests
        if r.endpoint != "embeddings"
    ]
    assert max(completions) <= workload.MAX_COMPLETION_TOKENS
    assert statistics.median(completions) == pytest.approx(
        statistics.median(min(c, workload.MAX_COMPLETION_TOKENS) for _, c in lengths), rel=0.2
    )


def test_the_trace_is_the_published_one():
    with gzip.open(workload.AZURE_TRACE, "rt") as handle:
        assert handle.readline().strip() == "TIMESTAMP,ContextTokens,GeneratedTokens"
    assert len(workload.trace_lengths()) == 6_000


def test_conversations_alternate_and_end_with_the_user(requests):
    for request in requests:
        if request.endpoint == "embeddings":
            assert isinstance(request.body["input"], str) and request.body["input"]
            continue
        messages = request.body.get("messages") or request.body["input"]
        if request.endpoint == "chat":
            assert messages[0]["role"] == "system"
            messages = messages[1:]
        roles = [m["role"] for m in messages]
        assert roles[-1] == "user"
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        assert all(m["content"] for m in messages)


def test_keys_are_zipf_distributed(requests):
    plan = workload.KeyPlan.draw()
    counts: dict[int, int] = {}
    for request in requests:
        counts[request.key] = counts.get(request.key, 0) + 1
    ordered = sorted(counts.values(), reverse=True)
    cdf = workload.zipf_cdf(plan.keys, workload.ZIPF_S)
    assert ordered[0] / COUNT == pytest.approx(cdf[0], abs=0.03)
    assert sum(ordered[:10]) / COUNT == pytest.approx(cdf[9], abs=0.05)
    assert len(counts) > 300  # a long tail: most keys are seen seldom, many at all


def test_the_key_plan_has_each_kind_and_no_key_of_two():
    plan = workload.KeyPlan.draw()
    assert len(plan.near_limit) == round(plan.keys * workload.NEAR_LIMIT_SHARE)
    assert len(plan.signed) == round(plan.keys * workload.SIGNED_SHARE)
    assert not plan.near_limit & plan.signed
    assert len(plan.prepaid_tenants) == round(plan.tenants * workload.PREPAID_SHARE)
    assert {plan.tenant_of(k) for k in range(plan.keys)} == set(range(plan.tenants))


def test_as_chat_keeps_the_sizes_of_other_dialects(requests):
    for request in requests:
        chat = workload.as_chat(request)
        if request.endpoint in ("chat", "embeddings"):
            assert chat is request
            continue
        assert chat.endpoint == "chat" and chat.stream == request.stream
        assert _prompt_bytes(chat) == _prompt_bytes(request)
        assert chat.body["max_tokens"] == (
            request.body.get("max_tokens") or request.body.get("max_output_tokens")
        )


def test_a_signed_request_verifies_with_the_platforms_check_once_per_send():
    from apps.keys.signing import signature_verify

    request = next(r for r in workload.draw(20, model="m", embed_model="e") if r.endpoint == "chat")
    secret = b"dmxsig_test"
    [signed] = workload.wire(
        [request], "127.0.0.1", 8000, {request.key: "sk-test"}, {request.key: secret}
    )
    seen = set()
    for serial in (1, 2):
        raw = signed.render(1_700_000_000, serial)
        head, _, body = raw.partition(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
        assert int(headers["Content-Length"]) == len(body)
        assert headers["Authorization"] == "Bearer sk-test"
        presented = signature_verify(
            secret=secret,
            timestamp=headers["X-DMX-Timestamp"].encode(),
            signature=headers["X-DMX-Signature"].encode(),
            body=body,
            now=1_700_000_000,
        )
        seen.add(presented)
        assert json.loads(body)["user"] == f"signed-{serial}"
    assert len(seen) == 2  # each send is a new signature, never a replay


def test_messages_requests_carry_the_key_as_anthropics_clients_do(requests):
    request = next(r for r in requests if r.endpoint == "messages")
    [raw] = workload.wire([request], "h", 1, {request.key: "sk-x"}, {})
    head = raw.partition(b"\r\n\r\n")[0].decode()
    assert head.startswith("POST /v1/messages HTTP/1.1")
    assert "x-api-key: sk-x" in head and "Authorization" not in head
