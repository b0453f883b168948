"""Split a text into sentences, and put translated sentences back in the same layout.

Why split at all: the model was trained on single sentences, and a sentence is the unit the
decoding loop batches; a long paragraph is several short batch items instead of one long one.

The rules are deliberately small and predictable rather than clever:
* a line break always ends a sentence;
* inside a line, `.`, `!`, `?` or `…` (possibly followed by closing quotes or brackets), then
  whitespace, then something that can start a sentence (an upper-case letter, a digit, an opening
  quote or bracket, `¿`, `¡`) ends a sentence;
* except after a common abbreviation (`M.`, `Mme.`, `Dr.`, ...) or a single-letter initial.

The whitespace between sentences (spaces, newlines, blank lines) is kept exactly; whitespace
before the first and after the last sentence is dropped.

It runs on every request, on text a client chose, so it must take linear time whatever the
text: a regular expression that can start a match anywhere inside a long run of `.` or of
spaces, and scan to the run's end each time, is quadratic (a few thousand dots took seconds).
So each pattern may only start where a run starts (a negative lookbehind), and never
backtracks into the run (possessive quantifiers); the abbreviation check looks at the last
word only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# How a text is cut before translation: at sentence ends and line breaks (the default), at
# sentence ends only (line breaks read as spaces), or not at all (the text is one sentence).
SplitMode = Literal["sentences", "no_newlines", "none"]

# Horizontal whitespace, a line break, then any whitespace: one separator.
_LINE_BREAK = re.compile(r"((?<![^\S\n])[^\S\n]*+\n\s*+)")
_END_OF_SENTENCE = re.compile(r"(?<![.!?…])[.!?…]++[\"'»”’)\]]*+(\s++)")
_OPENERS = "«\"“‘'([¿¡-–—"
# Titles and the like that end in a period but rarely end a sentence (lower case, no period).
_ABBREVIATIONS = frozenset(
    ["m", "mm", "mme", "mmes", "mlle", "mlles", "dr", "drs", "pr", "prof", "mgr", "st", "ste",
     "mr", "mrs", "ms", "jr", "sr", "cf", "vol", "pp", "fig", "vs"]
)  # fmt: skip


@dataclass(frozen=True)
class SplitText:
    """sentences[i] is followed by separators[i]; `join` restores the layout."""

    sentences: list[str]
    separators: list[str]

    def join(self, translations: list[str]) -> str:
        if len(translations) != len(self.sentences):
            raise ValueError(
                f"{len(translations)} translations for {len(self.sentences)} sentences"
            )
        parts: list[str] = []
        for index, translation in enumerate(translations):
            parts.append(translation)
            if index < len(self.separators):
                parts.append(self.separators[index])
        return "".join(parts)


def split_text(text: str, mode: SplitMode = "sentences") -> SplitText:
    if mode == "none":
        return SplitText([text.strip()], []) if text.strip() else SplitText([], [])
    if mode == "no_newlines":
        text = " ".join(text.splitlines())
    return split_sentences(text)


def split_sentences(text: str) -> SplitText:
    sentences: list[str] = []
    separators: list[str] = []
    pieces = _LINE_BREAK.split(text.strip())  # line, break, line, break, ..., line
    for position, piece in enumerate(pieces):
        if position % 2 == 1:
            separators.append(piece)
            continue
        line_sentences, line_separators = _split_line(piece)
        sentences.extend(line_sentences)
        separators.extend(line_separators)
    if sentences == [""]:  # an empty or whitespace-only text has no sentence at all
        return SplitText([], [])
    return SplitText(sentences, separators)


def _split_line(line: str) -> tuple[list[str], list[str]]:
    sentences: list[str] = []
    separators: list[str] = []
    start = 0
    for match in _END_OF_SENTENCE.finditer(line):
        following = line[match.end() : match.end() + 1]
        if not following or not _starts_sentence(following):
            continue
        if _is_abbreviation(_last_word(line, start, match.start(1))):
            continue
        sentences.append(line[start : match.start(1)])
        separators.append(match.group(1))
        start = match.end()
    sentences.append(line[start:])
    return sentences, separators


def _starts_sentence(character: str) -> bool:
    return character.isupper() or character.isdigit() or character in _OPENERS


def _last_word(line: str, start: int, end: int) -> str:
    """The word of line[start:end] that ends at `end` (the text before it ends a word:
    punctuation is always followed by whitespace here). Walks back over that word only, so
    that checking every candidate end costs the length of the line in all."""
    begin = end
    while begin > start and not line[begin - 1].isspace():
        begin -= 1
    return line[begin:end]


def _is_abbreviation(word: str) -> bool:
    """Is this word "Dr." or "J." (a title or an initial) rather than the end of a sentence?"""
    if not word.endswith(".") or word.endswith(".."):
        return False
    word = word.rstrip(".")
    if len(word) == 1 and word.isalpha():
        return True
    return word.lower() in _ABBREVIATIONS
