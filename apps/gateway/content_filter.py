"""Find sensitive terms in text: Aho-Corasick over a normalised form that evasions do not change.

No Django here: selectors.py builds a ContentFilter from the database, and the gateway scans
prompts (ContentFilter.scan) and streamed completions (StreamScanner) with it on the event loop.

Normalisation is per character, so that text goes through `str.translate` over a cached table: NFKD,
casefold, NFKD again; then combining marks, separators, punctuation, symbols, control and format
characters (the zero-width ones among them) and the invisible Hangul fillers are dropped. Terms
and text go through the same table: "B.a\u200bd", "b a d" and the full-width letters of "bad" all
read "bad"; "敏*感*词" reads "敏感词". Latin terms also match only as whole words: see
_at_word_boundary and _split_like_term.
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum
from itertools import accumulate, pairwise

import ahocorasick

DEFAULT_CATEGORY = "default"

# A masked span becomes one of these per character that counts (separators inside it vanish),
# so the output does not depend on how the term was disguised: "b.a.d" and "B\u200bAD" give "***".
MASK_CHAR = "*"

# The stream holds back at most this many characters while they could still start a term. Real
# terms with separators between their characters are far shorter; past it the oldest characters
# go out, so that a completion of padding cannot make every chunk rescan an ever longer tail.
STREAM_HOLD_LIMIT = 1024

# Real text uses a few thousand distinct characters; each is normalised once and cached. Past
# this many, new ones are computed on each use instead, so that a prompt made of every code
# point cannot grow the process's tables without bound.
FOLD_CACHE_LIMIT = 65_536

# Text that is not all ASCII is translated in blocks of this many characters: every call of
# `str.translate` starts on CPython's ASCII fast path again, so that one curly quote does not send
# the rest of an English prompt down the slow path (measured: 4 KB in ~0.1 ms instead of ~0.3).
# The blocks' lengths then map a hit back to the text without a Python loop over all of it.
TRANSLATE_BLOCK = 128

# pyahocorasick finds a child node by scanning the node's children one by one, so a root with a
# child per first character of 5,000 Chinese terms costs thousands of comparisons per character
# of text. Non-ASCII characters therefore enter the automaton as two symbols, their code point's
# high and low byte, from two ranges apart from ASCII and each other: at most 256 children a node.
_HIGH_SYMBOLS = 0x0100  # 0x0100-0x11FF
_LOW_SYMBOLS = 0x1200  # 0x1200-0x12FF

# Letters by category that render as nothing and are used to pad words: the Hangul fillers.
_INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")

# Inside a word in English and French ("isn't", "l'homme"); a gap of these separates words.
_APOSTROPHES = frozenset("'\u2019\uff07")

# Scripts written without spaces between words: a Latin term next to them is still a word.
_UNSPACED_RANGES = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x2E80, 0x2FDF),  # CJK radicals
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x312F),  # Bopomofo
    (0x31A0, 0x31FF),  # Bopomofo extended, Katakana extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0x20000, 0x3FFFF),  # CJK extensions B onwards
)


class FilterAction(StrEnum):
    BLOCK = "block"  # refuse the request, or end the stream with finish_reason "content_filter"
    MASK = "mask"  # replace the term's characters with MASK_CHAR
    FLAG = "flag"  # let it through; report it


@dataclass(frozen=True, slots=True)
class Term:
    text: str
    category: str = DEFAULT_CATEGORY
    action: FilterAction = FilterAction.BLOCK

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", FilterAction(self.action))


@dataclass(frozen=True, slots=True)
class Match:
    """A term found in text; text[start:end] is the span, separators inside it included."""

    term: str
    start: int
    end: int
    category: str
    action: FilterAction


def _dropped(char: str) -> bool:
    category = unicodedata.category(char)
    return category[0] in "MZPS" or category in ("Cc", "Cf") or char in _INVISIBLE_LETTERS


def fold_char(char: str) -> str:
    """Return the form of one character that terms are matched on; '' when it does not count."""
    decomposed = unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", char).casefold())
    kept = "".join(c for c in decomposed if not _dropped(c))
    # NFKD splits Hangul syllables into jamo; put them back so that both stay one character.
    return kept if kept.isascii() else unicodedata.normalize("NFC", kept)


def normalise(text: str) -> str:
    """Return text as terms are matched on it, readable (the automaton sees it encoded)."""
    return "".join(map(fold_char, text))


def _symbols(folded: str) -> str:
    return "".join(
        c if c.isascii() else chr(_HIGH_SYMBOLS + (ord(c) >> 8)) + chr(_LOW_SYMBOLS + ord(c) % 256)
        for c in folded
    )


class _CachedTable(dict):
    """Code point -> a value computed on first use; a `str.translate` table."""

    def compute(self, char: str):
        raise NotImplementedError

    def __missing__(self, code: int):
        value = self.compute(chr(code))
        if len(self) < FOLD_CACHE_LIMIT:
            self[code] = value
        return value


class _FoldTable(_CachedTable):
    """The character's symbols; None (not '') when dropped, to keep translate's ASCII fast path."""

    def compute(self, char: str) -> str | None:
        return _symbols(fold_char(char)) or None


class _WidthTable(_CachedTable):
    def compute(self, char: str) -> int:
        return len(_FOLD[ord(char)] or "")


class _Kind(IntEnum):
    IGNORABLE = 0  # marks, format characters, fillers: invisible, skipped at word boundaries
    SEPARATOR = 1  # space, punctuation, symbols: a word boundary
    WORD = 2  # a letter or digit of a script written with spaces between words
    OTHER = 3  # an ideograph, kana and the like: a boundary for Latin terms


def _unspaced(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in _UNSPACED_RANGES)


class _KindTable(_CachedTable):
    def compute(self, char: str) -> _Kind:
        folded = fold_char(char)
        if not folded:
            category = unicodedata.category(char)
            invisible = category[0] == "M" or category == "Cf" or char in _INVISIBLE_LETTERS
            return _Kind.IGNORABLE if invisible else _Kind.SEPARATOR
        if any(c.isalnum() and not _unspaced(c) for c in folded):
            return _Kind.WORD
        return _Kind.OTHER


_FOLD = _FoldTable()
_WIDTH = _WidthTable()
_KIND = _KindTable()


class _Symbols:
    """A text as the automaton reads it, and the way back from a symbol to its character."""

    __slots__ = ("_block_ends", "_blocks", "_char_ends", "symbols", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._blocks: list[str] | None = None
        if text.isascii():
            self.symbols = text.translate(_FOLD)  # one call: the fast path covers all of it
        else:
            self._blocks = [
                text[i : i + TRANSLATE_BLOCK].translate(_FOLD)
                for i in range(0, len(text), TRANSLATE_BLOCK)
            ]
            self.symbols = "".join(self._blocks)
        self._block_ends: list[int] | None = None
        self._char_ends: dict[int, list[int]] = {}

    def char_at(self, symbol: int) -> int:
        """Return the index in text of the character that produced symbols[symbol]."""
        return self.char_bounds(symbol)[0]

    def char_bounds(self, symbol: int) -> tuple[int, int, int]:
        """Return that character's index, and where its symbols begin and end (exclusive)."""
        if self._block_ends is None:
            blocks = self._blocks or [
                self.text[i : i + TRANSLATE_BLOCK].translate(_FOLD)
                for i in range(0, len(self.text), TRANSLATE_BLOCK)
            ]
            self._block_ends = list(accumulate(map(len, blocks)))
        block = bisect_right(self._block_ends, symbol)
        ends = self._char_ends.get(block)
        if ends is None:
            base = self._block_ends[block - 1] if block else 0
            chars = self.text[block * TRANSLATE_BLOCK : (block + 1) * TRANSLATE_BLOCK]
            ends = list(accumulate(map(_WIDTH.__getitem__, map(ord, chars)), initial=base))[1:]
            self._char_ends[block] = ends
        within = bisect_right(ends, symbol)
        begins = ends[within - 1] if within else (self._block_ends[block - 1] if block else 0)
        return block * TRANSLATE_BLOCK + within, begins, ends[within]


