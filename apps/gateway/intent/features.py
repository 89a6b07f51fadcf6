"""Turn a prompt into hashed features: character 1-3-grams plus Latin word uni- and bigrams.

Character n-grams carry Chinese (no spaces to split words on) and the punctuation of code; words
(runs of 0-9, a-z and U+00DF-U+024F: Latin, accented letters included) carry English phrasing.
Each n-gram's hash is a polynomial (FNV prime) over its code points, each word's its UTF-8
CRC-32, each feature kind's hashes offset by its own seed (the CRC-32 of its name, shifted up 32
bits), and the bucket is the top BUCKET_BITS of the seeded hash times 2**64 / golden ratio
(Fibonacci hashing). Stable across processes, unlike Python's salted hash(). The hashing,
counting and weighting run in _hashing.c, compiled: in numpy a short prompt paid a dozen calls'
overhead for a few hundred features, in C it takes a few microseconds.
"""

from __future__ import annotations

import unicodedata

import numpy as np

import apps.gateway.intent._hashing as _hashing
from apps.gateway.intent.reading import instruction

# Fixed in _hashing.c, named here for the model and the artifact's self-description.
# 131,072 buckets: measured as accurate as 2**18 and 2**19, 2 MB as float16.
BUCKET_BITS = _hashing.BUCKET_BITS
BUCKETS = 1 << BUCKET_BITS
# Only the start and the end of a long prompt are read. The instruction sits there ("Summarise
# the following: ..." or "... translate the above into English"); the middle is payload (the
# text to condense, the code to fix) that costs time and says little about the intent. The cap
# also bounds the classifier's latency whatever the prompt's length.
HEAD_CHARS = 1000
TAIL_CHARS = 200
# What the instruction reading (reading.py) scans at most: its regular expressions run over the
# two ends of a longer prompt only, so that its cost is bounded too.
READ_CHARS = 4096
# 1-3-grams: most Chinese words are one to three characters; 4-grams measured no better on
# unseen phrasings and cost a third more time.
CHAR_NGRAM_MAX = _hashing.CHAR_NGRAM_MAX
# The first and last characters get their own copy of the n-grams, tagged by position: that is
# where the instruction is ("summarise this: <text>", "<text> translate the above"), and a long
# payload would otherwise drown it out. The text's edges are marked (\x02 before, \x03 after),
# so "\x02hi" (starts with "hi") is a feature of its own.
EDGE_CHARS = _hashing.EDGE_CHARS
# NFKC maps these (full-width ASCII) to ASCII by a fixed offset; they are most of what Chinese
# text needs from NFKC, and folding them first with numpy lets normalize() take its fast path.
_FULL_WIDTH_FIRST, _FULL_WIDTH_LAST = 0xFF01, 0xFF5E
_FULL_WIDTH_OFFSET = 0xFF01 - 0x21


def normalise(text: str) -> str:
    """Return the prompt's instruction (reading.py), folded: what the features are made of."""
    if len(text) > 2 * READ_CHARS:
        text = f"{text[:READ_CHARS]}\n{text[-READ_CHARS:]}"
    return fold(instruction(text))


def fold(text: str) -> str:
    """Return the capped, NFKC-normalised, casefolded text with whitespace runs made one space."""
    if len(text) > HEAD_CHARS + TAIL_CHARS:
        text = f"{text[:HEAD_CHARS]}\n{text[-TAIL_CHARS:]}"
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", _fold_full_width(text))
    return " ".join(text.casefold().split())


def _fold_full_width(text: str) -> str:
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    wide = (points >= _FULL_WIDTH_FIRST) & (points <= _FULL_WIDTH_LAST)
    if not wide.any():
        return text
    return (
        np.where(wide, points - _FULL_WIDTH_OFFSET, points)
        .astype(np.uint32)
        .tobytes()
        .decode("utf-32-le")
    )


def features(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Return a prompt's sparse feature vector: sorted bucket ids and unit-length weights.

    Weights are 1 + log(count), so a repeated n-gram counts but cannot dominate, and the vector
    has unit length, so a one-liner and a page weigh the same.
    """
    ids, weights = _hashing.features(normalise(text))
    return np.frombuffer(ids, dtype=np.int64).astype(np.intp), np.frombuffer(weights, np.float32)


def logits(text: str, weights: np.ndarray, bias: np.ndarray) -> list[float]:
    """Return bias + the prompt's features times weights (float32, BUCKETS rows), in one pass:
    the classifier's whole hot path, with no array built."""
    return _hashing.logits(normalise(text), weights, bias)
