"""Write the real-prompt data set: human-written prompts, labelled by the guide, wrapped, split.

    python -m tools.intent.real            rewrite data/real_{train,dev,test}.jsonl.gz
    python -m tools.intent.real --review   print every ask's label and what decided it

The asks are read from data/sources/*.jsonl.gz (what the sources wrote, reduced to the fields
used; data/README.md cites each repository, commit and licence), labelled by labelling.py (the
guide, LABELLING.md), and each is written twice: as the source wrote it (its pasted material
before or after the instruction) and wrapped the way applications send prompts (app
boilerplate in front, a system message, or the last turn of a conversation). The split is by a
hash of the ask's text, so both copies of an ask land in the same split; self-instruct's
authors ask that their set not be trained on, so its asks go to dev and test only. The same
sources give the same files (tests/tools/test_intent.py checks it, and pins the test split).
"""

# ruff: noqa: RUF001 (Chinese text uses full-width punctuation)

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from random import Random

from tools.intent.dataset import DATA_DIR, REAL_DEV_FILE, REAL_TEST_FILE, REAL_TRAIN_FILE
from tools.intent.labelling import Ask, label

SOURCES_DIR = DATA_DIR / "sources"
# Which language each source's asks are written in; None: told apart per ask (detect_lang), and
# asks in other languages (arena-hard holds Russian, Vietnamese, Japanese...) left out.
SOURCE_LANGS: dict[str, str | None] = {
    "dolly": "en",
    "self_instruct": "en",
    "gaokao": "zh",
    "arena_hard": None,
}
# An ask is Chinese when this share of its letters are CJK ideographs (and it has no kana, which
# would make it Japanese, nor hangul); English when this share of its letters are ASCII and its
# words include English function words (Spanish or Vietnamese in ASCII letters, or a Russian ask
# around pasted code, would pass the share alone).
CJK_SHARE_MIN = 0.3
ASCII_SHARE_MIN = 0.95
ENGLISH_WORDS_MIN = 1
SHORT_ASK_WORDS = 6  # too few words to hold a function word ("c# extract hashtags from text")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_OTHER_SCRIPT = re.compile(r"[\u3040-\u30ff\uac00-\ud7af\u0400-\u04ff]")
_ENGLISH_WORDS = frozenset(
    (
        *("the", "an", "and", "or", "to", "of", "in", "for", "with", "from"),
        *("is", "are", "was", "be", "it", "this", "that", "you", "my", "we"),
        *("what", "how", "why", "which", "who", "can", "could", "would", "should"),
        *("please", "write", "give", "make"),
    )
)
# Shares of the hash space, in percent: train below TRAIN_BELOW, dev below DEV_BELOW, the rest
# test. 60/20/20 leaves each label a few dozen test prompts per language while training on most.
TRAIN_BELOW, DEV_BELOW = 60, 80
# Sources whose authors ask that the set not be trained on: dev below this share, test above.
EVAL_ONLY = {"self_instruct": 50}

# Wrappers written for this set (not realistic.py's, which stays a set of its own).
APP_PREAMBLES = {
    "en": (
        "You are a helpful, honest assistant.",
        "You are Nova, the assistant inside our note-taking app. Keep answers short.",
        "Act as a knowledgeable assistant. Answer in English.",
        "You're an AI assistant for a small business. Be friendly and precise.",
    ),
    "zh": (
        "你是一个知识渊博的智能助手。",
        "请用简体中文回答。",
        "你是某办公软件里的写作助手，回答要简洁、准确。",
        "【系统提示】你是在线客服助手，请耐心回答用户问题。",
    ),
}
EARLIER_TURNS = {
    "en": (
        ("hi! are you there?", "Hi! Yes, how can I help you today?"),
        ("thanks, that was useful", "You're welcome! Anything else?"),
        ("what's the capital of Canada?", "Ottawa."),
        ("can you make your answers shorter from now on", "Sure, I'll keep them brief."),
    ),
    "zh": (
        ("你好，在吗？", "你好！我在，请问有什么可以帮你？"),
        ("谢谢，很有帮助", "不客气！还有别的问题吗？"),
        ("上海今天天气怎么样", "抱歉，我无法获取实时天气。"),
        ("以后回答简短一点", "好的，我会尽量简洁。"),
    ),
}


def detect_lang(text: str) -> str | None:
    """Return en or zh by the ask's letters, None for another language."""
    letters = [char for char in text if char.isalpha()]
    if not letters:
        return "en"
    if _OTHER_SCRIPT.search(text):
        return None
    if sum(bool(_CJK.match(char)) for char in letters) >= CJK_SHARE_MIN * len(letters):
        return "zh"
    words = re.findall(r"[a-z]+", text.lower())
    english = sum(word in _ENGLISH_WORDS for word in words)
    if sum(char.isascii() for char in letters) >= ASCII_SHARE_MIN * len(letters) and (
        english >= ENGLISH_WORDS_MIN or len(words) < SHORT_ASK_WORDS
    ):
        return "en"
    return None


