"""The sensitive-word engine: normalisation, offsets, word boundaries, masking and streaming."""

import random
import string

import pytest

from apps.gateway.content_filter import (
    STREAM_HOLD_LIMIT,
    ContentFilter,
    FilterAction,
    Match,
    StreamScanner,
    Term,
    mask_text,
    normalise,
)

BLOCK, MASK, FLAG = FilterAction.BLOCK, FilterAction.MASK, FilterAction.FLAG


def spans(content_filter: ContentFilter, text: str) -> list[tuple[str, str]]:
    return [(m.term, text[m.start : m.end]) for m in content_filter.scan(text)]


@pytest.mark.parametrize(
    "disguised",
    [
        "bad",
        "BAD",
        "b a d",
        "b.a.d",
        "b-a-d",
        "b*a*d",
        "b_a_d",
        "b  a\t\nd",
        "ｂａｄ",  # full-width
        "ＢＡＤ",
        "B\u200bAD",  # zero-width space
        "b\u200ca\u200dd",  # zero-width non-joiner, joiner
        "b\u2060a\ufeffd",  # word joiner, BOM
        "b\u00ada\u00add",  # soft hyphens
        "b\u3000a\u3000d",  # ideographic spaces
        "bád",  # accent, precomposed
        "ba\u0301d",  # accent, combining
        "ⓑⓐⓓ",  # circled letters decompose to letters
        "Ｂ.\u200bａ - ｄ",  # all of it at once
    ],
)
def test_evasions_of_a_latin_term_are_found_with_their_span(disguised):
    content_filter = ContentFilter.from_terms(["bad"])
    text = f"this is {disguised}, isn't it"
    [match] = content_filter.scan(text)
    assert text[match.start : match.end] == disguised.strip()
    assert (match.term, match.category, match.action) == ("bad", "default", BLOCK)


@pytest.mark.parametrize(
    "disguised",
    [
        "敏感词",
        "敏 感 词",
        "敏*感*词",
        "敏，感。词",
        "敏\u200b感\u200b词",
        "敏-感_词",
        "敏\u3000感词",
    ],
)
def test_evasions_of_a_chinese_term_are_found_inside_chinese_text(disguised):
    content_filter = ContentFilter.from_terms(["敏感词"])
    text = f"请问这是{disguised}吗？"
    assert spans(content_filter, text) == [("敏感词", disguised)]


def test_terms_are_normalised_like_the_text():
    content_filter = ContentFilter.from_terms(["Ｂ-A-d", "敏 感"])
    assert spans(content_filter, "so bad") == [("Ｂ-A-d", "bad")]
    assert spans(content_filter, "很敏感") == [("敏 感", "敏感")]
    assert normalise("Ｂ-A\u200b-d  敏*感") == "bad敏感"


def test_offsets_point_into_the_original_text_among_expanding_characters():
    # "ﬁ" and "ß" normalise to two letters, dropped characters to none: offsets must not drift.
    content_filter = ContentFilter.from_terms(["bad", "敏感词", "fish"])
    text = "ﬁne ßtraße — “b.a.d” \u200b\u200b 敏\u200b感 词! ﬁsh"
    found = {m.term: text[m.start : m.end] for m in content_filter.scan(text)}
    assert found == {"bad": "b.a.d", "敏感词": "敏\u200b感 词", "fish": "ﬁsh"}


@pytest.mark.parametrize(
    ("text", "term"),
    [
        ("first class seats", "ass"),
        ("my assistant", "ass"),
        ("a passage", "ass"),
        ("hello there", "hell"),
        ("Hello", "hell"),
        ("hell2", "hell"),
        ("cl\u200bass", "ass"),  # an invisible character does not end a word
        ("classé", "ass"),
        ("isn't it", "tit"),  # separate words that happen to spell a term
        ("he'll go", "hell"),
        ("it's hit", "shit"),
        ("an al dente", "anal"),
        ("the cﬁ", "cf"),  # half of a ligature is not a word
    ],
)
def test_latin_terms_do_not_fire_inside_other_words(text, term):
    assert ContentFilter.from_terms([term]).scan(text) == []


