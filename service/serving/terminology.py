"""A glossary's terms found in a sentence, and what the decoder must then write.

A source term matches where its words appear in the text in a row: case-insensitively and
whatever the Unicode form (words compared by NFKC and `str.casefold`, as the tokenizer reads
text: "café" written with a combining accent is "café", a fullwidth "ｃｈｉｅｎ" is "chien"), on
word boundaries (a word is a run of letters, digits and combining marks, so that neither an
accent nor a Devanagari vowel sign splits one; every other non-space character is a word of
its own, so "l'herbe" holds "herbe"), longest match first, and the earliest start wins an
overlap. What a match asks of the decoder is a constraint: the
target term's tokens, and the source tokens it translates (so that it is written where the
decoder looks at them: runtime/strategies.ConstrainedBeamSearch).

Looking terms up costs a dictionary probe per word of the text, whatever the glossary's size:
terms are indexed by their first word.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from service.runtime.tokenizer import BundleTokenizer
from service.serving.errors import InvalidInput


def _ranges(characters: Iterable[int]) -> str:
    """A regular expression's character class body for these code points, as ranges."""
    found: list[list[int]] = []
    for code in characters:
        if found and code == found[-1][1] + 1:
            found[-1][1] = code
        else:
            found.append([code, code])
    return "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in found)


# Combining marks (Unicode category M): part of the word they follow.
_MARKS = _ranges(c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c))[0] == "M")
WORD = re.compile(rf"[\w{_MARKS}]+|[^\w\s{_MARKS}]")


def _compared(word: str) -> str:
    """A word as matches compare it: its compatibility form, case folded."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", word).casefold())


@dataclass(frozen=True)
class TermMatch:
    start: int  # character offsets of the source term in the text, [start, end)
    end: int
    source: str  # as the glossary has it
    target: str


def _words(text: str) -> list[tuple[str, int, int]]:
    return [(_compared(m.group()), m.start(), m.end()) for m in WORD.finditer(text)]


class Terminology:
    """The entries of one glossary dictionary (source term, target term), ready to be found."""

    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        # first word -> [(all its words, source, target)], longest first
        self.by_first: dict[str, list[tuple[tuple[str, ...], str, str]]] = {}
        for source, target in entries:
            words = tuple(word for word, _, _ in _words(source))
            if words:
                self.by_first.setdefault(words[0], []).append((words, source, target))
        for terms in self.by_first.values():
            terms.sort(key=lambda term: -len(term[0]))

    def __len__(self) -> int:
        return sum(len(terms) for terms in self.by_first.values())

    def find(self, text: str) -> list[TermMatch]:
        """The terms in `text`, in order, none overlapping another."""
        words = _words(text)
        found: list[TermMatch] = []
        position = 0
        while position < len(words):
            match = None
            for term, source, target in self.by_first.get(words[position][0], ()):
                end = position + len(term)
                if tuple(word for word, _, _ in words[position:end]) == term:
                    match = TermMatch(words[position][1], words[end - 1][2], source, target)
                    position = end
                    break
            if match is None:
                position += 1
            else:
                found.append(match)
        return found


@dataclass(frozen=True)
class SentenceTerms:
    """What a sentence's matches ask of the decoder: per term its target tokens and the
    source tokens [start, end) it translates; and the target terms, to check the output."""

    constraints: tuple[tuple[int, ...], ...]
    spans: tuple[tuple[int, int], ...]
    targets: tuple[str, ...]


def sentence_terms(
    tokenizer: BundleTokenizer,
    terminology: Terminology,
    sentence: str,
    source_lang: str | None = None,
    untranslated: Sequence[tuple[int, int]] = (),
) -> SentenceTerms | None:
    """What the glossary terms in `sentence` ask of the decoder (None: it has none): each
    target term's tokens, and the source tokens of encode([sentence]) it translates. A match
    that overlaps an `untranslated` stretch [start, end) of the sentence (words the client
    left untranslated in its markup, which come back as they were) asks for nothing.

    A match that no source piece covers (characters the tokenizer drops, such as a zero-width
    space ending the text) is no term of the sentence the model reads: it is left out. A
    target term of which the tokenizer keeps nothing (a zero-width space, a byte-order mark,
    SentencePiece's own "▁") cannot be written: InvalidInput, naming the entry."""
    matches = [
        match
        for match in terminology.find(sentence)
        if not any(match.start < end and start < match.end for start, end in untranslated)
    ]
    if not matches:
        return None
    spans = tokenizer.source_spans(sentence, [(m.start, m.end) for m in matches], source_lang)
    read = [(m, span) for m, span in zip(matches, spans, strict=True) if span[1] > span[0]]
    if not read:
        return None
    constraints = tuple(tokenizer.encode_target(m.target) for m, _ in read)
    for (match, _), tokens in zip(read, constraints, strict=True):
        if not tokens:
            raise InvalidInput(
                "glossary_term_unwritable",
                f"entry {match.source!r} -> {match.target!r}: the model can write nothing of "
                "its target term (its tokenizer drops every character of it)",
                field="glossary",
            )
    return SentenceTerms(
        constraints, tuple(span for _, span in read), tuple(m.target for m, _ in read)
    )


def kept(translation: str, targets: Iterable[str]) -> int:
    """How many of the target terms the translation contains (case-insensitively, whatever the
    Unicode form: the tokenizer writes a term in its compatibility form)."""
    folded = _compared(translation)
    return sum(_compared(target) in folded for target in targets)
