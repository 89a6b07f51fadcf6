"""Write the intent data set: templated prompts, split into train and held-out by phrasing family.

`python -m tools.intent.generate` rewrites data/train.jsonl and data/heldout.jsonl; the
same seed writes the same files. The split is honest twice over: a held-out family's phrasings
never appear in training, and every slot pool large enough is split too, so held-out prompts
also talk about subjects, texts and code the model never saw. data/natural.jsonl is written by
hand and left alone. The templates and slot values are TOML tables beside this module
(phrasings.toml, fillers_en.toml, fillers_zh.toml); math slots are drawn with fresh numbers by
fillers_math.py.
"""

# ruff: noqa: RUF001 (Chinese text uses full-width punctuation on purpose)

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from random import Random
from typing import Any

from apps.gateway.intent.features import fold
from tools.intent import fillers_math as maths
from tools.intent.dataset import DATA_DIR, HELDOUT_FILE, TRAIN_FILE, Example
from tools.intent.tables import Family, load_families, load_table

FAMILIES = load_families()
EN = load_table("fillers_en")
ZH = load_table("fillers_zh")

SEED = 20260601
PER_FAMILY = 20  # ~33 families per label: ~650 prompts per label, ~5,200 in all
HELDOUT_SHARE = 0.25  # of each label's families per language, and of each large slot pool
# Pools this size or larger are split between train and held-out; smaller ones are shared, or
# a held-out family could draw from only one or two values.
SPLIT_POOL_MIN = 8
# Closed vocabularies that any real training set covers in full: never split.
SHARED_POOLS = frozenset(
    {"plang", "target", "target_zh", "aspect", "aspect_zh", "form", "form_zh", "style", "style_zh"}
)
ATTEMPTS_PER_ROW = 6  # small pools run out of distinct prompts; stop trying after this many

TRAIN, HELDOUT = "train", "heldout"

# Pair slots: both names are filled from one drawn pair.
PAIRS = {
    "first": ("pair", 0),
    "second": ("pair", 1),
    "first_zh": ("pair_zh", 0),
    "second_zh": ("pair_zh", 1),
}

POOLS: dict[str, tuple[Any, ...]] = {
    "plang": EN["programming_languages"],
    "task": EN["code_tasks"],
    "task_zh": ZH["code_tasks"],
    "snippet": EN["code_snippets"],
    "error": EN["errors"],
    "sql": EN["sql_tasks"],
    "sql_zh": ZH["sql_tasks"],
    "shell": EN["shell_tasks"],
    "shell_zh": ZH["shell_tasks"],
    "regex": EN["regexes"],
    "concept": EN["concepts"],
    "concept_zh": ZH["concepts"],
    "mechanism": EN["mechanisms"],
    "mechanism_zh": ZH["mechanisms"],
    "why": EN["why_questions"],
    "why_zh": ZH["why_questions"],
    "passages": EN["passages"],
    "passages_zh": ZH["passages"],
    "sentence": EN["sentences"],
    "sentence_zh": ZH["sentences"],
    "term": EN["terms"],
    "term_zh": ZH["terms"],
    "target": EN["target_languages"],
    "target_zh": ZH["target_languages"],
    "pair": EN["comparison_pairs"],
    "pair_zh": ZH["comparison_pairs"],
    "aspect": EN["aspects"],
    "aspect_zh": ZH["aspects"],
    "form": EN["creative_forms"],
    "form_zh": ZH["creative_forms"],
    "subject": EN["creative_subjects"],
    "subject_zh": ZH["creative_subjects"],
    "style": EN["creative_styles"],
    "style_zh": ZH["creative_styles"],
    "product": EN["products"],
    "product_zh": ZH["products"],
    "occasion": EN["occasions"],
    "occasion_zh": ZH["occasions"],
    "person_zh": ZH["people"],
    "opener": EN["story_openers"],
    "opener_zh": ZH["story_openers"],
    "greeting": EN["greetings"],
    "greeting_zh": ZH["greetings"],
    "small_talk": EN["small_talk"],
    "small_talk_zh": ZH["small_talk"],
    "advice": EN["advice"],
    "advice_zh": ZH["advice"],
    "situation": EN["situations"],
    "situation_zh": ZH["situations"],
    "fact": EN["fact_questions"],
    "fact_zh": ZH["fact_questions"],
    "support": EN["support_issues"],
    "support_zh": ZH["support_issues"],
    "support_ask": EN["support_asks"],
    "support_ask_zh": ZH["support_asks"],
    "closer": EN["closers"],
    "closer_zh": ZH["closers"],
    "recommendation": EN["recommendations"],
    "recommendation_zh": ZH["recommendations"],
    "opinion": EN["opinions"],
    "opinion_zh": ZH["opinions"],
    "service": EN["service_questions"],
    "service_zh": ZH["service_questions"],
    "about_bot": EN["about_bot"],
    "about_bot_zh": ZH["about_bot"],
    "dev_question": EN["dev_questions"],
    "dev_question_zh": ZH["dev_questions"],
    "business": EN["businesses"],
    "business_zh": ZH["businesses"],
    "foreign": EN["foreign_phrases"],
    "foreign_zh": ZH["foreign_phrases"],
    "mixed_chat": ZH["mixed_chat"],
    "mixed_support": ZH["mixed_support"],
    "proof": EN["proofs"],
    "proof_zh": ZH["proofs"],
    # Pools of generators: each draws a problem with fresh numbers.
    "word_problem": maths.WORD_PROBLEMS_EN,
    "word_problem_zh": maths.WORD_PROBLEMS_ZH,
    "probability": maths.PROBABILITY_EN,
    "probability_zh": maths.PROBABILITY_ZH,
    "geometry": maths.GEOMETRY_AND_MORE_EN,
    "geometry_zh": maths.GEOMETRY_AND_MORE_ZH,
}

