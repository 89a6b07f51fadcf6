"""Turn a prompt into hashed features: character 1-3-grams plus Latin word uni- and bigrams.

Character n-grams carry Chinese (no spaces to split words on) and the punctuation of code; words
carry English phrasing. N-gram hashes are polynomial hashes over code points computed on whole
numpy arrays: stable across processes (Python's hash() is salted per process) and far cheaper
than one Python call per n-gram, which is what keeps a 4 KB prompt well under a millisecond.
"""

from __future__ import annotations

import re
import unicodedata
import zlib

import numpy as np

BUCKET_BITS = 17  # 131,072 buckets: measured as accurate as 2**18 and 2**19, 2 MB as float16
BUCKETS = 1 << BUCKET_BITS
# Only the start and the end of a long prompt are read. The instruction sits there ("Summarise
# the following: ..." or "... translate the above into English"); the middle is payload (the
# text to condense, the code to fix) that costs time and says little about the intent. The cap
# also bounds the classifier's latency whatever the prompt's length.
HEAD_CHARS = 1000
TAIL_CHARS = 200
# 1-3-grams: most Chinese words are one to three characters; 4-grams measured no better on
# unseen phrasings and cost a third more time.
CHAR_NGRAM_MAX = 3
# The first and last characters get their own copy of the n-grams, tagged by position: that is
# where the instruction is ("summarise this: <text>", "<text> translate the above"), and a long
# payload would otherwise drown it out.
EDGE_CHARS = 100

_START, _END = "\x02", "\x03"  # mark the prompt's edges, so "\x02hi" (starts with "hi") is a key
# NFKC maps these (full-width ASCII) to ASCII by a fixed offset; they are most of what Chinese
# text needs from NFKC, and folding them first with numpy lets normalize() take its fast path.
_FULL_WIDTH_FIRST, _FULL_WIDTH_LAST = 0xFF01, 0xFF5E
_FULL_WIDTH_OFFSET = 0xFF01 - 0x21
# Latin words, accented letters included; Chinese is covered by the character n-grams.
_WORD = re.compile(r"[0-9a-z\u00df-\u024f]+")

_U64 = np.uint64
_STEP = _U64(0x100000001B3)  # the 64-bit FNV prime: folds code points into an n-gram's hash
# 2**64 / golden ratio, odd: Fibonacci hashing moves every input bit into the top bits kept.
_MIX = _U64(0x9E3779B97F4A7C15)
_SHIFT = _U64(64 - BUCKET_BITS)


def _seed(kind: str) -> np.uint64:
    """Return the offset that keeps one kind of feature's hashes apart from the others'."""
    return _U64(zlib.crc32(kind.encode()) << 32)


_CHAR_SEEDS = tuple(_seed(f"char{n}") for n in range(CHAR_NGRAM_MAX + 1))
_HEAD_SEEDS = tuple(_seed(f"head{n}") for n in range(CHAR_NGRAM_MAX + 1))
_TAIL_SEEDS = tuple(_seed(f"tail{n}") for n in range(CHAR_NGRAM_MAX + 1))
_WORD_SEED = _seed("word")
_BIGRAM_SEED = _seed("bigram")


def normalise(text: str) -> str:
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


def _ngram_hashes(points: np.ndarray) -> list[np.ndarray]:
    """Return the unseeded hashes of the 1- to CHAR_NGRAM_MAX-grams of a code-point array."""
    hashes = [points]
    for n in range(2, CHAR_NGRAM_MAX + 1):
        hashes.append(hashes[-1][:-1] * _STEP + points[n - 1 :])
    return hashes


def buckets(text: str) -> np.ndarray:
    """Return the bucket of every feature of normalised text, repeats included.

    The n-grams of the edges are slices of the whole text's n-grams (the first and last
    EDGE_CHARS characters' own n-grams), so the text is encoded and hashed once.
    """
    marked = f"{_START}{text}{_END}"
    points = np.frombuffer(marked.encode("utf-32-le"), dtype=np.uint32).astype(_U64)
    size = len(points)
    # Each part's hashes get their kind's seed added; collecting the parts and adding the seeds
    # in one pass over the joined array halves the time a short prompt spends here (numpy's
    # per-call overhead, not the arithmetic, is what a 30-character prompt pays for).
    parts: list[np.ndarray] = []
    seeds: list[np.uint64] = []
    for n, hashes in enumerate(_ngram_hashes(points), start=1):
        head = hashes[: max(min(size, EDGE_CHARS) - n + 1, 0)]
        tail = hashes[max(size - EDGE_CHARS, 0) :]
        parts += (hashes, head, tail)
        seeds += (_CHAR_SEEDS[n], _HEAD_SEEDS[n], _TAIL_SEEDS[n])
    words = _WORD.findall(text)
    if words:
        word_hashes = np.array([zlib.crc32(word.encode()) for word in words], dtype=_U64)
        parts += (word_hashes, word_hashes[:-1] * _STEP + word_hashes[1:])
        seeds += (_WORD_SEED, _BIGRAM_SEED)
    keys = np.concatenate(parts)
    keys += np.repeat(np.array(seeds, dtype=_U64), [len(part) for part in parts])
    keys *= _MIX
    keys >>= _SHIFT
    return keys


def features(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Return a prompt's sparse feature vector: sorted bucket ids and unit-length weights.

    Weights are 1 + log(count), so a repeated n-gram counts but cannot dominate, and the vector
    has unit length, so a one-liner and a page weigh the same.
    """
    ids, counts = np.unique(buckets(normalise(text)), return_counts=True)
    weights = np.log(counts, dtype=np.float32) + np.float32(1)
    weights /= np.sqrt(weights @ weights)
    return ids.astype(np.intp), weights