def _word_bounded(key: str) -> bool:
    """Latin-script terms match whole words only: "ass" must not fire inside "class"."""
    return key.isascii() and key.isalnum()


def _gap_positions(term: str) -> frozenset[int]:
    """Return the symbol offsets at which a term has separators of its own ("bad word": 3)."""
    gaps, position = set(), 0
    for char in term:
        if _KIND[ord(char)] is _Kind.SEPARATOR:
            gaps.add(position)
        position += _WIDTH[ord(char)]
    return frozenset(gaps - {0, position})


class ContentFilter:
    """Sensitive terms compiled into one automaton; immutable, shared by every request."""

    def __init__(self, terms: Iterable[Term], *, version: int = 0) -> None:
        grouped: dict[str, dict[Term, frozenset[int]]] = {}
        ignored: list[Term] = []
        for term in terms:
            key = term.text.translate(_FOLD)
            if not key:
                ignored.append(term)  # only separators: it could match anything or nothing
                continue
            grouped.setdefault(key, {})[term] = _gap_positions(term.text)
        keys = sorted(grouped)
        self._automaton = ahocorasick.Automaton()
        # Sorted, so that ASCII comes first among each node's children: English text finds its
        # way through the root without scanning past the Chinese first characters.
        for key in keys:
            value = (len(key), _word_bounded(key), tuple(grouped[key].items()))
            self._automaton.add_word(key, value)
        if grouped:
            self._automaton.make_automaton()
        # Whole terms that begin a longer one: at the end of a stream they may still grow.
        self._extendable = frozenset(key for key, after in pairwise(keys) if after.startswith(key))
        self._longest = max(map(len, grouped), default=0)
        self._size = sum(map(len, grouped.values()))
        self.version = version
        self.ignored = tuple(ignored)

    @classmethod
    def from_terms(
        cls,
        terms: Iterable[str],
        *,
        category: str = DEFAULT_CATEGORY,
        action: FilterAction = FilterAction.BLOCK,
        version: int = 0,
    ) -> ContentFilter:
        return cls((Term(text, category, action) for text in terms), version=version)

    def __len__(self) -> int:
        return self._size

    def scan(self, text: str) -> list[Match]:
        """Return every term in text, overlapping ones included, ordered by start."""
        return self._scan(_Symbols(text), before="", final=True)

    def mask(self, text: str) -> str:
        """Return text with its "mask" terms masked; other actions are the caller's business."""
        return mask_text(text, self.scan(text))

    def _scan(self, source: _Symbols, *, before: str, final: bool) -> list[Match]:
        """Scan text that follows `before`; when not `final`, more text may follow it."""
        if not self._longest:
            return []
        text = source.text
        matches: list[Match] = []
        for last, (length, bounded, terms) in self._automaton.iter(source.symbols):
            first = last - length + 1
            start, begins, _ = source.char_bounds(first)
            end, _, ends = source.char_bounds(last)
            end += 1
            if bounded and (
                # A ligature's half is not a word: "cf" is not in "cﬁ".
                begins != first
                or ends != last + 1
                or not _at_word_boundary(text, start, end, before=before, final=final)
            ):
                continue
            matches.extend(
                Match(term.text, start, end, term.category, term.action)
                for term, gaps in terms
                if not bounded or _split_like_term(text[start:end], gaps)
            )
        matches.sort(key=lambda m: (m.start, -m.end))
        return matches

    def _hold_start(self, source: _Symbols) -> int:
        """Return where the longest tail of text that could still become a term begins.

        A whole term at the end is final (its match is acted on now) unless a longer term starts
        with it, or it must stand as a word and the next character is not known yet.
        """
        symbols = source.symbols
        size = len(symbols)
        for length in range(min(size, self._longest), 0, -1):
            tail = symbols[size - length :]
            if not self._automaton.match(tail):
                continue
            start = _tail_start(source.text, length)
            if self._automaton.exists(tail) and tail not in self._extendable:
                _, bounded, _ = self._automaton.get(tail)
                if not bounded or _ends_in_separator(source.text):
                    continue
            return start
        return len(source.text)


