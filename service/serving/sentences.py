"""Split a text into sentences, and put translated sentences back in the same layout.

Why split at all: the model was trained on single sentences, and a sentence is the unit the
decoding loop batches; a long paragraph is several short batch items instead of one long one.

The rules are deliberately small and predictable rather than clever, and cover the scripts a
multilingual model (M2M-100, NLLB, mBART-50) reads:
* a line break always ends a sentence;
* inside a line, a sentence end (`.`, `!`, `?`, `…`, and the danda `।` `॥`, Arabic `؟` and
  Urdu `۔`, Ethiopic `።`, Armenian `։`, Burmese `။`), possibly followed by closing quotes or
  brackets, then whitespace, then something that can start a sentence ends a sentence. What can
  start one: an upper-case letter, a digit, an opening quote or bracket, `¿`, `¡`, or a letter
  of a script without case (Arabic, Devanagari, Hebrew, Thai, CJK...): there, no case tells a
  continuation from a start;
* a CJK full stop, exclamation or question mark (`。` `！` `？`) ends a sentence with no space
  after it (Chinese and Japanese write none);
* except after a common abbreviation (`M.`, `Mme.`, `Dr.`, `Sr.`, `Hr.`, ...), a
  single-letter initial, or a number of one or two digits (an ordinal: "am 3. Mai").

Two well-kept segmenters were measured against these rules and dropped
(docs/service.md, "Sentences"): sentencex 1.0.32 panics on some inputs (a no-break space after
an initial in French), and pysbd 0.3.4 takes quadratic time (8,000 characters of "a. " take
1.3 s); both also split "M. Dupont".

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
_ENDS = ".!?…।॥؟۔።։။"  # followed by whitespace
_CJK_ENDS = "。！？｡"  # followed by nothing: CJK writes no space between sentences
_CLOSERS = "\"'»”’)\\]」』）〕】》〉"
# Each run of ends is matched once, from its start (the lookbehinds), and never backtracked
# into (possessive quantifiers): linear time on a run of any length.
_END_OF_SENTENCE = re.compile(
    rf"(?<![{_ENDS}])[{_ENDS}]++[{_CLOSERS}]*+(\s++)"
    rf"|(?<![{_CJK_ENDS}])[{_CJK_ENDS}]++[{_CLOSERS}]*+(\s*+)"
)
_OPENERS = "«\"“‘'([¿¡-–—「『（〔【《〈"
# Titles and the like that end in a period but rarely end a sentence (lower case, no period).
_ABBREVIATIONS = frozenset(
    ["m", "mm", "mme", "mmes", "mlle", "mlles", "dr", "drs", "pr", "prof", "mgr", "st", "ste",
     "mr", "mrs", "ms", "jr", "sr", "cf", "vol", "pp", "fig", "vs",
     "sra", "srta", "dña", "dra", "hr", "hrn", "fr", "frl", "sig", "dott", "ing", "av", "nr"]
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
        spaced = match.group(1) is not None  # else a CJK end, which needs no space after it
        gap = 1 if spaced else 2
        if not following or (spaced and not _starts_sentence(following)):
            continue
        if spaced and _is_abbreviation(_last_word(line, start, match.start(gap))):
            continue
        sentences.append(line[start : match.start(gap)])
        separators.append(match.group(gap))
        start = match.end()
    sentences.append(line[start:])
    return sentences, separators


def _starts_sentence(character: str) -> bool:
    """An upper-case letter, a digit, an opener, or a letter of a script without case."""
    if character.isupper() or character.isdigit() or character in _OPENERS:
        return True
    return character.isalpha() and not character.islower()


def _last_word(line: str, start: int, end: int) -> str:
    """The word of line[start:end] that ends at `end` (the text before it ends a word:
    punctuation is always followed by whitespace here). Walks back over that word only, so
    that checking every candidate end costs the length of the line in all."""
    begin = end
    while begin > start and not line[begin - 1].isspace():
        begin -= 1
    return line[begin:end]


def _is_abbreviation(word: str) -> bool:
    """Is this word "Dr.", "J." or "3." (a title, an initial, an ordinal) rather than the end
    of a sentence?"""
    if not word.endswith(".") or word.endswith(".."):
        return False
    word = word.rstrip(".")
    if len(word) == 1 and word.isalpha():
        return True
    if len(word) <= 2 and word.isdigit():  # an ordinal, as German writes dates: "am 3. Mai"
        return True
    return word.lower() in _ABBREVIATIONS
