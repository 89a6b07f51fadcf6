"""The intent classifier's offline tool chain: its data, the accuracy it measures, its commands."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from apps.gateway.intent import LABELS, load
from apps.gateway.intent.model import IntentModel
from tests.stack import ROOT
from tools.intent import real
from tools.intent.augment import augment
from tools.intent.calibrate import calibration
from tools.intent.dataset import (
    DATA_DIR,
    HELDOUT_FILE,
    NATURAL_FILE,
    REAL_DEV_FILE,
    REAL_TEST_FILE,
    REAL_TRAIN_FILE,
    REALISTIC_FILE,
    TRAIN_FILE,
    load_examples,
)
from tools.intent.evaluate import evaluate
from tools.intent.generate import generate
from tools.intent.labelling import OVERRIDES, Ask
from tools.intent.labelling import label as label_of
from tools.intent.realistic import build
from tools.intent.train import data_digest, train

# Floors set from the shipped model's measurements (python -m tools.intent report), with room for a
# retrain on changed data but not for a real regression. Since issue 34 the model also trains on
# real prompts (data/real_train.jsonl.gz), which moved the team's own sets: held-out 0.848 ->
# 0.806 (weakest label comparison 0.617; en 0.766, zh 0.852, mixed 0.781), natural 0.902 ->
# 0.815 (weakest label summarization 0.565: 23 prompts a label, one prompt moves it by 0.043),
# realistic 0.968 -> 0.938 (weakest 0.905; en 0.923). The real prompts' own figures are below.
HELDOUT_OVERALL_FLOOR = 0.78
HELDOUT_LABEL_FLOOR = 0.60
HELDOUT_LANG_FLOOR = 0.75
NATURAL_OVERALL_FLOOR = 0.77
NATURAL_LABEL_FLOOR = 0.30
# The realistic set (data/realistic.jsonl: pasted material, boilerplate, conversations), issue
# 19; 63 prompts a label, so one prompt moves a label by 0.016.
REALISTIC_OVERALL_FLOOR = 0.92
REALISTIC_LABEL_FLOOR = 0.85
REALISTIC_LANG_FLOOR = 0.90
# Measured ECE 0.056 on the realistic set with the temperature (1.25) fitted on the real dev
# split. A confidence that means nothing lands far above.
REALISTIC_ECE_CEILING = 0.10
# The real prompts' dev split (data/README.md), as reported in README.md and the docs: the
# shipped artifact must reach it. 1,224 rows, so 0.01 is about 12 prompts: room for a float's
# rounding on another machine, not for another model.
REAL_DEV_REPORTED = 0.707
REAL_DEV_TOLERANCE = 0.01
# The locked test split: its rows (gunzipped) hash to this. A change to the sources, the labels
# or the wrapping rewrites it, and must then say so here, in a commit of its own.
REAL_TEST_SHA256 = "da2a75113607f89163dbcc71f2b6a5340e67dd3ad4549fa9cb2519e1f22d93fd"


@pytest.fixture(scope="module")
def model() -> IntentModel:
    return load()


FLOORS = {  # overall, every label, every language
    HELDOUT_FILE: (HELDOUT_OVERALL_FLOOR, HELDOUT_LABEL_FLOOR, HELDOUT_LANG_FLOOR),
    NATURAL_FILE: (NATURAL_OVERALL_FLOOR, NATURAL_LABEL_FLOOR, 0.0),
    REALISTIC_FILE: (REALISTIC_OVERALL_FLOOR, REALISTIC_LABEL_FLOOR, REALISTIC_LANG_FLOOR),
}


@pytest.mark.parametrize("name", list(FLOORS))
def test_accuracy_on_sets_never_trained_on(model, name):
    overall, per_label, per_lang = FLOORS[name]
    result = evaluate(model, load_examples(name))
    assert result.overall >= overall
    for label in LABELS:
        assert result.accuracy(label) >= per_label, label
    for lang in ("en", "zh", "mixed"):
        if result.lang_total[lang]:
            assert result.lang_accuracy(lang) >= per_lang, lang


def test_confidence_is_calibrated_on_the_realistic_set(model):
    assert calibration(model, load_examples(REALISTIC_FILE)).ece <= REALISTIC_ECE_CEILING


def test_realistic_set_is_what_its_builder_writes_and_is_never_trained_on():
    examples = load_examples(REALISTIC_FILE)
    assert [e.as_row() | {"messages": list(e.messages)} for e in examples] == [
        {key: row[key] for key in ("text", "label", "lang")} | {"messages": row.get("messages", [])}
        for row in build()
    ]
    counts = Counter((e.label, e.lang) for e in examples)
    assert all(counts[label, lang] >= 20 for label in LABELS for lang in ("en", "zh", "mixed"))
    training = {e.text for e in augment(load_examples(TRAIN_FILE), 1729)}
    assert not training & {e.prompt for e in examples}


def test_augmentation_is_deterministic_and_keeps_the_originals():
    sample = load_examples(TRAIN_FILE)[::50]
    first, second = augment(sample, 3), augment(sample, 3)
    assert first == second
    assert first[: len(sample)] == sample
    assert len(first) > len(sample)


def test_heldout_split_shares_no_phrasing_family_or_prompt_with_training():
    training, heldout = load_examples(TRAIN_FILE), load_examples(HELDOUT_FILE)
    natural = load_examples(NATURAL_FILE)
    assert not {e.family for e in training} & {e.family for e in heldout}
    assert all(e.family for e in training + heldout)
    texts = [e.text for e in training + heldout + natural]
    assert len(set(texts)) == len(texts)
    assert {e.label for e in heldout} == set(LABELS)


def test_data_set_size_and_balance():
    examples = load_examples(TRAIN_FILE) + load_examples(HELDOUT_FILE)
    assert 3_000 <= len(examples) <= 6_000
    counts = Counter((e.label, e.lang) for e in examples)
    for label in LABELS:
        assert counts[label, "en"] >= 250, label
        assert counts[label, "zh"] >= 250, label
        assert counts[label, "mixed"] >= 40, label
    natural = Counter((e.label, e.lang) for e in load_examples(NATURAL_FILE))
    for label in LABELS:
        assert natural[label, "en"] >= 10 and natural[label, "zh"] >= 10, label


def test_shipped_data_is_what_the_generator_writes():
    rows = generate()
    for side, name in (("train", TRAIN_FILE), ("heldout", HELDOUT_FILE)):
        assert rows[side] == load_examples(name), name


def test_training_is_deterministic():
    sample = load_examples(TRAIN_FILE)[::6]
    probe = [e.text for e in load_examples(HELDOUT_FILE)[::25]]
    first = train(sample, seed=7, epochs=2)
    second = train(sample, seed=7, epochs=2)
    other_seed = train(sample, seed=8, epochs=2)
    np.testing.assert_array_equal(first.weights, second.weights)
    np.testing.assert_array_equal(first.bias, second.bias)
    assert [first.classify(t) for t in probe] == [second.classify(t) for t in probe]
    assert not np.array_equal(first.weights, other_seed.weights)


def _tool(*arguments: str) -> str:
    """`python -m tools.intent ...` as a developer runs it: its own process, no Django."""
    done = subprocess.run(
        [sys.executable, "-m", "tools.intent", *arguments],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_intent_train_reproduces_the_shipped_artifact(tmp_path, model):
    output = tmp_path / "intent.npz"
    trained = _tool("train", "--output", str(output))
    assert "real dev accuracy" in trained
    retrained = IntentModel.load(output)
    assert retrained.provenance == model.provenance
    assert retrained.temperature == model.temperature
    assert model.provenance.data_sha256 == data_digest()
    probe = [e.text for e in load_examples(HELDOUT_FILE)[::7]]
    assert [retrained.classify(t).label for t in probe] == [model.classify(t).label for t in probe]


def test_intent_report_command(model):
    report = json.loads(_tool("report", "--json"))
    assert report["artifact"]["stale"] is False
    assert report["calibration"]["ece"] <= REALISTIC_ECE_CEILING
    splits = (
        ("real_dev", REAL_DEV_FILE),
        ("real_test", REAL_TEST_FILE),
        ("heldout", HELDOUT_FILE),
        ("natural", NATURAL_FILE),
        ("realistic", REALISTIC_FILE),
    )
    for name, split in splits:
        section = report[name]
        expected = evaluate(model, load_examples(split))
        assert section["examples"] == expected.total
        assert section["overall"] == pytest.approx(expected.overall, abs=1e-4)
        assert list(section["labels"]) == list(LABELS)
        confusion = np.array(section["confusion"]["rows_true_columns_predicted"])
        assert confusion.shape == (len(LABELS), len(LABELS))
        assert confusion.sum() == expected.total

    rendered = _tool("report")
    assert "Held-out split" in rendered and "Natural set" in rendered
    assert "dev split" in rendered and "locked test split" in rendered
    assert "| en |" in rendered and "| zh |" in rendered
    assert "Confusion matrix" in rendered and "Realistic set" in rendered
    assert "ECE" in rendered
    assert all(f"| {label} |" in rendered for label in LABELS)


def test_data_files_live_in_the_package():
    assert DATA_DIR.is_dir()
    assert {path.name for path in DATA_DIR.glob("*.jsonl*")} == {
        TRAIN_FILE,
        HELDOUT_FILE,
        NATURAL_FILE,
        REALISTIC_FILE,
        REAL_TRAIN_FILE,
        REAL_DEV_FILE,
        REAL_TEST_FILE,
    }
    assert {path.name for path in (DATA_DIR / "sources").iterdir()} == {
        f"{name}.jsonl.gz" for name in real.SOURCE_LANGS
    }


def _rows(name):
    return gzip.decompress((DATA_DIR / name).read_bytes())


def test_real_splits_are_what_their_builder_writes():
    splits = real.build()
    assert splits == real.build()
    for split, name in real.SPLIT_FILES.items():
        assert real.serialise(splits[split]) == _rows(name), name


def test_real_splits_are_disjoint_by_prompt_and_self_instruct_is_never_trained_on():
    splits = real.build()
    asks = {split: {(row["source"], row["id"]) for row in rows} for split, rows in splits.items()}
    assert not asks["train"] & asks["dev"]
    assert not asks["train"] & asks["test"]
    assert not asks["dev"] & asks["test"]
    by_key = {(ask.source, ask.id): ask for ask in real.asks()}
    texts = {split: {real.prompt_text(by_key[key]) for key in keys} for split, keys in asks.items()}
    # Also two sources' copies of one prompt land together: the split hashes the text.
    assert not texts["train"] & texts["dev"] and not texts["train"] & texts["test"]
    assert not texts["dev"] & texts["test"]
    assert not any(source == "self_instruct" for source, _ in asks["train"])
    # Both copies of an ask (as written and wrapped) are in its split.
    for rows in splits.values():
        counts = Counter((row["source"], row["id"]) for row in rows)
        assert set(counts.values()) == {2}
    kinds = Counter(row["kind"] for rows in splits.values() for row in rows)
    assert {"plain", "boilerplate", "system", "conversation"} <= set(kinds)
    for split in ("train", "dev", "test"):
        langs = {row["lang"] for row in splits[split]}
        assert langs == {"en", "zh"}, split


def test_locked_test_split_is_pinned():
    assert hashlib.sha256(_rows(REAL_TEST_FILE)).hexdigest() == REAL_TEST_SHA256


def test_shipped_artifact_reaches_the_reported_dev_accuracy(model):
    result = evaluate(model, load_examples(REAL_DEV_FILE))
    assert result.overall >= REAL_DEV_REPORTED - REAL_DEV_TOLERANCE
    # And the split is not a trivial one: every label and both languages are in it.
    assert all(result.support(label) for label in LABELS)
    assert result.lang_total["en"] and result.lang_total["zh"]


def test_training_never_reads_the_dev_or_test_split():
    training = {e.text for e in load_examples(REAL_TRAIN_FILE)}
    held = load_examples(REAL_DEV_FILE) + load_examples(REAL_TEST_FILE)
    assert not training & {e.text for e in held}


def _ask(text, context="", source="guide", category=""):
    return Ask(
        source=source, id="case", instruction=text, context=context, lang="en", category=category
    )


CODE = "def add(a, b):\n    total = a + b\n    return total\n\nprint(add(1, 2))\n"
ARTICLE = (
    "The council voted on Tuesday to extend the tram line to the airport, a project first "
    "proposed in 2009. Work starts next spring and is due to finish in three years, at a cost "
    "the council puts at 240 million."
)


@pytest.mark.parametrize(
    ("text", "context", "expected", "case"),
    [
        ("Explain what a RESTful API is.", "", "explanation", 1),
        ("what is a RESTful API?", "", "chat", 4),
        ("How can I set a seed for Python's random module in threads?", "", "code", 1),
        ("Translate this Python function into Go:", CODE, "code", 2),
        ("请把下面这句话翻译成英文：今天天气很好。", "", "translation", 2),
        ("I bought two shirts at $10 each and pants for $25. How much did I spend?", "", "math", 3),
        ("小明有6颗糖，分给3个朋友每人1颗，他还剩几颗糖？", "", "math", 3),
        ("How many moons does Jupiter have?", "", "chat", 3),
        ("Write a LinkedIn profile summary for a data engineer.", "", "creative", 6),
        ("Summarize this article in one sentence.", ARTICLE, "summarization", 6),
        ("Python vs Go for a small command-line tool?", "", "comparison", 7),
        ("Which is a species of fish? Tope or Rope", "", "chat", 7),
        ("今天比较冷，穿什么衣服好？", "", "chat", 7),
        ("比较一下苹果和安卓手机", "", "comparison", 7),
        ("Act as a senior engineer and review my SQL: SELECT * FROM users", "", "code", 9),
        ("Give me five tips to sleep better.", "", "chat", 5),
        ("Rewrite this email so it sounds more professional.", "hey, need it asap", "creative", 5),
        ("Describe how to make mapo tofu.", "", "explanation", 5),
    ],
)
def test_labelling_guide_borderline_cases(text, context, expected, case):
    """The borderline cases of tools/intent/LABELLING.md, as the labelling applies them."""
    assert label_of(_ask(text, context))[0] == expected, case


def test_labelling_seeds_yield_to_rules_and_trusted_categories_do_not():
    # Dolly's "closed_qa" seeds chat, but a translation ask is translation by rule 2.
    assert label_of(_ask("Translate the passage into French.", ARTICLE, "dolly", "closed_qa")) == (
        "translation",
        "translation",
    )
    assert label_of(_ask("Who founded the company?", ARTICLE, "dolly", "closed_qa")) == (
        "chat",
        "seed:closed_qa",
    )
    # GAOKAO's mathematics papers hold mathematics, whatever a question's words: theirs decides.
    assert label_of(_ask("请解释这道题", "", "gaokao", "math"))[0] == "math"


def test_overrides_decide_and_give_a_reason():
    assert OVERRIDES
    by_key = {(ask.source, ask.id): ask for ask in real.asks()}
    for key, (decided, reason) in OVERRIDES.items():
        assert key in by_key, key
        assert decided in LABELS and reason
        assert label_of(by_key[key]) == (decided, "override")
