"""Add to the training prompts what real traffic carries: pasted material, app boilerplate, typos.

The generated prompts are short and clean; real ones arrive as "Summarise this:\\n<an article>",
"<code>\\n\\nwhy does this fail?", after "You are a helpful assistant.", with typos. Each training
prompt gets, with the rates below, a copy with material of a random other kind pasted before or
after it (fenced, quoted, after a colon, or as paragraphs), a copy behind boilerplate, and a copy
with a typo; and MATERIAL_ASKS_PER_LABEL asks that work on pasted material are added per label.
Material comes from the generator's train-side pools only, boilerplate from the list
here, never from data/realistic.jsonl's. Seeded: the same seed and prompts give the same copies.
"""

# ruff: noqa: RUF001 (Chinese text uses full-width punctuation on purpose)

from __future__ import annotations

from collections.abc import Sequence
from random import Random

from tools.intent.dataset import Example
from tools.intent.generate import SEED as GENERATOR_SEED
from tools.intent.generate import TRAIN, split_pools
from tools.intent.stories import story

MATERIAL_RATE = 0.6
BOILERPLATE_RATE = 0.3
TYPO_RATE = 0.15
# Chat (greetings, small talk) does not come with a document to work on.
NO_MATERIAL = frozenset({"chat"})

BOILERPLATE_EN = (
    "You are a helpful, harmless and honest assistant.",
    "You are an AI assistant. Be concise.",
    "System: you are a knowledgeable assistant. Answer the user's question.",
    "You're an assistant inside our note-taking app.",
    "Act as a helpful assistant and reply in English.",
    "Always answer truthfully. If you don't know, say so.",
)
BOILERPLATE_ZH = (
    "你是一个智能助手。",
    "请用简体中文回答。",
    "你是某某公司的AI客服，请耐心解答。",
    "【系统提示】请简洁回答，不要编造信息。",
    "你是一名专业、友好的助手，回答要准确。",
)


def _pools() -> dict[str, tuple]:
    sides = split_pools(Random(GENERATOR_SEED))
    return {name: sides[name][TRAIN] for name in ("passages", "passages_zh", "snippet")}


# How an ask points at its material; said of code as often under every label, so that "this
# code" stops meaning the code label.
LEAD_INS = {
    True: ("this code", "the code below", "这段代码", "这段 code", "下面的代码", "my script"),
    False: (
        "this text",
        "the article below",
        "这篇文章",
        "下面这段话",
        "这段 article",
        "the table",
    ),
}


# Asks that work on pasted material, per label: the generated families seldom paste material
# for comparison, creative or code edits, so the model learnt "material after a colon" as
# summarization. Written apart from data/realistic.jsonl's asks; MATERIAL_ASKS_PER_LABEL each.
MATERIAL_ASKS = {
    "code": (
        "refactor the code below and add type hints",
        "add logging to this",
        "this throws an exception, what's the bug",
        "port this to Rust",
        "把下面的代码改成异步的",
        "这段代码有内存泄漏，帮我改",
        "给这个函数加上参数校验",
        "帮我 review 下面的 code",
    ),
    "explanation": (
        "what does this part mean",
        "explain the second paragraph to a beginner",
        "why does this line work",
        "下面这段话是什么意思",
        "解释一下这里提到的概念",
        "这段 code 的原理是什么，讲讲",
    ),
    "summarization": (
        "give me the gist",
        "boil this down to three bullets",
        "key takeaways?",
        "概括一下",
        "提炼要点",
        "用一句话总结下面的内容",
    ),
    "comparison": (
        "which of these is the better deal",
        "compare the options below and tell me which to pick",
        "weigh the pros and cons of each option",
        "which plan is better value for a family",
        "下面几个方案哪个更好",
        "对比一下这几个选项的优缺点",
        "这几个套餐哪个更划算",
        "帮我比一比，选哪个",
    ),
    "creative": (
        "write a poem inspired by this",
        "turn this into a short story",
        "make a rap song out of this",
        "write a funny limerick about the text below",
        "把下面的内容写成一首诗",
        "根据这个写个小故事",
        "用下面的内容编一段相声",
        "把这段改写成一首歌词",
    ),
    "translation": (
        "put this into Italian",
        "render the text below in Japanese",
        "翻成英文",
        "把下面的内容译成法语",
    ),
    "math": (
        "how much is left at the end",
        "work out the total cost",
        "最后还剩多少",
        "一共多少钱，列式计算",
    ),
}
MATERIAL_ASKS_PER_LABEL = 80
# Word problems told as a story (stories.py), per language (en, zh, and an English story asked
# about in Chinese): about as many as one generated math family's prompts per language, so the
# story form is learnt without outweighing the one-sentence problems.
STORY_PROBLEMS_PER_LANG = 60
# How a story problem is put: the question after it on its own line or in the same paragraph,
# sometimes after a short lead. Leads written for this, apart from data/realistic.jsonl's.
STORY_LEADS = {
    "en": ("", "", "Word problem: ", "Can you solve this? ", "Help me with my homework:\n"),
    "zh": ("", "", "应用题：", "请解答：", "孩子的作业题，"),
}
# Of the pasted material (_material), the share that is a story with quantities but no
# question: told to be translated or summarised, it is not a problem to solve.
STORY_MATERIAL_RATE = 0.2


