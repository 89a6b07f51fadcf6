"""Score the intent model on labelled prompts: accuracy per label and language, confusion matrix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from apps.gateway.intent.labels import LABELS
from apps.gateway.intent.model import IntentModel
from tools.intent.dataset import LANGS, Example


@dataclass(frozen=True, slots=True)
class Evaluation:
    confusion: np.ndarray  # [true label, predicted label] counts, in LABELS order
    lang_correct: dict[str, int]
    lang_total: dict[str, int]

    @property
    def total(self) -> int:
        return int(self.confusion.sum())

    @property
    def overall(self) -> float:
        return float(np.trace(self.confusion) / max(self.total, 1))

    def support(self, label: str) -> int:
        return int(self.confusion[LABELS.index(label)].sum())

    def accuracy(self, label: str) -> float:
        """Return the share of the label's prompts classified as the label (its recall)."""
        row = LABELS.index(label)
        return float(self.confusion[row, row] / max(self.support(label), 1))

    def lang_accuracy(self, lang: str) -> float:
        return self.lang_correct[lang] / max(self.lang_total[lang], 1)

    def as_dict(self) -> dict:
        return {
            "examples": self.total,
            "overall": round(self.overall, 4),
            "labels": {
                label: {"accuracy": round(self.accuracy(label), 4), "n": self.support(label)}
                for label in LABELS
            },
            "langs": {
                lang: {"accuracy": round(self.lang_accuracy(lang), 4), "n": self.lang_total[lang]}
                for lang in LANGS
                if self.lang_total[lang]
            },
            "confusion": {
                "order": list(LABELS),
                "rows_true_columns_predicted": self.confusion.tolist(),
            },
        }


def evaluate(model: IntentModel, examples: Sequence[Example]) -> Evaluation:
    confusion = np.zeros((len(LABELS), len(LABELS)), dtype=np.int64)
    lang_correct = dict.fromkeys(LANGS, 0)
    lang_total = dict.fromkeys(LANGS, 0)
    for example in examples:
        predicted = model.classify(example.prompt).label
        confusion[LABELS.index(example.label), LABELS.index(predicted)] += 1
        lang_total[example.lang] += 1
        lang_correct[example.lang] += predicted == example.label
    return Evaluation(confusion, lang_correct, lang_total)


def render(evaluation: Evaluation, title: str) -> str:
    """Return the evaluation as markdown: accuracy per label and language, then the confusion."""
    lines = [f"## {title}", "", "| label | n | accuracy |", "|---|---:|---:|"]
    lines += [
        f"| {label} | {evaluation.support(label)} | {evaluation.accuracy(label):.3f} |"
        for label in LABELS
    ]
    lines.append(f"| **overall** | {evaluation.total} | **{evaluation.overall:.3f}** |")
    lines += ["", "| language | n | accuracy |", "|---|---:|---:|"]
    lines += [
        f"| {lang} | {evaluation.lang_total[lang]} | {evaluation.lang_accuracy(lang):.3f} |"
        for lang in LANGS
        if evaluation.lang_total[lang]
    ]
    short = [label[:5] for label in LABELS]
    lines += [
        "",
        "Confusion matrix (rows: true label, columns: predicted):",
        "",
        "| true \\ predicted | " + " | ".join(short) + " |",
        "|---|" + "---:|" * len(LABELS),
    ]
    lines += [
        f"| {label} | " + " | ".join(str(count) for count in row) + " |"
        for label, row in zip(LABELS, evaluation.confusion.tolist(), strict=True)
    ]
    return "\n".join(lines)
