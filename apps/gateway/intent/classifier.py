"""The process's intent model: read once (at startup, or by the first call), then shared read-only.

classify() is pure CPU on in-memory arrays, about a quarter of a millisecond for a 4 KB prompt
(bench/intent.py), so the gateway calls it inline on the event loop: a thread hop would cost
more than the work.
"""

from __future__ import annotations

import threading

from apps.gateway.intent.model import ARTIFACT_PATH, IntentModel, Prediction

_lock = threading.Lock()
_model: IntentModel | None = None


def load() -> IntentModel:
    """Return the process's model, reading the artifact on the first call only."""
    global _model
    if _model is None:
        with _lock:
            if _model is None:
                _model = IntentModel.load(ARTIFACT_PATH)
    return _model


def classify(text: str) -> Prediction:
    """Return the prompt's intent and the model's probability for it."""
    return (_model or load()).classify(text)