def _table(rng: Random) -> str:
    names = rng.sample(("A", "B", "C", "Basic", "Pro", "方案一", "方案二", "套餐甲", "套餐乙"), 3)
    columns = rng.sample(("price", "speed", "价格", "容量", "rating", "售后", "weight"), 3)
    rows = [f"| name | {' | '.join(columns)} |", "|---|" + "---|" * len(columns)]
    rows += [
        f"| {name} | " + " | ".join(str(rng.randint(1, 999)) for _ in columns) + " |"
        for name in names
    ]
    return "\n".join(rows)


def _material(pools: dict[str, tuple], rng: Random) -> tuple[str, bool]:
    if rng.random() < STORY_MATERIAL_RATE:
        told, _ = story(rng.choice(("en", "zh")), rng)
        return told, False
    kind = rng.choice(("passages", "passages_zh", "snippet", "table"))
    if kind == "snippet":
        return rng.choice(pools["snippet"]), True
    if kind == "table":
        return _table(rng), False
    joiner = " " if kind == "passages" else ""
    return "\n\n".join(
        joiner.join(rng.choice(pools[kind])) for _ in range(rng.randint(1, 3))
    ), False


def _paste(ask: str, material: str, is_code: bool, lang: str, rng: Random) -> str:
    colon = "：" if lang == "zh" and rng.random() < 0.7 else ":"
    if is_code and rng.random() < 0.5:
        material = f"```\n{material}\n```"
    elif not is_code and rng.random() < 0.25:
        material = "\n".join(f"> {line}" for line in material.splitlines())
    if rng.random() < 0.4:
        ask = f"{ask.rstrip('.?!。？！ ')} {rng.choice(LEAD_INS[is_code])}"
    shape = rng.randrange(4)
    if shape == 0:
        return f"{ask.rstrip('.?!。？！ ')}{colon}\n{material}"
    if shape == 1:
        return f"{ask}\n\n{material}"
    if shape == 2:
        return f"{material}\n\n{ask}"
    return f"{ask.rstrip('.?!。？！ ')}{colon}\n\n{material}\n\n{rng.choice(('thanks', '谢谢'))}"


def _typo(text: str, rng: Random) -> str:
    if len(text) < 8:
        return text
    at = rng.randrange(1, len(text) - 2)
    if rng.random() < 0.5:
        return text[:at] + text[at + 1] + text[at] + text[at + 2 :]
    return text[:at] + text[at + 1 :]


def _story_problem(lang: str, rng: Random) -> str:
    told, question = story("en" if lang == "mixed" else lang, rng)
    if lang == "mixed":
        _, question = story("zh", rng)
    lead = rng.choice(STORY_LEADS["zh" if lang == "mixed" else lang])
    joiner = rng.choice(("\n\n", "\n", " " if lang == "en" else ""))
    return f"{lead}{told}{joiner}{question}"


def augment(examples: Sequence[Example], seed: int) -> list[Example]:
    """Return the examples followed by their augmented copies."""
    rng = Random(seed)
    pools = _pools()
    out = list(examples)
    for example in examples:
        lang = "zh" if example.lang == "zh" else "en"
        if example.label not in NO_MATERIAL and rng.random() < MATERIAL_RATE:
            material, is_code = _material(pools, rng)
            text = _paste(example.text, material, is_code, example.lang, rng)
            out.append(Example(text, example.label, example.lang, example.family))
        if rng.random() < BOILERPLATE_RATE:
            boiler = rng.choice(BOILERPLATE_ZH if lang == "zh" else BOILERPLATE_EN)
            separator = rng.choice(("\n\n", "\n", " "))
            out.append(Example(f"{boiler}{separator}{example.text}", example.label, example.lang))
        if rng.random() < TYPO_RATE:
            out.append(Example(_typo(example.text, rng), example.label, example.lang))
    for label, asks in MATERIAL_ASKS.items():
        for _ in range(MATERIAL_ASKS_PER_LABEL):
            ask = rng.choice(asks)
            lang = "en" if ask.isascii() else "zh"
            material, is_code = _material(pools, rng)
            out.append(Example(_paste(ask, material, is_code, lang, rng), label, lang))
    for lang in ("en", "zh", "mixed"):
        for _ in range(STORY_PROBLEMS_PER_LANG):
            out.append(Example(_story_problem(lang, rng), "math", lang))
    return out