@pytest.mark.parametrize(
    ("text", "span"),
    [
        ("you ass!", "ass"),
        ("(ASS)", "ASS"),
        ("a.s.s", "a.s.s"),
        ("a s s hole", "a s s"),
        ("这是ass的", "ass"),  # Chinese around a Latin term is a word boundary
        ("ａｓｓ", "ａｓｓ"),
        ("ａｓｓ\u0301", "ａｓｓ"),  # a combining mark after it does not make a longer word
    ],
)
def test_latin_terms_match_as_whole_words(text, span):
    assert spans(ContentFilter.from_terms(["ass"]), text) == [("ass", span)]


def test_whitespace_inside_a_latin_term_only_hides_it_between_single_letters():
    content_filter = ContentFilter.from_terms(["bad"])
    assert spans(content_filter, "b a d, b'a'd") == [("bad", "b a d"), ("bad", "b'a'd")]
    assert spans(content_filter, "ba d, b ad") == []  # read as two words, like "isn't it"
    assert spans(content_filter, "ba.d, b-ad") == [("bad", "ba.d"), ("bad", "b-ad")]


def test_a_phrase_matches_with_or_without_its_spaces():
    content_filter = ContentFilter.from_terms(["bad word"])
    for text in ["bad word", "bad-word", "badword", "BAD  WORD", "b a d w o r d"]:
        assert spans(content_filter, f"a {text}.") == [("bad word", text)]


def test_overlapping_terms_are_all_reported_in_order():
    content_filter = ContentFilter(
        [Term("敏感"), Term("敏感词", "politics", MASK), Term("感词", "x", FLAG), Term("词汇")]
    )
    text = "这些敏感词汇"
    found = [
        (m.term, text[m.start : m.end], m.category, m.action) for m in content_filter.scan(text)
    ]
    assert found == [
        ("敏感词", "敏感词", "politics", MASK),
        ("敏感", "敏感", "default", BLOCK),
        ("感词", "感词", "x", FLAG),
        ("词汇", "词汇", "default", BLOCK),
    ]


def test_from_terms_applies_one_category_and_action():
    content_filter = ContentFilter.from_terms(["foo", "bar"], category="pii", action=MASK)
    assert {(m.term, m.category, m.action) for m in content_filter.scan("foo bar")} == {
        ("foo", "pii", MASK),
        ("bar", "pii", MASK),
    }
    assert len(content_filter) == 2


def test_actions_accept_their_string_values():
    assert Term("x", action="flag").action is FLAG
    with pytest.raises(ValueError):
        Term("x", action="explode")


def test_terms_without_anything_to_match_are_ignored():
    content_filter = ContentFilter.from_terms(["***", " ", "ok"])
    assert [t.text for t in content_filter.ignored] == ["***", " "]
    assert spans(content_filter, "*** is ok") == [("ok", "ok")]


def test_an_empty_filter_finds_nothing():
    content_filter = ContentFilter([])
    assert content_filter.scan("anything") == []
    scanner = StreamScanner(content_filter)
    assert scanner.feed("any") == ("any", None)
    assert scanner.flush() == ""


def test_masking_replaces_each_counting_character_of_mask_terms_only():
    content_filter = ContentFilter(
        [Term("secret", action=MASK), Term("bad"), Term("密码", action=MASK)]
    )
    text = "my s.e.c.r.e.t and 密 码 are bad"
    assert content_filter.mask(text) == "my ****** and ** are bad"


def test_overlapping_mask_spans_merge():
    content_filter = ContentFilter.from_terms(["abcd", "cdef"], action=MASK)
    assert content_filter.mask("x abcdef y") == "x abcdef y"  # whole words only
    content_filter = ContentFilter.from_terms(["敏感词", "词汇"], action=MASK)
    assert content_filter.mask("这些敏感词汇吗") == "这些****吗"


