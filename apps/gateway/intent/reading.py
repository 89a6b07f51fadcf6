"""What the classifier reads of a prompt: the user's instruction, not the material pasted with it.

Real prompts carry an ask and material: "Summarise this:\\n<an article>", "<code>\\n\\nwhy does
this fail?", a poem in a quote block to translate, an app's "You are a helpful assistant." in
front. The material's topic is not the task (a summary of pasted code is a summary), so the
material is replaced by a marker of its kind (code, text, or text holding quantities: a story
told before its question), which keeps "there was material of this kind" as a feature and drops
its words. App boilerplate at the start is dropped outright. In a chat, the last user turn is the
request; system messages are the app's, not the user's.
"""

# ruff: noqa: RUF001 (Chinese punctuation is matched on purpose)

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Markers for removed material; private-use characters, so no user text produces them.
CODE_MARK = " \ue000 "
TEXT_MARK = " \ue001 "
# Text material that holds quantities: a word problem told as a story reads as its question
# alone ("how much does Maya have left?"), which is chat without the story's numbers; this
# marker keeps that coarse signal (not the numbers, nor the story's words).
QUANTITY_MARK = " \ue002 "
# This many numbers in a block of text make it a block of quantities: a story problem states
# three or more (a start, a change, a rate), an article may quote one or two figures.
QUANTITIES_MIN = 3

_MARKS = tuple(mark.strip() for mark in (CODE_MARK, TEXT_MARK, QUANTITY_MARK))

# A last user turn this short, that opens with a word pointing back ("again", "继续", "and in
# Chinese?"), asks for the task before it once more; a longer one states a task of its own. The
# longest referring turns seen ("can you do the same thing for this one too?") fit.
REFERS_BACK_MAX_CHARS = 48
# How far back a turn that refers back is followed (turns that refer back in turn: "继续" after
# "继续"), and how much of each earlier turn is read (its two ends): bounded whatever the
# conversation's length.
EARLIER_TURNS_MAX = 3
EARLIER_TURN_CHARS = 2048

# Material is only a block this long: a short quoted word ("translate 'hello'") is the ask.
MATERIAL_MIN_CHARS = 40
# After an ask that ends in a colon, a last paragraph up to this long is a trailing instruction
# ("... in three bullet points"), not material.
TRAILING_ASK_MAX_CHARS = 160
# A paragraph this long before a short last one is material the ask (the last one) refers to.
LEADING_MATERIAL_MIN_CHARS = 200

_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_QUOTE = re.compile(r"(?:^[ \t]*>[^\n]*(?:\n|\Z))+", re.MULTILINE)
_TABLE = re.compile(r"(?:^[ \t]*\|[^\n]*(?:\n|\Z)){2,}", re.MULTILINE)
# An app's preamble: who the assistant is, or how to answer, stated before the user's words.
_BOILERPLATE = re.compile(
    r"^\s*(?:system\s*[:：]\s*)?(?:"
    r"you are\b|you're an?\b|act as\b|as an ai\b|answer (?:concisely|briefly|in)\b|"
    r"always\b|do not reveal\b|knowledge cutoff\b|"
    r"你是|【系统提示】|请用(?:中文|英文|简体中文)回答|请(?:认真|礼貌)"
    r")[^\n]*?(?:[.!。！]\s*|\n+|$)",
    re.IGNORECASE,
)
_REFERS_BACK = re.compile(
    # Lead words that say nothing of the task ("ok, now ...", "can you ...").
    r"^\s*(?:(?:and|but|ok(?:ay)?|now|then|also|please|pls|great|thanks|can you|could you)"
    r"[\s,!.]+)*(?:"
    r"(?:do|try) (?:the same|it|that|this)(?: thing)?\b|same (?:thing|again|for|with|in)\b|"
    r"again\b|one more\b|another(?: one)?\b|continue\b|go on\b|keep going\b|more\b|"
    r"(?:what|how) about\b|"
    # "in Chinese?", "for Go", "into French please": one word after the preposition, no verb.
    r"(?:in|into|for|with) [^\s?？]+(?: (?:please|pls|too|as well))?\s*[?？.!]?\s*$|"
    r"继续|接着|再来|同样|一样的|也[帮给]|换成|改成|.{0,6}再.{0,4}(?:一遍|一次|一[个道首篇段])|"
    r"那.{0,8}呢|.{0,8}呢[?？]?\s*$"
    r")",
    re.IGNORECASE,
)
# What a turn asks before its material: the text up to its first colon or line break.
_ASK = re.compile(r"[^:：\n]*")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_CODE_HINT = re.compile(
    r"[{};]\s*$|^\s*(?:def|class|import|from|return|function|const|let|var|select|insert|"
    r"update|create|for|while|if)\b|=>|\w\(.*\)\s*[:{]?$",
    re.IGNORECASE | re.MULTILINE,
)