Pick = Callable[[str], Any]


def _sentences(pick: Pick, rng: Random, pool: str, least: int, most: int) -> list[str]:
    """Return a run of `least` to `most` consecutive sentences of one drawn text."""
    sentences = pick(pool)
    count = rng.randint(min(least, len(sentences)), min(most, len(sentences)))
    start = rng.randint(0, len(sentences) - count)
    return list(sentences[start : start + count])


def _document(pick: Pick, rng: Random, pool: str, joiner: str) -> str:
    """Return one whole text, or two as paragraphs: the long end of the prompts."""
    texts = [pick(pool) for _ in range(rng.choice((1, 1, 2)))]
    return "\n\n".join(joiner.join(text) for text in texts)


DERIVED: dict[str, Callable[[Pick, Random], str]] = {
    "passage": lambda pick, rng: " ".join(_sentences(pick, rng, "passages", 2, 6)),
    "passage_zh": lambda pick, rng: "".join(_sentences(pick, rng, "passages_zh", 2, 6)),
    "short_text": lambda pick, rng: " ".join(_sentences(pick, rng, "passages", 1, 2)),
    "short_text_zh": lambda pick, rng: "".join(_sentences(pick, rng, "passages_zh", 1, 2)),
    "document": lambda pick, rng: _document(pick, rng, "passages", " "),
    "document_zh": lambda pick, rng: _document(pick, rng, "passages_zh", ""),
    "expr": lambda pick, rng: maths.expression(rng),
    "equation": lambda pick, rng: maths.equation(rng),
    "quadratic": lambda pick, rng: maths.quadratic(rng),
    "system": lambda pick, rng: maths.system(rng),
    "func": lambda pick, rng: maths.function(rng),
    "integrand": lambda pick, rng: maths.integrand(rng),
    "limit": lambda pick, rng: maths.limit_en(rng),
    "limit_zh": lambda pick, rng: maths.limit_zh(rng),
    "numbers": lambda pick, rng: maths.numbers(rng),
    "matrix": lambda pick, rng: maths.matrix(rng),
    "percent": lambda pick, rng: maths.percent_en(rng),
    "percent_zh": lambda pick, rng: maths.percent_zh(rng),
    "n": lambda pick, rng: str(rng.randint(2, 5)),
    "words": lambda pick, rng: str(rng.choice((30, 50, 80, 100, 150, 200))),
    "order_no": lambda pick, rng: str(rng.randint(100_000, 99_999_999)),
    "years": lambda pick, rng: str(rng.randint(2, 9)),
}

# Decorations shared by every label, so that greetings and thanks say nothing about intent.
EN_PREFIXES = ("Hey, ", "Hi! ", "Hello, ", "Quick question: ", "Please help: ", "Hi there. ")
EN_SUFFIXES = (" Thanks!", " Thank you.", " thx", " Please.", " :)", " Thanks in advance.")
ZH_PREFIXES = ("你好，", "您好，", "麻烦", "帮个忙：", "急！", "在吗？", "老师好，")
ZH_SUFFIXES = ("谢谢！", "，谢谢", " 急", "~", "，多谢", "，拜托了")
PREFIX_RATE = 0.15
SUFFIX_RATE = 0.15
LOWERCASE_RATE = 0.2  # many users type English all in lower case
ASCII_PUNCTUATION_RATE = 0.15  # Chinese typed with half-width punctuation
STRIP_END_RATE = 0.15  # no final full stop or question mark
_ASCII_PUNCTUATION = str.maketrans("，。？！：；（）", ",.?!:;()")
_END_PUNCTUATION = ".?!。？！"