def read_source(name: str, directory: Path = SOURCES_DIR) -> Iterator[Ask]:
    with gzip.open(directory / f"{name}.jsonl.gz", "rt", encoding="utf-8") as rows:
        for line in rows:
            row = json.loads(line)
            lang = SOURCE_LANGS[name] or detect_lang(row["instruction"])
            if lang is None:
                continue
            yield Ask(
                source=name,
                id=row["id"],
                instruction=row["instruction"],
                context=row.get("context", ""),
                lang=lang,
                category=row.get("class", row.get("category", "")),
            )


def asks(directory: Path = SOURCES_DIR) -> list[Ask]:
    return [ask for name in SOURCE_LANGS for ask in read_source(name, directory)]


def prompt_text(ask: Ask) -> str:
    """Return the ask as one text, the instruction then its material: what the split hashes."""
    return f"{ask.instruction}\n\n{ask.context}" if ask.context else ask.instruction


def digest(ask: Ask) -> int:
    return int(hashlib.sha256(prompt_text(ask).encode("utf-8")).hexdigest()[:8], 16)


def split_of(ask: Ask) -> str:
    """Return train, dev or test for the ask, by the hash of its text (its source's rule aside)."""
    bucket = digest(ask) % 100
    if ask.source in EVAL_ONLY:
        return "dev" if bucket < EVAL_ONLY[ask.source] else "test"
    if bucket < TRAIN_BELOW:
        return "train"
    return "dev" if bucket < DEV_BELOW else "test"


def _as_written(ask: Ask, rng: Random) -> str:
    if not ask.context:
        return ask.instruction
    shape = rng.randrange(3)
    if shape == 0:
        return f"{ask.instruction}\n\n{ask.context}"
    if shape == 1:
        return f"{ask.context}\n\n{ask.instruction}"
    colon = "：" if ask.lang == "zh" else ":"
    return f"{ask.instruction.rstrip('.?!。？！ ')}{colon}\n{ask.context}"


def rows_of(ask: Ask, label_: str) -> list[dict]:
    """Return the ask's two rows: as written, and wrapped as an application sends it."""
    rng = Random(digest(ask))
    base = {"label": label_, "lang": ask.lang, "source": ask.source, "id": ask.id}
    plain = _as_written(ask, rng)
    rows = [{"text": plain, "kind": "plain", **base}]
    text = _as_written(ask, rng)
    preamble = rng.choice(APP_PREAMBLES[ask.lang])
    kind = rng.choice(("boilerplate", "system", "conversation"))
    if kind == "boilerplate":
        rows.append({"text": f"{preamble}\n\n{text}", "kind": kind, **base})
        return rows
    messages = [{"role": "system", "content": preamble}] if kind == "system" else []
    if kind == "conversation":
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": preamble})
        for user, assistant in rng.sample(EARLIER_TURNS[ask.lang], rng.randint(1, 2)):
            messages += [
                {"role": "user", "content": user},
                {"role": "assistant", "content": assistant},
            ]
    messages.append({"role": "user", "content": text})
    rows.append({"text": text, "messages": messages, "kind": kind, **base})
    return rows


def build(directory: Path = SOURCES_DIR) -> dict[str, list[dict]]:
    """Return the rows of each split, in source order."""
    splits: dict[str, list[dict]] = {"train": [], "dev": [], "test": []}
    for ask in asks(directory):
        splits[split_of(ask)] += rows_of(ask, label(ask)[0])
    return splits


def serialise(rows: list[dict]) -> bytes:
    """Return the rows as JSON lines: what a split file holds, gunzipped."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


SPLIT_FILES = {"train": REAL_TRAIN_FILE, "dev": REAL_DEV_FILE, "test": REAL_TEST_FILE}


def write(splits: dict[str, list[dict]], directory: Path = DATA_DIR) -> None:
    for split, rows in splits.items():
        # mtime 0: the same rows give the same bytes, so that a rewrite shows no change.
        with gzip.GzipFile(directory / SPLIT_FILES[split], "wb", mtime=0) as out:
            out.write(serialise(rows))


def review(out=sys.stdout) -> None:
    """Print every ask's label, what decided it and its instruction's start, then the counts."""
    counts: Counter[tuple[str, str]] = Counter()
    for ask in asks():
        result, rule = label(ask)
        counts[result, ask.lang] += 1
        head = " ".join(ask.instruction.split())[:110]
        out.write(f"{ask.source}:{ask.id}\t{ask.category or '-'}\t{rule}\t{result}\t{head}\n")
    for (result, lang), n in sorted(counts.items()):
        out.write(f"# {result} {lang} {n}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.intent.real", description=__doc__)
    parser.add_argument("--review", action="store_true", help="print the labels, write nothing")
    options = parser.parse_args(argv)
    if options.review:
        review()
    else:
        write(build())


if __name__ == "__main__":
    main()