def _tail_start(text: str, symbols: int) -> int:
    """Return where the characters that produce the last `symbols` symbols of text begin.

    A walk back from the end: the stream's pending text is short, its tail shorter.
    """
    index = len(text)
    while symbols > 0:
        index -= 1
        symbols -= _WIDTH[ord(text[index])]
    return index


def _ends_in_separator(text: str) -> bool:
    """Tell whether a visible separator follows the last character that counts."""
    for char in reversed(text):
        kind = _KIND[ord(char)]
        if kind is _Kind.SEPARATOR:
            return True
        if kind is not _Kind.IGNORABLE:
            return False
    return False


def _at_word_boundary(text: str, start: int, end: int, *, before: str, final: bool) -> bool:
    """Tell whether text[start:end] stands alone: no letter or digit touches either side.

    Invisible characters are skipped, so "cl\u200bass" is still one word. When the text is not
    final and the span reaches its end, the next character is unknown: not a match yet.
    """
    i = start - 1
    while i >= 0 and _KIND[ord(text[i])] is _Kind.IGNORABLE:
        i -= 1
    previous = text[i] if i >= 0 else before
    if previous and _KIND[ord(previous)] is _Kind.WORD:
        return False
    j, size = end, len(text)
    while j < size and _KIND[ord(text[j])] is _Kind.IGNORABLE:
        j += 1
    if j == size:
        return final
    return _KIND[ord(text[j])] is not _Kind.WORD


