"""The intent model: a linear softmax classifier over hashed features, and its .npz artifact."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from apps.gateway.intent import features
from apps.gateway.intent.features import BUCKETS
from apps.gateway.intent.labels import LABELS, Intent

# Bump when the artifact's layout or the feature extraction changes meaning: an artifact written
# for other features would load without error and classify nonsense.
# 2: reading.py's instruction, and a softmax temperature; 3: its marker for quantities.
ARTIFACT_VERSION = 3
ARTIFACT_PATH = Path(__file__).resolve().parent / "artifacts" / "intent.npz"


class ArtifactError(Exception):
    """The artifact is missing, or was written for other labels or other features."""


@dataclass(frozen=True, slots=True)
class Prediction:
    label: Intent
    confidence: float  # the calibrated softmax probability of the label (see temperature)


@dataclass(frozen=True, slots=True)
class Provenance:
    seed: int
    epochs: int
    examples: int
    data_sha256: str


def _feature_config() -> dict[str, int]:
    return {
        "bucket_bits": features.BUCKET_BITS,
        "head_chars": features.HEAD_CHARS,
        "tail_chars": features.TAIL_CHARS,
        "char_ngram_max": features.CHAR_NGRAM_MAX,
    }


@dataclass(slots=True)
class IntentModel:
    weights: np.ndarray  # (BUCKETS, len(LABELS)) float32, one row per feature bucket
    bias: np.ndarray  # (len(LABELS),) float32
    provenance: Provenance
    # Logits are divided by it before the softmax; fitted on held-out prompts (tools/intent/
    # calibrate.py) so that a confidence of 0.9 is right about 90% of the time.
    temperature: float = 1.0
    labels: tuple[Intent, ...] = field(default=tuple(Intent(label) for label in LABELS))

    def __post_init__(self) -> None:
        # The compiled logits read the weights as one C-contiguous float32 block.
        self.weights = np.ascontiguousarray(self.weights, dtype=np.float32)
        self.bias = np.ascontiguousarray(self.bias, dtype=np.float32)

    def logits(self, text: str) -> list[float]:
        return features.logits(text, self.weights, self.bias)

    def probabilities(self, text: str) -> list[float]:
        # Eight numbers: plain Python beats numpy's per-call overhead here.
        logits = [value / self.temperature for value in self.logits(text)]
        top = max(logits)
        exp = [math.exp(value - top) for value in logits]
        total = sum(exp)
        return [value / total for value in exp]

    def classify(self, text: str) -> Prediction:
        probabilities = self.probabilities(text)
        best = max(range(len(probabilities)), key=probabilities.__getitem__)
        return Prediction(self.labels[best], probabilities[best])

    def save(self, path: Path = ARTIFACT_PATH) -> None:
        """Write the artifact; float16 weights halve its size and move no prediction we saw."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            # Each feature setting as a 32-bit integer array of its own.
            features: dict[str, Any] = {k: np.int32(v) for k, v in _feature_config().items()}
            np.savez_compressed(
                out,
                version=np.int32(ARTIFACT_VERSION),
                labels=np.array([str(label) for label in self.labels]),
                weights=self.weights.astype(np.float16),
                bias=self.bias.astype(np.float32),
                temperature=np.float64(self.temperature),
                seed=np.int64(self.provenance.seed),
                epochs=np.int32(self.provenance.epochs),
                examples=np.int32(self.provenance.examples),
                data_sha256=np.array(self.provenance.data_sha256),
                **features,
            )

    @classmethod
    def load(cls, path: Path = ARTIFACT_PATH) -> IntentModel:
        """Read an artifact; refuse one written for other labels, features or layout."""
        try:
            archive = np.load(path, allow_pickle=False)
        except FileNotFoundError as exc:
            raise ArtifactError(
                f"no intent model at {path}; run python -m tools.intent train"
            ) from exc
        with archive:
            if int(archive["version"]) != ARTIFACT_VERSION:
                raise ArtifactError(
                    f"{path}: version {int(archive['version'])}, expected "
                    f"{ARTIFACT_VERSION}; retrain with python -m tools.intent train"
                )
            labels = tuple(str(label) for label in archive["labels"])
            if labels != LABELS:
                raise ArtifactError(f"{path}: labels {labels}, expected {LABELS}")
            config = {key: int(archive[key]) for key in _feature_config()}
            if config != _feature_config():
                raise ArtifactError(f"{path}: features {config}, expected {_feature_config()}")
            weights = archive["weights"].astype(np.float32)
            if weights.shape != (BUCKETS, len(LABELS)):
                raise ArtifactError(f"{path}: weights of shape {weights.shape}")
            return cls(
                weights=weights,
                bias=archive["bias"].astype(np.float32),
                temperature=float(archive["temperature"]),
                provenance=Provenance(
                    seed=int(archive["seed"]),
                    epochs=int(archive["epochs"]),
                    examples=int(archive["examples"]),
                    data_sha256=str(archive["data_sha256"]),
                ),
            )