class _Filler(dict):
    """Fill a template's slots on demand; a slot used twice gets the same value."""

    def __init__(self, pick: Pick, rng: Random) -> None:
        super().__init__()
        self._pick = pick
        self._rng = rng

    def __missing__(self, key: str) -> str:
        if key in PAIRS:
            pool, _ = PAIRS[key]
            pair = self._pick(pool)
            for name, (other_pool, index) in PAIRS.items():
                if other_pool == pool:
                    self[name] = pair[index]
        elif key in DERIVED:
            self[key] = DERIVED[key](self._pick, self._rng)
        else:
            self[key] = self._pick(key)
        return self[key]


def split_pools(rng: Random) -> dict[str, dict[str, tuple[Any, ...]]]:
    """Return each pool's values for the train side and the held-out side."""
    sides = {}
    for name, values in POOLS.items():
        if len(values) < SPLIT_POOL_MIN or name in SHARED_POOLS:
            sides[name] = {TRAIN: values, HELDOUT: values}
            continue
        shuffled = list(values)
        rng.shuffle(shuffled)
        cut = math.ceil(len(shuffled) * (1 - HELDOUT_SHARE))
        sides[name] = {TRAIN: tuple(shuffled[:cut]), HELDOUT: tuple(shuffled[cut:])}
    return sides


def heldout_families(rng: Random) -> set[str]:
    """Pick a share of each (label, language) group's families, at least one, to hold out."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for family in FAMILIES:
        groups[family.label, family.lang].append(family.name)
    chosen = set()
    for key in sorted(groups):
        names = sorted(groups[key])
        rng.shuffle(names)
        chosen.update(names[: max(1, round(len(names) * HELDOUT_SHARE))])
    return chosen


def decorate(text: str, lang: str, rng: Random) -> str:
    """Add the noise real prompts carry: greetings, thanks, lower case, loose punctuation."""
    chinese = lang == "zh" or (lang == "mixed" and rng.random() < 0.5)
    if rng.random() < STRIP_END_RATE:
        text = text.rstrip(_END_PUNCTUATION)
    if rng.random() < PREFIX_RATE:
        prefix = rng.choice(ZH_PREFIXES if chinese else EN_PREFIXES)
        if not chinese and text[:1].isupper() and text[1:2].islower():
            text = text[0].lower() + text[1:]
        text = prefix + text
    if rng.random() < SUFFIX_RATE:
        text += rng.choice(ZH_SUFFIXES if chinese else EN_SUFFIXES)
    if chinese and rng.random() < ASCII_PUNCTUATION_RATE:
        text = text.translate(_ASCII_PUNCTUATION)
    if not chinese and rng.random() < LOWERCASE_RATE:
        text = text.lower()
    return text


def _family_rows(family: Family, pick: Pick, rng: Random) -> Iterator[str]:
    seen: set[str] = set()
    for _ in range(PER_FAMILY * ATTEMPTS_PER_ROW):
        if len(seen) == PER_FAMILY:
            return
        template = rng.choice(family.templates)
        text = decorate(template.format_map(_Filler(pick, rng)), family.lang, rng)
        key = fold(text)
        if key not in seen:
            seen.add(key)
            yield text


def generate(seed: int = SEED) -> dict[str, list[Example]]:
    """Return the train and held-out examples; a prompt written under two labels is dropped."""
    rng = Random(seed)
    pools = split_pools(rng)
    held = heldout_families(rng)
    rows: dict[str, list[Example]] = {TRAIN: [], HELDOUT: []}
    labels_of: dict[str, set[str]] = defaultdict(set)
    for family in FAMILIES:
        side = HELDOUT if family.name in held else TRAIN

        def pick(pool: str, side: str = side) -> Any:
            value = rng.choice(pools[pool][side])
            return value(rng) if callable(value) else value

        for text in _family_rows(family, pick, rng):
            labels_of[fold(text)].add(family.label)
            rows[side].append(Example(text, family.label, family.lang, family.name))
    seen: set[str] = set()
    for side, examples in rows.items():
        kept = []
        for example in examples:
            key = fold(example.text)
            if len(labels_of[key]) == 1 and key not in seen:
                seen.add(key)
                kept.append(example)
        rows[side] = kept
    return rows


def write(rows: dict[str, list[Example]], directory: Path = DATA_DIR) -> None:
    for side, name in ((TRAIN, TRAIN_FILE), (HELDOUT, HELDOUT_FILE)):
        with (directory / name).open("w", encoding="utf-8") as out:
            for example in rows[side]:
                out.write(json.dumps(example.as_row(), ensure_ascii=False) + "\n")


def main() -> None:
    rows = generate()
    write(rows)
    for side, examples in rows.items():
        print(f"{side}: {len(examples)} examples")


if __name__ == "__main__":
    main()
