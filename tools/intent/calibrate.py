"""Calibrate the intent model's confidence: fit a softmax temperature, measure calibration error.

Temperature scaling: one number divides the logits, chosen to minimise the negative log
likelihood on prompts the model was not trained on. It changes no label, only how sure the
model says it is. Expected calibration error (ECE): the prompts binned by confidence, the mean
gap between a bin's confidence and its accuracy, weighted by the bin's size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from apps.gateway.intent.labels import LABELS
from apps.gateway.intent.model import IntentModel
from tools.intent.dataset import Example

# A grid, not an optimiser: one parameter, a smooth loss, and the same answer on every run.
TEMPERATURES = np.round(np.arange(0.25, 5.0001, 0.05), 2)
BINS = 10


@dataclass(frozen=True, slots=True)
class Calibration:
    ece: float
    bins: list[tuple[float, float, float, int]]  # (low, high, accuracy, n) per non-empty bin
    mean_confidence: float
    accuracy: float


def _logits(model: IntentModel, examples: Sequence[Example]) -> tuple[np.ndarray, np.ndarray]:
    logits = np.array([model.logits(example.prompt) for example in examples])
    targets = np.array([LABELS.index(example.label) for example in examples])
    return logits, targets


def fit_temperature(model: IntentModel, examples: Sequence[Example]) -> IntentModel:
    """Return the model with the temperature that minimises the examples' log loss."""
    logits, targets = _logits(model, examples)
    best, best_loss = 1.0, math.inf
    for temperature in TEMPERATURES:
        scaled = logits / temperature
        scaled -= scaled.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(scaled).sum(axis=1))
        loss = float((log_norm - scaled[np.arange(len(targets)), targets]).mean())
        if loss < best_loss:
            best, best_loss = float(temperature), loss
    return replace(model, temperature=best)


def calibration(model: IntentModel, examples: Sequence[Example]) -> Calibration:
    """Return the model's expected calibration error and reliability bins on the examples."""
    confidences, correct = [], []
    for example in examples:
        prediction = model.classify(example.prompt)
        confidences.append(prediction.confidence)
        correct.append(prediction.label == example.label)
    confidence, hit = np.array(confidences), np.array(correct, dtype=float)
    edges = np.linspace(0, 1, BINS + 1)
    index = np.clip(np.digitize(confidence, edges[1:-1]), 0, BINS - 1)
    bins, ece = [], 0.0
    for number in range(BINS):
        members = index == number
        if members.any():
            accuracy = float(hit[members].mean())
            ece += members.mean() * abs(accuracy - float(confidence[members].mean()))
            bins.append(
                (float(edges[number]), float(edges[number + 1]), accuracy, int(members.sum()))
            )
    return Calibration(float(ece), bins, float(confidence.mean()), float(hit.mean()))


def render(result: Calibration, title: str) -> str:
    """Return the calibration as markdown: ECE, then the reliability table."""
    lines = [
        f"## {title}",
        "",
        f"ECE {result.ece:.3f} (mean confidence {result.mean_confidence:.3f}, "
        f"accuracy {result.accuracy:.3f})",
        "",
        "| confidence | n | accuracy |",
        "|---|---:|---:|",
    ]
    lines += [f"| {low:.1f}-{high:.1f} | {n} | {acc:.3f} |" for low, high, acc, n in result.bins]
    return "\n".join(lines)
