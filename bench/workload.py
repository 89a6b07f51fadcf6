"""A realistic workload for the platform benchmark (bench/realistic.py): what many developers'
applications send, drawn from public data rather than made up here.

- **Keys.** KEYS keys in TENANTS tenants; each request's key is drawn Zipf-distributed
  (exponent ZIPF_S) over the keys in a shuffled order, so a few keys are hot and most are
  seldom seen, hot ones in every kind of tenant. Some keys are near their limits (a per-minute
  request limit low enough that admission takes no lease and may refuse some of their requests),
  some require signed requests (HMAC, signed anew for every request by the load generator), and
  a share of tenants is prepaid with a balance and a hard monthly budget, so that their
  requests are checked for money on every request.
- **Sizes.** Prompt and completion lengths are drawn from Azure's LLM inference trace 2023,
  conversation service (tests/routing/traces/README.md: `ContextTokens`, `GeneratedTokens`),
  at BYTES_PER_TOKEN bytes a token, prompts capped at MAX_PROMPT_BYTES and completions at
  MAX_COMPLETION_TOKENS.
- **Text.** Conversations are built from human-written prompts of public collections (Dolly,
  Self-Instruct, Arena-Hard, Gaokao: tools/intent/data/sources, their licences in
  tools/intent/data/README.md): a system prompt, earlier turns (a user's instruction with its
  pasted context, an assistant's answer taken from another record's passage) up to the drawn
  size, and a last user instruction.
- **Endpoints.** ENDPOINT_SHARES of chat completions, Responses, Anthropic's Messages and
  embeddings; STREAM_SHARE of the generating requests are streamed.

Everything is drawn from one seeded generator: the same arguments give the same requests.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import hashlib
import hmac
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AZURE_TRACE = ROOT / "tests" / "routing" / "traces" / "azure_llm_conv_2023.csv.gz"
PROMPT_SOURCES = ROOT / "tools" / "intent" / "data" / "sources"

KEYS = 1_000
TENANTS = 200
ZIPF_S = 1.1
NEAR_LIMIT_SHARE = 0.05  # keys with a per-minute limit they come close to
# Near enough that admission grants them no lease (a lease takes at most a quarter of what is
# left, and none below 4 requests: apps/keys/leases.py), so each of their requests makes the
# admission round trip, and busy ones among them are refused some requests.
NEAR_LIMIT_RPM = 12
SIGNED_SHARE = 0.03  # keys that require signed requests
PREPAID_SHARE = 0.3  # tenants checked for money on every request
BYTES_PER_TOKEN = 4  # English text under a BPE tokenizer, roughly
MAX_PROMPT_BYTES = 8_192
MAX_COMPLETION_TOKENS = 1_024
STREAM_SHARE = 0.3
ENDPOINT_SHARES = {"chat": 0.55, "responses": 0.2, "messages": 0.15, "embeddings": 0.1}
PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "embeddings": "/v1/embeddings",
}


@dataclass(frozen=True)
class KeyPlan:
    """What each key is: by index, the same on the platform's side and the load's."""

    near_limit: frozenset[int]
    signed: frozenset[int]
    prepaid_tenants: frozenset[int]
    keys: int = KEYS
    tenants: int = TENANTS

    @classmethod
    def draw(cls, seed: int = 1, *, keys: int = KEYS, tenants: int = TENANTS) -> KeyPlan:
        rng = random.Random(seed)
        indices = list(range(keys))
        near = rng.sample(indices, round(keys * NEAR_LIMIT_SHARE))
        rest = [i for i in indices if i not in set(near)]
        signed = rng.sample(rest, round(keys * SIGNED_SHARE))
        prepaid = rng.sample(range(tenants), round(tenants * PREPAID_SHARE))
        return cls(frozenset(near), frozenset(signed), frozenset(prepaid), keys, tenants)

    def tenant_of(self, key: int) -> int:
        return key % self.tenants


@dataclass(frozen=True)
class Request:
    endpoint: str  # a PATHS key
    key: int  # index into the key plan
    body: dict
    stream: bool

    @property
    def path(self) -> str:
        return PATHS[self.endpoint]


def trace_lengths(path: Path = AZURE_TRACE) -> list[tuple[int, int]]:
    """(prompt tokens, completion tokens) of every request of the trace."""
    with gzip.open(path, "rt", newline="") as handle:
        return [
            (int(row["ContextTokens"]), int(row["GeneratedTokens"]))
            for row in csv.DictReader(handle)
        ]


def prompt_records(directory: Path = PROMPT_SOURCES) -> list[tuple[str, str]]:
    """(instruction, context) of every human-written record, in a fixed order."""
    records = []
    for path in sorted(directory.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as handle:
            for line in handle:
                row = json.loads(line)
                records.append((row["instruction"].strip(), row.get("context", "").strip()))
    return records


SYSTEM_PROMPTS = (
    "You are a helpful assistant. Answer accurately and concisely.",
    "You are a customer support agent for an online store. Be friendly and precise; never "
    "promise refunds the policy does not allow.",
    "You are a senior software engineer reviewing code. Point out bugs first, then style.",
    "请用中文回答。回答要简洁准确。",
    "You are a tutor. Explain step by step and check the student's understanding.",
)


class Conversations:
    """Chat histories of a given size in bytes, from the human-written records."""

    def __init__(self, rng: random.Random, records: list[tuple[str, str]]) -> None:
        self.rng = rng
        self.records = records
        self.passages = [context for _, context in records if len(context) > 200]

    def _user_turn(self) -> str:
        instruction, context = self.rng.choice(self.records)
        return f"{instruction}\n\n{context}" if context else instruction

    def build(self, size: int) -> tuple[str, list[dict]]:
        """A system prompt and messages (user, assistant, ..., user) of about `size` bytes;
        the last user turn is cut, never the system prompt."""
        system = self.rng.choice(SYSTEM_PROMPTS)
        last = self._user_turn()
        turns: list[dict] = []
        used = len(system.encode()) + len(last.encode())
        while used < size:
            user, answer = self._user_turn(), self.rng.choice(self.passages)
            turns += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": answer},
            ]
            used += len(user.encode()) + len(answer.encode())
        messages = [*turns, {"role": "user", "content": last}]
        _cut_to(messages, size - len(system.encode()))
        return system, messages


def _cut_to(messages: list[dict], size: int) -> None:
    """Shorten the history from its oldest end until the messages hold at most `size` bytes:
    whole earlier turns go while they fit in the excess, then the oldest message left loses
    its beginning (the last message keeps at least 64 bytes)."""
    while (excess := _bytes(messages) - size) > 0:
        oldest = messages[0]["content"].encode()
        if len(messages) > 2 and len(oldest) + len(messages[1]["content"].encode()) <= excess:
            del messages[:2]
            continue
        if len(messages) == 1:
            messages[0]["content"] = oldest[: max(64, len(oldest) - excess)].decode(errors="ignore")
            return
        messages[0]["content"] = oldest[min(excess, len(oldest) - 1) :].decode(errors="ignore")
        if min(excess, len(oldest) - 1) < excess:
            del messages[:2]


def _bytes(messages: list[dict]) -> int:
    return sum(len(m["content"].encode()) for m in messages)


def zipf_cdf(count: int, exponent: float) -> list[float]:
    weights = [1 / rank**exponent for rank in range(1, count + 1)]
    total = sum(weights)
    return list(itertools.accumulate(w / total for w in weights))


def draw(
    count: int,
    *,
    model: str,
    embed_model: str,
    seed: int = 1,
    plan: KeyPlan | None = None,
) -> list[Request]:
    """`count` requests of the workload, in arrival order."""
    plan = plan or KeyPlan.draw(seed)
    rng = random.Random(seed)
    lengths = trace_lengths()
    conversations = Conversations(rng, prompt_records())
    popularity = list(range(plan.keys))
    rng.shuffle(popularity)  # rank -> key
    cdf = zipf_cdf(plan.keys, ZIPF_S)
    endpoints, shares = zip(*ENDPOINT_SHARES.items(), strict=True)
    requests = []
    for _ in range(count):
        endpoint = rng.choices(endpoints, shares)[0]
        key = popularity[min(bisect.bisect_left(cdf, rng.random()), plan.keys - 1)]
        prompt_tokens, completion_tokens = rng.choice(lengths)
        size = min(prompt_tokens * BYTES_PER_TOKEN, MAX_PROMPT_BYTES)
        tokens = max(1, min(completion_tokens, MAX_COMPLETION_TOKENS))
        stream = endpoint != "embeddings" and rng.random() < STREAM_SHARE
        system, messages = conversations.build(size)
        body = _body(endpoint, model, embed_model, system, messages, tokens, stream)
        requests.append(Request(endpoint, key, body, stream))
    return requests


def _body(endpoint, model, embed_model, system, messages, tokens, stream) -> dict:
    if endpoint == "embeddings":
        return {"model": embed_model, "input": messages[-1]["content"]}
    if endpoint == "messages":
        return {
            "model": model,
            "system": system,
            "messages": messages,
            "max_tokens": tokens,
            "stream": stream,
        }
    if endpoint == "responses":
        return {
            "model": model,
            "instructions": system,
            "input": messages,
            "max_output_tokens": tokens,
            "stream": stream,
        }
    return {
        "model": model,
        "messages": [{"role": "system", "content": system}, *messages],
        "max_tokens": tokens,
        "stream": stream,
    }


def as_chat(request: Request) -> Request:
    """The same request as a chat completion (embeddings stay embeddings): for a yardstick that
    is measured on the chat endpoint only."""
    body = request.body
    if request.endpoint in ("chat", "embeddings"):
        return request
    system = body.get("system") or body.get("instructions")
    tokens = body.get("max_tokens") or body.get("max_output_tokens")
    chat = _body("chat", body["model"], "", system, body.get("messages") or body["input"],
                 tokens, request.stream)  # fmt: skip
    return Request("chat", request.key, chat, request.stream)


def summary(requests: list[Request], plan: KeyPlan) -> dict:
    """What the drawn requests are, for the results: shares, sizes, keys."""
    sizes = sorted(len(encode(r.body)) for r in requests)
    by_key: dict[int, int] = {}
    for r in requests:
        by_key[r.key] = by_key.get(r.key, 0) + 1
    hottest = sorted(by_key.values(), reverse=True)
    count = len(requests)
    return {
        "requests": count,
        "endpoints": {e: sum(r.endpoint == e for r in requests) / count for e in PATHS},
        "streamed": sum(r.stream for r in requests) / count,
        "body_bytes_p50": sizes[count // 2],
        "body_bytes_p90": sizes[int(count * 0.9)],
        "body_bytes_max": sizes[-1],
        "distinct_keys": len(by_key),
        "hottest_key_share": hottest[0] / count,
        "top10_keys_share": sum(hottest[:10]) / count,
        "near_limit_share": sum(r.key in plan.near_limit for r in requests) / count,
        "signed_share": sum(r.key in plan.signed for r in requests) / count,
        "prepaid_share": sum(plan.tenant_of(r.key) in plan.prepaid_tenants for r in requests)
        / count,
    }


# --- on the wire ---------------------------------------------------------------------------


def encode(body: dict) -> bytes:
    """JSON as current clients send it: compact, UTF-8 (OpenAI's Python client through httpx
    0.28)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """X-DMX-Signature's value (apps/keys/signing.py's scheme, written again here so that the
    load generator does not import the code it measures)."""
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Signed:
    """A request to sign as it is sent: each send varies the body (its `user`) and signs it,
    since the gateway refuses a signature it has seen."""

    head: bytes  # the request line and headers but Content-Length and the signature's
    body: dict
    secret: bytes

    def render(self, now: int, serial: int) -> bytes:
        caller = f"signed-{serial}"
        # Anthropic's Messages names the end user in metadata; OpenAI's APIs in `user`.
        varied = {"metadata": {"user_id": caller}} if "system" in self.body else {"user": caller}
        raw = encode({**self.body, **varied})
        stamp = str(now)
        signed = (
            f"Content-Length: {len(raw)}\r\nX-DMX-Timestamp: {stamp}\r\n"
            f"X-DMX-Signature: {sign(self.secret, stamp, raw)}\r\n\r\n"
        )
        return self.head + signed.encode() + raw


def wire(requests: list[Request], host: str, port: int, keys, secrets: dict[int, bytes]) -> list:
    """The requests as the load generator sends them: bytes, or Signed for a signing key's.
    `keys[i]` is key i's secret (a list or a mapping), `secrets[i]` its signing secret."""
    out = []
    for request in requests:
        secret = keys[request.key]
        # Anthropic's clients send the key as x-api-key; the others as a bearer token.
        auth = (
            f"x-api-key: {secret}"
            if request.endpoint == "messages"
            else (f"Authorization: Bearer {secret}")
        )
        head = (
            f"POST {request.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\n{auth}\r\n"
        ).encode()
        if request.key in secrets:
            out.append(Signed(head, request.body, secrets[request.key]))
            continue
        raw = encode(request.body)
        out.append(head + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
    return out