def test_mask_text_takes_matches_from_anywhere():
    match = Match(term="x", start=2, end=5, category="c", action=MASK)
    assert mask_text("a b-c d", [match]) == "a ** d"
    assert mask_text("a b-c d", [Match("x", 2, 5, "c", BLOCK)]) == "a b-c d"


# Streaming ------------------------------------------------------------------------------------

STREAM_TERMS = [
    Term("bad"),
    Term("敏感词"),
    Term("secret", action=MASK),
    Term("机密", action=MASK),
    Term("hmm", action=FLAG),
    Term("hello world", action=MASK),
]
CLEAN_WORDS = ["the", "class", "assistant", "ba", "be", "敏感", "机", "well", "hell", "sec", "码"]


def random_splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def stream(
    content_filter: ContentFilter, chunks: list[str]
) -> tuple[str, Match | None, StreamScanner]:
    scanner = StreamScanner(content_filter)
    out = []
    for chunk in chunks:
        safe, blocked = scanner.feed(chunk)
        out.append(safe)
        if blocked is not None:
            return "".join(out), blocked, scanner
    out.append(scanner.flush())
    return "".join(out), scanner.blocked, scanner


def disguise(word: str, rng: random.Random) -> str:
    """Spell a term out: spaces between all its letters, or any mix of other separators."""
    letters = [rng.choice([c, c.upper()]) for c in word]
    if rng.random() < 0.3:
        return rng.choice([" ", "  "]).join(letters)
    separators = ["", ".", "-", "\u200b", "*", "_", "·"]
    return "".join(c + rng.choice(separators) for c in letters[:-1]) + letters[-1]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(CLEAN_WORDS) for _ in range(words))


@pytest.mark.parametrize("seed", range(40))
def test_a_stream_without_terms_comes_out_unchanged_whatever_the_chunks(seed):
    rng = random.Random(seed)
    content_filter = ContentFilter(STREAM_TERMS)
    text = sentence(rng, 30)
    assert content_filter.scan(text) == []
    for chunks in (list(text), random_splits(text, rng)):
        out, blocked, _ = stream(content_filter, chunks)
        assert (out, blocked) == (text, None)


@pytest.mark.parametrize("seed", range(40))
def test_a_blocked_term_is_caught_across_chunks_before_any_of_it_is_sent(seed):
    rng = random.Random(seed)
    content_filter = ContentFilter(STREAM_TERMS)
    before = sentence(rng, rng.randint(0, 10))
    term = rng.choice(["bad", "敏感词"])
    hidden = disguise(term, rng)
    text = f"{before} {hidden} {sentence(rng, 5)}"
    for chunks in (list(text), random_splits(text, rng)):
        out, blocked, scanner = stream(content_filter, chunks)
        assert blocked is not None and blocked.term == term
        assert text[blocked.start : blocked.end] == hidden
        assert out == text[: blocked.start]  # nothing of the term went out
        assert scanner.blocked == blocked
        assert scanner.feed("more") == ("", blocked)
        assert scanner.flush() == ""


@pytest.mark.parametrize("seed", range(40))
def test_streamed_masking_equals_masking_the_whole_text(seed):
    rng = random.Random(seed)
    content_filter = ContentFilter(STREAM_TERMS)
    words = [rng.choice([*CLEAN_WORDS, "secret", "机密", "hello world"]) for _ in range(20)]
    text = " ".join(disguise(w, rng) if rng.random() < 0.3 else w for w in words)
    assert all(m.action is MASK for m in content_filter.scan(text))
    expected = content_filter.mask(text)
    for chunks in (list(text), random_splits(text, rng)):
        out, blocked, _ = stream(content_filter, chunks)
        assert (out, blocked) == (expected, None)