def _split_like_term(span: str, gaps: frozenset[int]) -> bool:
    """Tell whether a Latin term's span is the term spelled out, not words that happen to join.

    Whitespace and apostrophes inside a span are accepted between single characters ("b a d",
    "b'a'd") or where the term has a separator itself; elsewhere they mean separate words: "tit"
    is not in "isn't it", nor "hell" in "he'll". Other separators ("b.ad", "ba-d") always count.
    """
    runs: list[int] = []  # characters between separators
    weak: list[int] = []  # symbol offsets of whitespace-or-apostrophe gaps
    run = position = 0
    gap: bool | None = None  # inside a gap: True while it is only whitespace and apostrophes
    for char in span:
        kind = _KIND[ord(char)]
        if kind is _Kind.IGNORABLE:
            continue
        if kind is _Kind.SEPARATOR:
            gap = (gap is not False) and (char.isspace() or char in _APOSTROPHES)
            continue
        if gap is not None:
            runs.append(run)
            if gap:
                weak.append(position)
            run, gap = 0, None
        run += 1
        position += _WIDTH[ord(char)]
    runs.append(run)
    return not weak or all(r == 1 for r in runs) or gaps.issuperset(weak)


def _masked(span: str) -> str:
    return MASK_CHAR * sum(1 for c in span if _FOLD[ord(c)])


def _mask_spans(text: str, spans: Iterable[tuple[int, int]]) -> str:
    pieces: list[str] = []
    position = 0
    for start, end in sorted(spans):
        start = max(start, position)
        if end <= start:
            continue
        pieces.append(text[position:start])
        pieces.append(_masked(text[start:end]))
        position = end
    if not pieces:
        return text
    pieces.append(text[position:])
    return "".join(pieces)


def mask_text(text: str, matches: Iterable[Match]) -> str:
    """Return text with the span of each "mask" match replaced by MASK_CHARs."""
    return _mask_spans(text, ((m.start, m.end) for m in matches if m.action is FilterAction.MASK))


class StreamScanner:
    """Scan one choice of a streamed completion, chunk by chunk.

    Text that could still be the beginning of a term is held back until later chunks decide it,
    so terms split across chunks, with separators in between, are found before any of them is
    sent. Offsets in the matches count characters of the whole stream as the model produced it.
    """

    def __init__(self, content_filter: ContentFilter) -> None:
        self._filter = content_filter
        self._pending = ""
        self._offset = 0  # stream offset of self._pending[0]
        self._before = ""  # the last emitted character that is not invisible
        self._mask_until = 0  # stream offset up to which emitted text is masked
        self._flags: dict[str, Match] = {}
        self.blocked: Match | None = None

    @property
    def flags(self) -> list[Match]:
        """The "flag" terms seen so far, each term once."""
        return list(self._flags.values())

    def feed(self, text: str) -> tuple[str, Match | None]:
        """Take a chunk; return the text now safe to send, and the "block" match if one is found.

        After a block the stream is over: the caller ends it with finish_reason "content_filter".
        """
        if self.blocked is not None:
            return "", self.blocked
        self._pending += text
        return self._advance(final=False)

    def flush(self) -> str:
        """Return what was held back, at the end of the stream; check `blocked` afterwards."""
        if self.blocked is not None:
            return ""
        safe, _ = self._advance(final=True)
        return safe

    def _advance(self, *, final: bool) -> tuple[str, Match | None]:
        pending = self._pending
        source = _Symbols(pending)
        found = self._filter._scan(source, before=self._before, final=final)
        offset = self._offset
        matches = [replace(m, start=m.start + offset, end=m.end + offset) for m in found]
        for match in matches:
            if match.action is FilterAction.FLAG:
                self._flags.setdefault(match.term, match)
            elif match.action is FilterAction.BLOCK:  # matches come by start: the first one
                self.blocked = match
                return self._emit(match.start - offset, matches), match
        cut = len(pending) if final else self._filter._hold_start(source)
        cut = max(cut, len(pending) - STREAM_HOLD_LIMIT)
        return self._emit(cut, matches), None

    def _emit(self, cut: int, matches: list[Match]) -> str:
        """Release pending[:cut], masked; a mask span that runs past the cut stays owed."""
        if not cut:
            return ""
        offset = self._offset
        spans = [(0, self._mask_until - offset)] if self._mask_until > offset else []
        for match in matches:
            if match.action is FilterAction.MASK and match.start - offset < cut:
                spans.append((match.start - offset, match.end - offset))
                self._mask_until = max(self._mask_until, match.end)
        emitted = self._pending[:cut]
        for char in reversed(emitted):
            if _KIND[ord(char)] is not _Kind.IGNORABLE:
                self._before = char
                break
        self._pending = self._pending[cut:]
        self._offset += cut
        if not spans:
            return emitted
        return _mask_spans(emitted, ((start, min(end, cut)) for start, end in spans))
