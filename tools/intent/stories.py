"""Word problems told as stories, for the training augmentation (augment.py).

The generated math prompts state their problem in one sentence ("A train travels 300 km in 2
hours..."); real ones often tell a story first and ask at the end ("Lena had 30 marbles. She gave
a third of them... How many does she have now?"), and the question alone ("how many does she have
now?") reads as chat. These stories teach the model that a narrative of quantities followed by a
question of quantity is math; told without the question, the same stories are material for the
other labels' asks (a story to translate or summarise is not a problem to solve). Written apart
from data/realistic.jsonl's story and from the tests' prompts; seeded through the caller's Random.
"""

# ruff: noqa: RUF001 (Chinese text uses full-width punctuation on purpose)

from __future__ import annotations

from random import Random

# (name, subject pronoun, object pronoun)
PEOPLE_EN = (
    ("Lena", "she", "her"),
    ("Omar", "he", "him"),
    ("Aisha", "she", "her"),
    ("Carlos", "he", "him"),
    ("Grace", "she", "her"),
    ("Hugo", "he", "him"),
    ("Ivy", "she", "her"),
    ("Kofi", "he", "him"),
    ("Nadia", "she", "her"),
    ("Sam", "they", "them"),
)
ITEMS_EN = (
    "marbles",
    "cookies",
    "pencils",
    "seashells",
    "stamps",
    "baseball cards",
    "balloons",
    "cupcakes",
    "paper cranes",
    "eggs",
)
RELATIVES_EN = ("brother", "cousin", "neighbour", "best friend", "grandfather", "teacher")
FRACTIONS_EN = ("half", "a third", "a quarter", "a fifth")
# Events after the opening; {n}, {m} are fresh numbers, {s}/{o} the pronouns, {r} a relative.
EVENTS_EN = (
    "On Monday {s} gave {n} of them to {poss} {r}.",
    "{S} gave {f} of them to {poss} {r}.",
    "Then {s} bought {n} boxes with {m} {item} in each.",
    "{Poss} {r} gave {o} {n} more.",
    "{S} dropped {n} on the way home from school.",
    "At the fair {s} won another {n}.",
    "{S} used {n} of them for an art project.",
    "The next day {s} found {n} more under the sofa.",
    "Later {s} sold {n} to a classmate.",
)
QUESTIONS_EN = (
    "How many {item} does {name} have now?",
    "How many {item} are left?",
    "How many does {s} end up with?",
    "How many {item} did {name} have at the end?",
    "so how many does {s} have left",
)
MONEY_EVENTS_EN = (
    "{S} spent ${n} on lunch.",
    "{S} bought {n} notebooks at ${m} each.",
    "{Poss} {r} paid {o} back ${n} that {s} had lent.",
    "{S} earned ${n} walking a neighbour's dog.",
    "A ticket to the museum cost {o} ${n}.",
)
MONEY_QUESTIONS_EN = (
    "How much money does {name} have now?",
    "How much is left?",
    "How many dollars does {s} have at the end of the day?",
)

PEOPLE_ZH = ("小红", "小刚", "丽丽", "小华", "明明", "李阿姨", "王叔叔", "小芳")
# (item, its measure word)
ITEMS_ZH = (
    ("糖", "颗"),
    ("铅笔", "支"),
    ("故事书", "本"),
    ("鸡蛋", "个"),
    ("邮票", "张"),
    ("气球", "个"),
    ("橘子", "个"),
    ("玻璃珠", "颗"),
)
RELATIVES_ZH = ("同桌", "弟弟", "邻居", "表姐", "奶奶", "好朋友")
EVENTS_ZH = (
    "先送给{r}{n}{mw}，",
    "把其中的一半分给了{r}，",
    "又买了{n}盒，每盒{m}{mw}，",
    "{r}又给了{name}{n}{mw}，",
    "放学路上丢了{n}{mw}，",
    "第二天又用掉了{n}{mw}，",
    "后来卖给同学{n}{mw}，",
)
QUESTIONS_ZH = (
    "{name}现在有多少{mw}{item}？",
    "还剩多少{mw}？",
    "最后一共有多少{mw}{item}？请列式计算",
    "现在还有几{mw}？",
)
MONEY_EVENTS_ZH = (
    "午饭花了{n}元，",
    "买了{n}个本子，每个{m}元，",
    "{r}还给{name}{n}元，",
    "周末帮邻居遛狗挣了{n}元，",
)
MONEY_QUESTIONS_ZH = ("{name}现在还有多少钱？", "最后还剩多少元？", "一共还剩多少钱，列式计算")

# Two to five events: one-sentence problems the generator already has, long ones are rare.
MIN_EVENTS, MAX_EVENTS = 2, 5
MONEY_SHARE = 0.3


def _en(rng: Random) -> tuple[str, str]:
    name, subject, obj = rng.choice(PEOPLE_EN)
    money = rng.random() < MONEY_SHARE
    item = rng.choice(ITEMS_EN)
    slots = {
        "name": name,
        "s": subject,
        "S": subject.capitalize(),
        "o": obj,
        "poss": {"she": "her", "he": "his", "they": "their"}[subject],
        "item": item,
    }
    slots["Poss"] = slots["poss"].capitalize()
    opening = (
        f"{name} had ${rng.randint(20, 200)} in {slots['poss']} wallet."
        if money
        else rng.choice(
            (
                f"{name} had {rng.randint(12, 120)} {item}.",
                f"{name} started the week with {rng.randint(12, 120)} {item}.",
                f"On Saturday {name} collected {rng.randint(12, 120)} {item}.",
            )
        )
    )
    pool = MONEY_EVENTS_EN if money else EVENTS_EN
    events = rng.sample(pool, rng.randint(MIN_EVENTS, min(MAX_EVENTS, len(pool))))
    story = " ".join(
        [opening]
        + [
            event.format(
                n=rng.randint(2, 40),
                m=rng.randint(2, 12),
                f=rng.choice(FRACTIONS_EN),
                r=rng.choice(RELATIVES_EN),
                **slots,
            )
            for event in events
        ]
    )
    question = rng.choice(MONEY_QUESTIONS_EN if money else QUESTIONS_EN).format(**slots)
    return story, question


def _zh(rng: Random) -> tuple[str, str]:
    name = rng.choice(PEOPLE_ZH)
    money = rng.random() < MONEY_SHARE
    item, measure = rng.choice(ITEMS_ZH)
    opening = (
        f"{name}钱包里有{rng.randint(20, 200)}元，"
        if money
        else f"{name}有{rng.randint(12, 120)}{measure}{item}，"
    )
    pool = MONEY_EVENTS_ZH if money else EVENTS_ZH
    events = rng.sample(pool, rng.randint(MIN_EVENTS, min(MAX_EVENTS, len(pool))))
    story = opening + "".join(
        event.format(
            n=rng.randint(2, 40),
            m=rng.randint(2, 12),
            r=rng.choice(RELATIVES_ZH),
            mw=measure,
            name=name,
        )
        for event in events
    )
    story = story.rstrip("，") + "。"
    question = rng.choice(MONEY_QUESTIONS_ZH if money else QUESTIONS_ZH).format(
        name=name, item=item, mw=measure
    )
    return story, question


def story(lang: str, rng: Random) -> tuple[str, str]:
    """Return a word problem told as a story and its question, in English or Chinese."""
    return _zh(rng) if lang == "zh" else _en(rng)
