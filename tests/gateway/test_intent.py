"""The intent classifier at run time: labels, features, the artifact, classify and its command.

Its data, accuracy and training: tests/tools/test_intent.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import subprocess
import sys
import zlib
from collections import Counter
from io import StringIO
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from django.core.management import call_command

from apps.billing.ledger import UsageEvent
from apps.gateway.intent import (
    LABELS,
    ArtifactError,
    Intent,
    Prediction,
    classify,
    last_user_turn,
    load,
    user_request,
)
from apps.gateway.intent.features import HEAD_CHARS, TAIL_CHARS, features, normalise
from apps.gateway.intent.model import ARTIFACT_PATH, IntentModel
from apps.gateway.intent.reading import (
    EARLIER_TURN_CHARS,
    EARLIER_TURNS_MAX,
    QUANTITY_MARK,
    TEXT_MARK,
)
from apps.gateway.pipeline import prepare
from apps.gateway.prompts import intent_text
from apps.gateway.schemas import Endpoint, validate_completion
from apps.gateway.settlement import usage_event
from apps.gateway.state import CompletionState
from apps.routing.decisions import DECISION_STREAM, DecisionEvent
from apps.routing.dispatcher import Dispatch
from apps.routing.router import Decision
from dmxplatform import metrics
from dmxplatform.errors import NotFoundError

ARTIFACT_LIMIT_BYTES = 20 * 1024 * 1024

CLEAR = {
    "code": [
        "Write a Python function that returns the nth prime number.",
        "Fix this JavaScript:\nconst x = [1, 2, 3].map(n => n * 2\nconsole.log(x)",
        "用 Java 写一个线程安全的单例模式",
        "这段 Python 代码报错了，怎么改：\nprint(len(5))",
    ],
    "explanation": [
        "Explain how photosynthesis works.",
        "What is a black hole and how does it form?",
        "请解释一下什么是通货膨胀",
        "为什么天空是蓝色的？",
    ],
    "summarization": [
        "Summarize the following article in two sentences:\n\nThe city opened a new public "
        "library on Monday. The building has three floors, a children's wing and a café. "
        "Officials expect 2,000 visitors a day. Construction took four years and cost $40 million.",
        "TL;DR: Our quarterly sales grew 12%, mostly from online orders, while store traffic fell "
        "for the third quarter in a row. We will close two stores and invest in delivery.",
        "请总结下面这段话：今天公司召开了年度大会，总经理回顾了过去一年的业绩，销售额同比增长"
        "百分之二十。会上还宣布了明年的三项重点工作：开拓海外市场、加强研发投入、提升客户服务质量。",
        "帮我概括这篇文章的要点：近年来，越来越多的城市开始建设共享单车停放区。专家认为，这有助于"
        "缓解乱停乱放的问题，但也需要配套的管理措施和市民的配合。",
    ],
    "comparison": [
        "Compare Python and JavaScript for backend development.",
        "What are the pros and cons of renting versus buying a home?",
        "iPhone 和安卓手机有什么区别？",
        "对比一下 MySQL 和 MongoDB 的优缺点",
    ],
    "creative": [
        "Write a poem about the moon.",
        "Write a short story about a robot who learns to paint.",
        "写一首关于秋天的诗",
        "帮我给咖啡店想一句广告语",
    ],
    "translation": [
        "Translate 'good morning, how are you?' into French.",
        "Translate this into English: 我明天要去北京出差。",
        "把这句话翻译成英文：我很喜欢这本书。",
        "“thank you very much”用日语怎么说？",
    ],
    "math": [
        "What is 37 * 48?",
        "Solve 5x - 3 = 17.",
        "计算 125 × 8 等于多少",
        "解方程 x^2 - 5x + 6 = 0",
    ],
    "chat": [
        "Hi there! How are you today?",
        "I can't log into my account, can you help?",
        "你好呀，今天过得怎么样？",
        "我想取消订单，怎么操作？",
    ],
}

# About 4 KB of neutral prose: the instruction before or after it decides the intent.
REPORT = (
    "The committee reviewed the annual budget, the hiring plan and the new office lease. "
    "Several members asked for more detail on travel costs, which rose sharply this year. "
) * 25


@pytest.fixture(scope="module")
def model() -> IntentModel:
    return load()


def test_labels_are_exactly_the_eight():
    assert LABELS == (
        "code",
        "explanation",
        "summarization",
        "comparison",
        "creative",
        "translation",
        "math",
        "chat",
    )
    assert tuple(Intent) == LABELS


@pytest.mark.parametrize(
    "text",
    ["", " ", "hi", "🙂🙂🙂", "ＨＥＬＬＯ", "a" * 20_000, "代码" * 3_000, "\x00\n\t"],
)
def test_classify_returns_a_label_and_a_probability(text):
    prediction = classify(text)
    assert isinstance(prediction, Prediction)
    assert isinstance(prediction.label, str)
    assert prediction.label in LABELS
    assert 0.0 <= prediction.confidence <= 1.0


def test_confidence_is_the_softmax_probability_of_the_label(model):
    text = "Compare Redis and Memcached for session storage."
    probabilities = np.array(model.probabilities(text))
    prediction = model.classify(text)
    assert probabilities.shape == (len(LABELS),)
    assert probabilities.sum() == pytest.approx(1.0, abs=1e-5)
    assert prediction.confidence == pytest.approx(float(probabilities.max()))
    assert prediction.label == LABELS[int(probabilities.argmax())]
    # The logits are the features' weighted sum of weight rows, plus the bias.
    ids, values = features(text)
    expected = values @ model.weights[ids] + model.bias
    np.testing.assert_allclose(model.logits(text), expected, rtol=1e-5, atol=1e-6)


def _reference_buckets(text: str) -> Counter:
    """The feature spec of features.py, written out in plain Python: what the compiled hashing
    must reproduce bucket for bucket."""
    mask, bits = (1 << 64) - 1, 17
    text = normalise(text)

    def seed(kind: str) -> int:
        return zlib.crc32(kind.encode()) << 32

    def bucket(value: int, kind: str) -> int:
        return (((value + seed(kind)) & mask) * 0x9E3779B97F4A7C15 & mask) >> (64 - bits)

    points = [2, *map(ord, text), 3]
    size, found = len(points), Counter()
    for n in range(1, 4):
        for i in range(size - n + 1):
            value = 0
            for point in points[i : i + n]:
                value = (value * 0x100000001B3 + point) & mask
            found[bucket(value, f"char{n}")] += 1
            if i < min(size, 100) - n + 1:
                found[bucket(value, f"head{n}")] += 1
            if i >= size - 100:
                found[bucket(value, f"tail{n}")] += 1
    words = [zlib.crc32(word.encode()) for word in re.findall(r"[0-9a-z\u00df-\u024f]+", text)]
    for word in words:
        found[bucket(word, "word")] += 1
    for first, second in itertools.pairwise(words):
        found[bucket((first * 0x100000001B3 + second) & mask, "bigram")] += 1
    return found


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Write a haiku about the sea.",
        "帮我 review 一下这段 code: def f(x): return x",
        "Straße über Ǆ naïve café, 𝔘nicode and 😀",
        "Summarise:\n" + "word " * 400 + "\nin one line",
    ],
)
def test_compiled_features_follow_the_spec(text):
    counts = _reference_buckets(text)
    ids, values = features(text)
    assert ids.tolist() == sorted(counts)
    weights = np.array([1 + math.log(counts[i]) for i in sorted(counts)], dtype=np.float64)
    expected = weights / np.sqrt(weights @ weights) if len(weights) else weights
    np.testing.assert_allclose(values, expected, rtol=1e-5)


# Clear prompts the shipped model gets wrong, each with why; strict, so that one it gets right
# again fails here until its line goes. Since issue 34 the model also learns from real prompts,
# where a named programming language nearly always means a code task, and real comparisons are
# few (26 asks): a comparison of two languages "for backend development" now reads as code
# (0.8). The labelling guide (tools/intent/LABELLING.md, borderline case 1) says comparison.
KNOWN_MISSES = {
    "Compare Python and JavaScript for backend development.": (
        "issue 34: real prompts taught that language names mean code; too few real comparisons"
    ),
}


@pytest.mark.parametrize(
    ("label", "text"),
    [
        pytest.param(
            label,
            text,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[text])]
            if text in KNOWN_MISSES
            else [],
        )
        for label, texts in CLEAR.items()
        for text in texts
    ],
)
def test_clear_prompts_classify_correctly(label, text):
    assert classify(text).label == label


@pytest.mark.parametrize(
    ("text", "label"),
    [
        (REPORT + "\n\nTranslate the above into German.", "translation"),
        (REPORT + "\n\nSummarize the above in three bullet points.", "summarization"),
        ("Translate into French:\n" + REPORT, "translation"),
        ("Summarize this:\n" + REPORT, "summarization"),
    ],
)
def test_long_prompts_are_read_at_both_ends(text, label):
    assert len(text) > HEAD_CHARS + TAIL_CHARS
    assert classify(text).label == label


def test_the_middle_of_a_long_prompt_is_not_read():
    text = "Translate into French:\n" + REPORT + "\n\nThanks!"
    padded = text[:HEAD_CHARS] + ("filler " * 2_000) + text[-TAIL_CHARS:]
    ids, values = features(text)
    padded_ids, padded_values = features(padded)
    np.testing.assert_array_equal(ids, padded_ids)
    np.testing.assert_array_equal(values, padded_values)


def test_full_width_and_case_variants_have_the_same_features():
    ids, values = features("ＷＲＩＴＥ Ａ ＰＯＥＭ，ＰＬＥＡＳＥ！")
    plain_ids, plain_values = features("write a poem,please!")
    np.testing.assert_array_equal(ids, plain_ids)
    np.testing.assert_array_equal(values, plain_values)


def test_features_hash_the_same_in_another_process():
    text = "帮我 review 一下这段 code: def f(x): return x"
    ids, _ = features(text)
    script = (
        "import sys; from apps.gateway.intent.features import features; "
        "print(','.join(map(str, features(sys.argv[1])[0])))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", script, text], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert [int(part) for part in out.strip().split(",")] == ids.tolist()


def test_load_reads_the_artifact_once():
    assert load() is load()


def test_classify_runs_inside_an_event_loop():
    async def classify_on_loop() -> Prediction:
        return classify("write a haiku about autumn")

    assert asyncio.run(classify_on_loop()).label == "creative"


def test_artifact_is_small_and_self_describing():
    assert ARTIFACT_PATH.stat().st_size < ARTIFACT_LIMIT_BYTES
    with np.load(ARTIFACT_PATH, allow_pickle=False) as archive:
        assert tuple(archive["labels"].tolist()) == LABELS
        assert int(archive["version"]) >= 1
        assert archive["weights"].dtype == np.float16


def test_load_refuses_an_artifact_for_other_labels(tmp_path, model):
    path = tmp_path / "other.npz"
    model.save(path)
    with np.load(path) as archive:
        fields = dict(archive)
    fields["labels"] = np.array(list(reversed(LABELS)))
    np.savez_compressed(path, **fields)
    with pytest.raises(ArtifactError):
        IntentModel.load(path)
    with pytest.raises(ArtifactError):
        IntentModel.load(tmp_path / "missing.npz")


def test_classify_intent_command_prints_json():
    out = StringIO()
    call_command("classify_intent", "把这句话翻译成英文：明天见", stdout=out)
    result = json.loads(out.getvalue())
    assert set(result) == {"label", "confidence"}
    assert result["label"] == "translation"
    assert 0.0 < result["confidence"] <= 1.0


# Issue 19: the label is the user's task, not the topic of what is pasted with it or the app's
# boilerplate in front of it. Before the instruction reading (reading.py) the summaries of
# pasted code were labelled "code" (at 0.97-1.0), the poem's translation held at 0.51, and the
# boilerplate was read as part of the prompt.
PASTED_CODE = (
    "```python\nimport csv\n\ndef totals(path):\n    sums = {}\n    with open(path) as f:\n"
    "        for row in csv.DictReader(f):\n"
    "            sums[row['region']] = sums.get(row['region'], 0) + float(row['amount'])\n"
    "    return sums\n```"
)
PASTED_JS = (
    "```js\nfunction debounce(fn, ms) {\n  let t;\n  return (...args) => {\n"
    "    clearTimeout(t);\n    t = setTimeout(() => fn(...args), ms);\n  };\n}\n```"
)
POEM = (
    "> Shall I compare thee to a summer's day?\n> Thou art more lovely and more temperate:\n"
    "> Rough winds do shake the darling buds of May,\n"
    "> And summer's lease hath all too short a date."
)


@pytest.mark.parametrize(
    ("text", "label"),
    [
        (f"Summarize what this code does in two sentences:\n{PASTED_CODE}", "summarization"),
        (f"请总结一下这段代码做了什么：\n{PASTED_JS}", "summarization"),
        (f"Translate this poem into French:\n{POEM}", "translation"),
        (f"{PASTED_CODE}\n\nsummarise the above for the changelog, one line", "summarization"),
    ],
)
def test_pasted_material_of_another_topic_does_not_decide(text, label):
    assert classify(text).label == label


# A word problem told as a story: before the story problems in the training augmentation
# (tools/intent/stories.py) and reading.py's marker for material holding quantities, the short
# story read as comparison (0.43, math 0.41) and a long one as its bare question ("how much
# money does she have left?": comparison or chat). Written apart from the training stories.
MUFFINS = (
    "At the bakery sale on Sunday, Rosa baked 96 muffins before sunrise. Her neighbours bought 35 "
    "of them in the first hour, and a school ordered 4 trays of 8 muffins for its staff room. "
    "Around noon her uncle dropped by and took 6 for the family lunch."
)


@pytest.mark.parametrize(
    ("text", "label"),
    [
        (
            "Tom had 48 stickers. He gave a quarter of them to his sister, then bought 3 packs of "
            "6 stickers each, and lost 5 on the bus home.\n\nHow many stickers does Tom have now?",
            "math",
        ),
        (f"{MUFFINS}\n\nHow many muffins were still unsold at the end?", "math"),
        (
            "学校组织春游，一共来了3个班，每班42人，中途有15人先回学校了，下午又有8位家长来接孩子。"
            "\n\n现在还剩多少人？",
            "math",
        ),
        # The same story as material for another task is not a problem to solve.
        (f"Translate this into French:\n\n{MUFFINS}", "translation"),
        (f"{MUFFINS}\n\nWrite a short poem about this.", "creative"),
    ],
)
def test_a_word_problem_told_as_a_story_stays_math(text, label):
    assert classify(text).label == label


def test_material_holding_quantities_keeps_that_signal_only():
    asked = "How many muffins were still unsold at the end?"
    read = normalise(f"{MUFFINS}\n\n{asked}")
    assert read == normalise(f"{QUANTITY_MARK}\n{asked}")
    assert normalise(f"{REPORT}\n\n{asked}") == normalise(f"{TEXT_MARK}\n{asked}")


@pytest.mark.parametrize(
    "boilerplate",
    [
        "You are a helpful assistant.",
        "You are an expert software engineer. Answer concisely.",
        "System: You are a coding assistant for a Python team.",
        "请用中文回答。",
        "你是一名资深Python工程师，请用中文回答。",
    ],
)
@pytest.mark.parametrize(
    "ask",
    ["write a haiku about the first snow", "为什么天空是蓝色的？", "hey, how was your weekend?"],
)
def test_boilerplate_prefixes_are_not_read(boilerplate, ask):
    ids, values = features(f"{boilerplate}\n\n{ask}")
    plain_ids, plain_values = features(ask)
    np.testing.assert_array_equal(ids, plain_ids)
    np.testing.assert_array_equal(values, plain_values)


def test_a_conversation_is_labelled_by_its_last_user_turn():
    messages = [
        {"role": "system", "content": "You are a translator. Translate what the user writes."},
        {"role": "user", "content": "write me a short poem about autumn leaves"},
        {"role": "assistant", "content": "Golden leaves drift down..."},
        {"role": "user", "content": "解方程：2x² - 8x + 6 = 0"},
    ]
    assert classify(last_user_turn(messages)).label == "math"
    content_parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    request = validate_completion(Endpoint.CHAT, {"model": "any", "messages": content_parts})
    assert intent_text(request) == "解方程：2x² - 8x + 6 = 0"


def _chat(*turns: str) -> list[dict[str, str]]:
    """Return a conversation: a system message, then user and assistant turns alternating."""
    roles = itertools.cycle(("user", "assistant"))
    system = {"role": "system", "content": "You are a helpful assistant."}
    return [system, *({"role": next(roles), "content": turn} for turn in turns)]


def _classified_as_sent(messages: list[dict[str, str]]) -> str:
    """Return the label of a chat request the way the gateway reads it (content as parts)."""
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    request = validate_completion(Endpoint.CHAT, {"model": "any", "messages": parts})
    return classify(intent_text(request)).label


# Alone, each of these last turns reads as something else (chat, explanation, summarization).
@pytest.mark.parametrize(
    ("earlier", "last", "label"),
    [
        ("Write a limerick about a cat who loves boxes", "继续", "creative"),
        ("Compare Python and Go for backend work", "what about Rust?", "comparison"),
        ("解方程 x^2-5x+6=0", "再来一道", "math"),
        ("把这句话翻译成英文：我明天要去北京出差。", "那日语呢？", "translation"),
        (
            "Translate into German:\n\n" + REPORT[:400],
            "do the same for this: The council voted to extend the tram line by four stops, at "
            "a cost of 120 million euros, with work starting in spring.",
            "translation",
        ),
    ],
)
def test_a_last_turn_that_only_refers_back_takes_the_earlier_task(earlier, last, label):
    assert classify(last).label != label
    assert _classified_as_sent(_chat(earlier, "(an answer)", last)) == label


@pytest.mark.parametrize(
    ("earlier", "last", "label"),
    [
        (
            "Translate into French: the meeting is moved to Friday.",
            "write a haiku about snow",
            "creative",
        ),
        ("Write a limerick about a cat who loves boxes", "解方程：2x² - 8x + 6 = 0", "math"),
        ("Compare Python and Go for backend work", "thanks!", "chat"),
    ],
)
def test_a_last_turn_that_states_a_task_decides_alone(earlier, last, label):
    messages = _chat(earlier, "(an answer)", last)
    assert user_request(messages) == last
    assert _classified_as_sent(messages) == label


def test_earlier_turns_are_read_bounded():
    earlier = "Translate into French: " + "word " * 200_000
    read = user_request(_chat(earlier, "(an answer)", "and in Chinese?"))
    assert len(read) <= EARLIER_TURN_CHARS + len("\n\nand in Chinese?") + 1
    assert read.startswith("Translate into French: ") and read.endswith("and in Chinese?")
    # Turns that refer back in turn are followed a fixed number of turns back, no further.
    turns = ["write a poem about rain", *(["(an answer)", "继续"] * (EARLIER_TURNS_MAX + 3))]
    assert user_request(_chat(*turns)).split("\n\n") == ["继续"] * (EARLIER_TURNS_MAX + 1)


class _Resolved(Exception):
    """Stops prepare() at the routing call, carrying the intent it routed by."""


def _routed(text: str, *, default_route: bool = True) -> tuple[CompletionState, str]:
    """Return the request's state as prepare() left it at the routing call, and the intent it
    routed by."""

    def resolve(name, *, intent, request_id, allows):
        if intent == "" and not default_route:
            raise NotFoundError("no default route")
        raise _Resolved(intent)

    runtime = SimpleNamespace(dispatcher=SimpleNamespace(resolve=resolve))
    key = SimpleNamespace(allows=lambda name: True, id=1, tenant_id=1, prepaid=False)
    state = CompletionState(Endpoint.CHAT, {}, None, None, key=key)
    body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    with pytest.raises(_Resolved) as routed:
        prepare(state, runtime, body)
    return state, routed.value.args[0]


def _routed_intent(text: str, *, default_route: bool = True) -> str:
    return _routed(text, default_route=default_route)[1]


def _intents_counted(confidence: str) -> float:
    labels = {"intent": "code", "confidence": confidence}
    # The counter's own samples: the global registry also runs collectors that read the database.
    samples = [sample for family in metrics.gateway_intents.collect() for sample in family.samples]
    matching = [s.value for s in samples if s.name.endswith("_total") and s.labels == labels]
    return matching[0] if matching else 0.0


def test_a_low_confidence_label_routes_by_the_alias_default_and_is_counted(settings):
    text = "Write a Python function that reverses a list."
    sure, unsure = _intents_counted("ok"), _intents_counted("low")
    settings.DMX_INTENT_MIN_CONFIDENCE = 0.0
    assert _routed_intent(text) == "code"
    settings.DMX_INTENT_MIN_CONFIDENCE = 1.01  # above any probability: every label is unsure
    assert _routed_intent(text) == ""
    assert (_intents_counted("ok"), _intents_counted("low")) == (sure + 1, unsure + 1)
    assert _routed_intent(text, default_route=False) == "code"  # an alias without a default


def test_the_confidence_and_the_low_confidence_route_are_in_the_usage_record_and_decision_log(
    settings,
):
    text = "Write a Python function that reverses a list."
    confidence = classify(text).confidence
    settings.DMX_INTENT_MIN_CONFIDENCE = 1.01
    unsure, _ = _routed(text)
    settings.DMX_INTENT_MIN_CONFIDENCE = 0.0
    sure, _ = _routed(text)

    for state, low in ((unsure, True), (sure, False)):
        event = usage_event(state, 3, 4)
        assert (event.intent, event.intent_confidence) == ("code", confidence)
        assert event.intent_low_confidence is low
        assert UsageEvent.decode(event.encode()) == event
    # The call the settle stage makes, on a decision that found no node (always logged).
    dispatch = SimpleNamespace(
        decision=Decision(node=None, pool="any", verdicts=[]),
        queue_timed_out=False,
        asked="auto",
        request=SimpleNamespace(model=SimpleNamespace(name="m"), priority=1),
        waited_ms=0.0,
    )
    stream, entry = Dispatch.decision_entry(
        dispatch,
        request_id=unsure.request_id,
        tenant_id=7,
        created_at=unsure.received_at,
        intent=unsure.intent,
        intent_confidence=unsure.intent_confidence,
        intent_low_confidence=unsure.intent_low_confidence,
    )
    logged = DecisionEvent.decode(entry)
    assert stream == DECISION_STREAM.of_tenant(7).key()
    assert (logged.intent, logged.intent_confidence, logged.intent_low_confidence) == (
        "code",
        confidence,
        True,
    )
