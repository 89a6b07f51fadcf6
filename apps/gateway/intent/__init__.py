"""Intent classification, layer 1 of the gateway: which kind of task a prompt asks for.

The only module other code imports: `classify(text)` returns a Prediction (`.label`, one of
LABELS, and `.confidence`, the model's probability for it); `load()` reads the model ahead of
the first request. Its offline tool chain (data, generation, training, evaluation) is tools/intent,
in a repository checkout only; it writes artifacts/intent.npz, the one file read here.
"""

from apps.gateway.intent.classifier import classify, load
from apps.gateway.intent.labels import LABELS, Intent
from apps.gateway.intent.model import ArtifactError, Prediction

__all__ = ["LABELS", "ArtifactError", "Intent", "Prediction", "classify", "load"]