def test_word_boundaries_hold_across_chunks():
    content_filter = ContentFilter.from_terms(["hell", "ass"])
    assert stream(content_filter, ["hel", "lo", " there"])[:2] == ("hello there", None)
    assert stream(content_filter, ["first cl", "ass"])[:2] == ("first class", None)
    out, blocked, _ = stream(content_filter, ["go to hel", "l", " now"])
    assert (out, blocked.term) == ("go to ", "hell")


def test_a_term_at_the_very_end_is_found_by_flush():
    content_filter = ContentFilter.from_terms(["bad"])
    scanner = StreamScanner(content_filter)
    assert scanner.feed("that is ") == ("that is ", None)
    assert scanner.feed("b a d") == ("", None)  # could be "b a dge"
    assert scanner.flush() == ""
    assert scanner.blocked is not None and scanner.blocked.start == len("that is ")


def test_text_that_could_start_a_term_is_held_then_released():
    content_filter = ContentFilter.from_terms(["secret"], action=MASK)
    scanner = StreamScanner(content_filter)
    assert scanner.feed("my se") == ("my ", None)
    assert scanner.feed("c") == ("", None)
    assert scanner.feed("tion") == ("section", None)
    assert scanner.feed(" secr") == (" ", None)
    assert scanner.feed("et!") == ("******!", None)
    assert scanner.flush() == ""


def test_a_mask_span_cut_by_the_hold_is_still_masked_when_the_rest_goes_out():
    # "词" ends a mask term and may begin a flag term: it is held after the rest went out masked.
    content_filter = ContentFilter([Term("敏感词", action=MASK), Term("词汇表", action=FLAG)])
    scanner = StreamScanner(content_filter)
    assert scanner.feed("这敏感词") == ("这**", None)
    assert scanner.feed("好") == ("*好", None)
    assert scanner.flush() == ""
    assert content_filter.mask("这敏感词好") == "这***好"


def test_the_held_back_tail_is_bounded():
    content_filter = ContentFilter.from_terms(["bad"])
    scanner = StreamScanner(content_filter)
    padding = " " * (STREAM_HOLD_LIMIT + 10)
    out = [scanner.feed("b")[0], *(scanner.feed(c)[0] for c in padding)]
    assert "".join(out[:STREAM_HOLD_LIMIT]) == ""  # "b" may begin "b   ...   a d"
    assert "".join(out) == "b" + padding  # past the limit it goes out


def test_flags_are_collected_once_per_term():
    content_filter = ContentFilter(
        [Term("hmm", action=FLAG), Term("嗯嗯", action=FLAG), Term("ok", action=FLAG)]
    )
    text = "hmm, 嗯 嗯 and h.m.m again 嗯嗯"
    out, blocked, scanner = stream(content_filter, list(text))
    assert (out, blocked) == (text, None)
    assert [(m.term, text[m.start : m.end]) for m in scanner.flags] == [
        ("hmm", "hmm"),
        ("嗯嗯", "嗯 嗯"),
    ]


# Scale: speed is shown by bench/content_filter.py, not by a timed test ------------------------


def test_ten_thousand_terms_find_exactly_the_planted_ones():
    rng = random.Random(7)
    words = {"".join(rng.choices(string.ascii_lowercase, k=rng.randint(5, 9))) for _ in range(5000)}
    words |= {"".join(chr(rng.randint(0x4E00, 0x62FF)) for _ in range(3)) for _ in range(5000)}
    content_filter = ContentFilter.from_terms(sorted(words))
    assert len(content_filter) == len(words)
    planted = sorted(words)[::2500]
    clean = "the quick brown fox jumps over the lazy dog’s back 12 34 "
    text = clean + "".join(f"{word} {clean}" for word in planted)
    found = sorted({m.term for m in content_filter.scan(text)})
    assert set(planted) <= set(found)
    assert not [m for m in content_filter.scan(clean * 70) if m.term not in clean]
