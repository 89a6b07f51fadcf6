"""The intents the gateway tells apart; their order is the model's output order."""

from __future__ import annotations

from enum import StrEnum


class Intent(StrEnum):
    CODE = "code"  # write, fix, review or explain code, SQL, shell
    EXPLANATION = "explanation"  # explain a concept or how something works
    SUMMARIZATION = "summarization"  # condense a given text
    COMPARISON = "comparison"  # compare options, pros and cons, tables of differences
    CREATIVE = "creative"  # poems, stories, slogans, copy
    TRANSLATION = "translation"
    MATH = "math"  # calculate, solve, prove
    CHAT = "chat"  # greetings, small talk, advice, short factual or customer-service questions


LABELS: tuple[str, ...] = tuple(intent.value for intent in Intent)
