"""Measure the content filter: build time, scan time for 4 KB texts, stream cost per chunk.

Run: .venv/bin/python bench/content_filter.py [--terms 10000] [--iterations 2000]
Prints a markdown table. Texts and terms come from a seeded generator, so runs compare.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.gateway.content_filter import (
    ContentFilter,
    FilterAction,
    StreamScanner,
    Term,
)

SEED = 20240601
TEXT_BYTES = 4096  # a long chat prompt; the limit the design card asks to stay under 1 ms for
ENGLISH_SHARE = 0.5  # half the terms English, half Chinese
HITS_PER_TEXT = 5
FULL_WIDTH_COMMA = "\uff0c"  # Chinese text separates words with it, and it is not ASCII
# Common ideographs only, so that generated Chinese reads like Chinese to the table cache.
CJK_FIRST, CJK_LAST = 0x4E00, 0x62FF
# A streamed token is about four characters of English, one or two of Chinese.
ENGLISH_CHUNK, CHINESE_CHUNK = 4, 2


def english_word(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(low, high)))


def chinese_word(rng: random.Random, low: int, high: int) -> str:
    return "".join(chr(rng.randint(CJK_FIRST, CJK_LAST)) for _ in range(rng.randint(low, high)))


def make_terms(rng: random.Random, count: int) -> list[Term]:
    actions = [FilterAction.BLOCK, FilterAction.MASK, FilterAction.FLAG]
    terms = set()
    while len(terms) < count:
        word = english_word(rng, 5, 10) if rng.random() < ENGLISH_SHARE else chinese_word(rng, 2, 4)
        terms.add(word)
    return [Term(word, "bench", rng.choice(actions)) for word in sorted(terms)]


def fill(rng: random.Random, word: Callable[[], str], separator: str, size: int) -> str:
    parts: list[str] = []
    length = 0
    while length < size:
        parts.append(word())
        length += len((parts[-1] + separator).encode())
    return separator.join(parts).encode()[:size].decode(errors="ignore")


def clean(content_filter: ContentFilter, text: str) -> str:
    """Remove generated accidental hits, so the clean text has none."""
    while matches := content_filter.scan(text):
        match = matches[0]
        text = text[: match.start] + "x" * (match.end - match.start) + text[match.end :]
    return text


def with_hits(rng: random.Random, text: str, terms: list[Term], disguise: bool) -> str:
    for term in rng.sample(terms, HITS_PER_TEXT):
        word = " ".join(term.text) if disguise else term.text
        at = rng.randrange(len(text))
        text = f"{text[:at]} {word} {text[at:]}"
    return text


def percentiles(samples_ns: list[int]) -> tuple[float, float, float]:
    ordered = sorted(samples_ns)
    p50 = ordered[len(ordered) // 2] / 1000
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1000
    return p50, p99, statistics.fmean(ordered) / 1000


def time_scan(content_filter: ContentFilter, text: str, iterations: int) -> list[int]:
    content_filter.scan(text)  # warm the character tables
    samples = []
    for _ in range(iterations):
        began = time.perf_counter_ns()
        content_filter.scan(text)
        samples.append(time.perf_counter_ns() - began)
    return samples


def time_stream(content_filter: ContentFilter, text: str, chunk: int, rounds: int) -> list[int]:
    chunks = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    samples = []
    for _ in range(rounds):
        scanner = StreamScanner(content_filter)
        for piece in chunks:
            began = time.perf_counter_ns()
            _, blocked = scanner.feed(piece)
            samples.append(time.perf_counter_ns() - began)
            if blocked:
                break
        scanner.flush()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", type=int, default=10_000)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(SEED)

    terms = make_terms(rng, args.terms)
    began = time.perf_counter_ns()
    content_filter = ContentFilter(terms)
    build_ms = (time.perf_counter_ns() - began) / 1e6

    english = clean(content_filter, fill(rng, lambda: english_word(rng, 1, 9), " ", TEXT_BYTES))
    mixed = clean(
        content_filter,
        fill(
            rng,
            lambda: english_word(rng, 2, 8) if rng.random() < 0.3 else chinese_word(rng, 1, 3),
            FULL_WIDTH_COMMA,
            TEXT_BYTES,
        ),
    )
    chinese = clean(content_filter, fill(rng, lambda: chinese_word(rng, 1, 4), "", TEXT_BYTES))
    # One curly apostrophe takes a text off str.translate's ASCII fast path.
    quoted = english.replace(" ", "\u2019", 1)
    blockless = [t for t in terms if t.action is not FilterAction.BLOCK]
    texts = {
        "English, clean": english,
        "English with one \u2019, clean": quoted,
        "Chinese, clean": chinese,
        "English + Chinese, clean": mixed,
        f"English, {HITS_PER_TEXT} hits": with_hits(rng, english, terms, disguise=False),
        f"English + Chinese, {HITS_PER_TEXT} spaced-out hits": with_hits(
            rng, mixed, terms, disguise=True
        ),
    }

    print(f"{len(content_filter)} terms, built in {build_ms:.1f} ms\n")
    print("| scan of | chars | bytes | matches | p50 µs | p99 µs | mean µs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, text in texts.items():
        p50, p99, mean = percentiles(time_scan(content_filter, text, args.iterations))
        found = len(content_filter.scan(text))
        print(
            f"| {label} | {len(text)} | {len(text.encode())} | {found} "
            f"| {p50:.0f} | {p99:.0f} | {mean:.0f} |"
        )

    print("\n| stream of | chunk chars | chunks | p50 µs/chunk | p99 µs/chunk | mean µs/chunk |")
    print("|---|---:|---:|---:|---:|---:|")
    rounds = max(1, args.iterations // 100)
    for label, text, chunk in (
        ("English, clean", english, ENGLISH_CHUNK),
        ("English + Chinese, clean", mixed, CHINESE_CHUNK),
        (
            f"English + Chinese, {HITS_PER_TEXT} spaced-out non-blocking hits",
            with_hits(rng, mixed, blockless, disguise=True),
            CHINESE_CHUNK,
        ),
    ):
        samples = time_stream(content_filter, text, chunk, rounds)
        p50, p99, mean = percentiles(samples)
        print(
            f"| {label} | {chunk} | {len(samples) // rounds} | {p50:.1f} | {p99:.1f} | {mean:.1f} |"
        )


if __name__ == "__main__":
    main()