def _mark(block: str) -> str:
    if len(block.strip()) < MATERIAL_MIN_CHARS:
        return block
    lines = [line for line in block.splitlines() if line.strip()]
    code_lines = sum(bool(_CODE_HINT.search(line)) for line in lines)
    if lines and code_lines * 3 >= len(lines):
        return CODE_MARK
    if len(_NUMBER.findall(block)) >= QUANTITIES_MIN:
        return QUANTITY_MARK
    return TEXT_MARK


def _strip_boilerplate(text: str) -> str:
    while True:
        match = _BOILERPLATE.match(text)
        if not match or not text[match.end() :].strip():
            return text
        text = text[match.end() :]


def _after_colon(text: str) -> str:
    """Replace what follows an ask ending in a colon and a line break, keeping a short ending."""
    match = re.search(r"[:：]\s*\n", text)
    if not match:
        return text
    ask, rest = text[: match.end()], text[match.end() :]
    paragraphs = re.split(r"\n\s*\n", rest.strip())
    tail = ""
    if len(paragraphs) > 1 and len(paragraphs[-1]) <= TRAILING_ASK_MAX_CHARS:
        tail = paragraphs.pop()
    material = "\n\n".join(paragraphs)
    if len(material.strip()) < MATERIAL_MIN_CHARS:
        return text
    return f"{ask}{_mark(material)}\n{tail}".strip()


def _before_last(text: str) -> str:
    """Replace long material that precedes a short last paragraph (the ask about it)."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    if len(paragraphs) < 2 or len(paragraphs[-1]) > TRAILING_ASK_MAX_CHARS:
        return text
    material = "\n\n".join(paragraphs[:-1])
    if len(material) < LEADING_MATERIAL_MIN_CHARS:
        return text
    return f"{_mark(material)}\n{paragraphs[-1]}"


def _after_first(text: str) -> str:
    """Replace long material that follows a short first paragraph (the ask about it)."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    if len(paragraphs) < 2 or len(paragraphs[0]) > TRAILING_ASK_MAX_CHARS:
        return text
    material = "\n\n".join(paragraphs[1:])
    if len(material) < LEADING_MATERIAL_MIN_CHARS:
        return text
    return f"{paragraphs[0]}\n{_mark(material)}"


def instruction(text: str) -> str:
    """Return the prompt with boilerplate dropped and pasted material replaced by markers."""
    text = _FENCE.sub(
        lambda match: CODE_MARK if len(match[0]) >= MATERIAL_MIN_CHARS else match[0], text
    )
    text = _QUOTE.sub(lambda match: _mark(match[0]) + "\n", text)
    text = _TABLE.sub(lambda match: TEXT_MARK + "\n", text)
    text = _strip_boilerplate(text)
    if not any(mark in text for mark in _MARKS):
        for reduce in (_after_colon, _before_last, _after_first):
            reduced = reduce(text)
            if reduced != text:
                text = reduced
                break
    return text.strip()


def _plain(content: Any) -> str:
    return content if isinstance(content, str) else ""


def last_user_turn(
    messages: Sequence[Mapping[str, Any]], text_of: Callable[[Any], str] = _plain
) -> str:
    """Return the text of the last user message (system and assistant turns do not decide)."""
    read = text_of
    for message in reversed(messages):
        if message.get("role") == "user":
            return read(message.get("content"))
    return read(messages[-1].get("content")) if messages else ""


def refers_back(turn: str) -> bool:
    """Return whether a user turn only points at the task before it ("do the same for this")."""
    found = _ASK.match(turn.strip())
    ask = found[0] if found else ""
    return len(ask) <= REFERS_BACK_MAX_CHARS and bool(_REFERS_BACK.match(ask))


def _bounded(text: str) -> str:
    half = EARLIER_TURN_CHARS // 2
    return text if len(text) <= EARLIER_TURN_CHARS else f"{text[:half]}\n{text[-half:]}"


def user_request(
    messages: Sequence[Mapping[str, Any]], text_of: Callable[[Any], str] = _plain
) -> str:
    """Return what the user asks: the last user turn, after the earlier user turn it refers back
    to when it only does that ("继续", "and in Chinese?"); a turn that states a task decides alone.
    """
    turns: list[str] = []
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        turn = text_of(message.get("content"))
        turns.append(_bounded(turn) if turns else turn)
        if not refers_back(turn) or len(turns) > EARLIER_TURNS_MAX:
            break
    if not turns:
        return last_user_turn(messages, text_of)
    return "\n\n".join(reversed(turns))
