"""The intent classifier's offline tool chain: its data, the accuracy it measures, its commands."""

from __future__ import annotations

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
from tools.intent.augment import augment
from tools.intent.calibrate import calibration
from tools.intent.dataset import (
    DATA_DIR,
    HELDOUT_FILE,
    NATURAL_FILE,
    REALISTIC_FILE,
    TRAIN_FILE,
    load_examples,
)
from tools.intent.evaluate import evaluate
from tools.intent.generate import generate
from tools.intent.realistic import build
from tools.intent.train import data_digest, train

# Floors set from the shipped model's measurements (python -m tools.intent report), with room for a
# retrain on changed data but not for a real regression. Held-out: 0.848 overall, weakest label
# code at 0.733 (before the augmentation of issue 19: 0.862, weakest translation 0.733).
# Natural set: 0.902 overall, weakest label code 0.739 (23 prompts a label, so one prompt moves
# a label by 0.043). A broken feature or label mix-up lands far below.
HELDOUT_OVERALL_FLOOR = 0.83
HELDOUT_LABEL_FLOOR = 0.70
# Measured: en 0.835, zh 0.873, mixed 0.800 (0.838 before issue 19's augmentation: the templated
# mixed prompts lost what the realistic ones gained; 160 prompts, one moves it by 0.006).
HELDOUT_LANG_FLOOR = 0.77
NATURAL_OVERALL_FLOOR = 0.88
NATURAL_LABEL_FLOOR = 0.70
# The realistic set (data/realistic.jsonl: pasted material, boilerplate, conversations), issue
# 19, whose target is 0.95 overall and 0.85 a label. Measured: 0.819 before the instruction
# reading and the augmented training, 0.950 with them, 0.968 with the story problems and the
# quantity marker (weakest labels explanation and creative at 0.905; en 0.976, zh 0.964, mixed
# 0.964); 63 prompts a label, so one prompt moves a label by 0.016.
REALISTIC_OVERALL_FLOOR = 0.94
REALISTIC_LABEL_FLOOR = 0.85
REALISTIC_LANG_FLOOR = 0.90
# Measured ECE 0.053 on the realistic set (0.061 at temperature 1), 0.038 on the held-out split
# the temperature is fitted on. A confidence that means nothing lands far above.
REALISTIC_ECE_CEILING = 0.08


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
    assert "realistic-set accuracy" in trained
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
    splits = (("heldout", HELDOUT_FILE), ("natural", NATURAL_FILE), ("realistic", REALISTIC_FILE))
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
    assert "Confusion matrix" in rendered and "Realistic set" in rendered
    assert "ECE" in rendered
    assert all(f"| {label} |" in rendered for label in LABELS)


def test_data_files_live_in_the_package():
    assert DATA_DIR.is_dir()
    assert {path.name for path in DATA_DIR.glob("*.jsonl")} == {
        TRAIN_FILE,
        HELDOUT_FILE,
        NATURAL_FILE,
        REALISTIC_FILE,
    }
