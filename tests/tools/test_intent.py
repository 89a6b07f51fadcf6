"""The intent classifier's offline tool chain: its data, the accuracy it measures, its commands."""

from __future__ import annotations

import json
from collections import Counter
from io import StringIO

import numpy as np
import pytest
from django.core.management import call_command

from apps.gateway.intent import LABELS, load
from apps.gateway.intent.model import IntentModel
from tools.intent.dataset import (
    DATA_DIR,
    HELDOUT_FILE,
    NATURAL_FILE,
    TRAIN_FILE,
    load_examples,
)
from tools.intent.evaluate import evaluate
from tools.intent.generate import generate
from tools.intent.train import data_digest, train

# Floors set from the shipped model's measurements (manage.py intent_report), with room for a
# retrain on changed data but not for a real regression. Held-out: 0.862 overall, weakest label
# translation at 0.733 (on three other generator seeds' splits: 0.844-0.884 overall, weakest
# label 0.76 on average). Natural set: 0.929 overall, weakest label 0.783 (23 prompts a label,
# so one prompt moves a label by 0.043). A broken feature or label mix-up lands far below.
HELDOUT_OVERALL_FLOOR = 0.83
HELDOUT_LABEL_FLOOR = 0.70
HELDOUT_LANG_FLOOR = 0.80  # measured: en 0.850, zh 0.881, mixed 0.838
NATURAL_OVERALL_FLOOR = 0.88
NATURAL_LABEL_FLOOR = 0.70


@pytest.fixture(scope="module")
def model() -> IntentModel:
    return load()


def test_heldout_accuracy(model):
    result = evaluate(model, load_examples(HELDOUT_FILE))
    assert result.overall >= HELDOUT_OVERALL_FLOOR
    for label in LABELS:
        assert result.accuracy(label) >= HELDOUT_LABEL_FLOOR, label
    for lang in ("en", "zh", "mixed"):
        assert result.lang_accuracy(lang) >= HELDOUT_LANG_FLOOR, lang


def test_natural_set_accuracy(model):
    result = evaluate(model, load_examples(NATURAL_FILE))
    assert result.overall >= NATURAL_OVERALL_FLOOR
    for label in LABELS:
        assert result.accuracy(label) >= NATURAL_LABEL_FLOOR, label


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


def test_intent_train_reproduces_the_shipped_artifact(tmp_path, model):
    output = tmp_path / "intent.npz"
    out = StringIO()
    call_command("intent_train", "--output", str(output), stdout=out)
    assert "held-out accuracy" in out.getvalue()
    retrained = IntentModel.load(output)
    assert retrained.provenance == model.provenance
    assert model.provenance.data_sha256 == data_digest()
    probe = [e.text for e in load_examples(HELDOUT_FILE)[::7]]
    assert [retrained.classify(t).label for t in probe] == [model.classify(t).label for t in probe]


def test_intent_report_command(model):
    out = StringIO()
    call_command("intent_report", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["artifact"]["stale"] is False
    for name, split in (("heldout", HELDOUT_FILE), ("natural", NATURAL_FILE)):
        section = report[name]
        expected = evaluate(model, load_examples(split))
        assert section["examples"] == expected.total
        assert section["overall"] == pytest.approx(expected.overall, abs=1e-4)
        assert list(section["labels"]) == list(LABELS)
        confusion = np.array(section["confusion"]["rows_true_columns_predicted"])
        assert confusion.shape == (len(LABELS), len(LABELS))
        assert confusion.sum() == expected.total

    text = StringIO()
    call_command("intent_report", stdout=text)
    rendered = text.getvalue()
    assert "Held-out split" in rendered and "Natural set" in rendered
    assert "Confusion matrix" in rendered
    assert all(f"| {label} |" in rendered for label in LABELS)


def test_data_files_live_in_the_package():
    assert DATA_DIR.is_dir()
    assert {path.name for path in DATA_DIR.glob("*.jsonl")} == {
        TRAIN_FILE,
        HELDOUT_FILE,
        NATURAL_FILE,
    }
