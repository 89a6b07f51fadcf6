"""The intent data set on disk: JSON lines of {"text", "label", "lang"}, plus "family" if templated.

train.jsonl and heldout.jsonl are written by generate.py and split by phrasing family;
natural.jsonl is written by hand, the way users type, and never used for training.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from apps.gateway.intent.labels import LABELS
from apps.gateway.intent.reading import user_request

DATA_DIR = Path(__file__).resolve().parent / "data"
TRAIN_FILE = "train.jsonl"
HELDOUT_FILE = "heldout.jsonl"
NATURAL_FILE = "natural.jsonl"
# Built unlike the training data (tools/intent/realistic.py, data/README.md); never trained on.
REALISTIC_FILE = "realistic.jsonl"
# Human-written prompts from public collections, labelled by LABELLING.md (tools/intent/real.py):
# trained on, tuned on (dev), and evaluated once per change (test, locked: its hash is pinned).
REAL_TRAIN_FILE = "real_train.jsonl.gz"
REAL_DEV_FILE = "real_dev.jsonl.gz"
REAL_TEST_FILE = "real_test.jsonl.gz"
LANGS = ("en", "zh", "mixed")


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    label: str
    lang: str
    family: str = ""  # the phrasing family of a templated prompt; empty for hand-written ones
    # A chat request's messages ({"role", "content"}), when the example is one; text is then
    # its last user message.
    messages: tuple[dict[str, str], ...] = ()

    @property
    def prompt(self) -> str:
        """Return what the gateway classifies for the example: its user request (the last user
        turn, after the one it refers back to), or its text."""
        return user_request(self.messages) if self.messages else self.text

    def as_row(self) -> dict[str, str]:
        row = {"text": self.text, "label": self.label, "lang": self.lang}
        if self.family:
            row["family"] = self.family
        return row


def read_text(name: str, directory: Path = DATA_DIR) -> str:
    """Return a data file's text, gunzipped when its name ends in .gz."""
    data = (directory / name).read_bytes()
    return (gzip.decompress(data) if name.endswith(".gz") else data).decode("utf-8")


def load_examples(name: str, directory: Path = DATA_DIR) -> list[Example]:
    """Read one data file; fail on a label or language the classifier does not know."""
    examples = []
    for number, line in enumerate(read_text(name, directory).split("\n"), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        example = Example(
            row["text"],
            row["label"],
            row["lang"],
            row.get("family", ""),
            tuple(row.get("messages", ())),
        )
        if example.label not in LABELS or example.lang not in LANGS:
            raise ValueError(f"{name}:{number}: unknown label or lang in {row}")
        examples.append(example)
    return examples
