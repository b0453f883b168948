"""A glossary's entries as DeepL's API carries them: TSV or CSV text read into (source, target)
pairs by DeepL's rules, and written back as TSV. No HTTP here: the routes (glossaries.py) give
the errors their statuses.

DeepL's rules for an entry: a source term and a target term, neither empty; no source term twice
in one dictionary; no C0 or C1 control character and no Unicode line or paragraph separator in
a term (a tab and a line break are separators, nothing else); each term at most 1024 UTF-8
bytes (NMT_MAX_GLOSSARY_TERM_BYTES). Whitespace around a term is dropped, as DeepL's clients
drop it before they send the entries; blank lines are skipped. CSV follows RFC 4180 (a field
holding a comma or a quote is quoted, a quote in it doubled) and may give the dictionary's
language codes as a third and fourth column: a line for another pair is skipped, as DeepL does
with the multilingual CSV its website exports.

Every error names the line (from 1) it was found on, so that a client can fix a file of 100,000
entries; a line too many or a text too large is EntriesTooLarge, with the setting it passed.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from service.serving.settings import Settings

EntriesFormat = Literal["tsv", "csv"]
ENTRIES_FORMATS: tuple[EntriesFormat, ...] = ("tsv", "csv")

# What a term may not hold (DeepL: C0 and C1 controls, Unicode newlines), and lone surrogates
# (JSON can escape one; it is no character, and no database stores it). Tabs and line breaks
# are looked for separately: in the text they are separators, in a (CSV) term not allowed.
_CONTROLS = "\x00-\x08\x0b-\x0c\x0e-\x1f\x80-\x9f\u2028\u2029\ud800-\udfff"
# In the text as a whole: those, and a carriage return that does not end a line.
_FORBIDDEN_IN_TEXT = re.compile(f"[{_CONTROLS}]|\r(?!\n)")
# In a term (or a name): those, and the separators.
_FORBIDDEN_IN_TERM = re.compile(f"[{_CONTROLS}\t\n\r]")
_NAMES = {
    "\x00": "a NUL byte (U+0000)",
    "\t": "a tab",
    "\n": "a line break",
    "\r": "a carriage return",
    "\u2028": "a line separator (U+2028)",
    "\u2029": "a paragraph separator (U+2029)",
}


@dataclass(frozen=True)
class EntryLimits:
    """The limits one dictionary's entries are read under (NMT_MAX_GLOSSARY_*)."""

    max_entries: int
    max_term_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> EntryLimits:
        return cls(settings.max_glossary_entries, settings.max_glossary_term_bytes)


class InvalidEntries(ValueError):
    """Entries that break DeepL's rules; `line` (from 1) where one line is to blame."""

    def __init__(self, reason: str, line: int | None = None) -> None:
        self.reason, self.line = reason, line
        super().__init__(reason if line is None else f"line {line}: {reason}")


class EntriesTooLarge(ValueError):
    """More entries, or more bytes of entries, than a setting allows."""

    def __init__(self, what: str, count: int, limit: int, setting: str) -> None:
        self.count, self.limit, self.setting = count, limit, setting
        super().__init__(f"{what}; the limit is {limit} ({setting})")


def describe(character: str) -> str:
    """A character a term may not hold, as a message names it."""
    if character in _NAMES:
        return _NAMES[character]
    if "\ud800" <= character <= "\udfff":
        return f"a lone surrogate (U+{ord(character):04X}), which is not Unicode text"
    return f"the control character U+{ord(character):04X}"


def forbidden_character(text: str) -> str | None:
    """The first character of `text` that a term (or a glossary's name) may not hold."""
    found = _FORBIDDEN_IN_TERM.search(text)
    return None if found is None else found.group()


def utf8_size(text: str) -> int:
    """The bytes of `text` in UTF-8 (a lone surrogate counted as its three bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def check_text(text: str, max_bytes: int) -> None:
    """The whole entries text of a request within NMT_MAX_GLOSSARY_BYTES, before it is read."""
    size = utf8_size(text)
    if size > max_bytes:
        raise EntriesTooLarge(
            f"the entries are {size} bytes in UTF-8", size, max_bytes, "NMT_MAX_GLOSSARY_BYTES"
        )


def read_entries(
    text: str,
    entries_format: EntriesFormat,
    source_lang: str,
    target_lang: str,
    limits: EntryLimits,
) -> tuple[tuple[str, str], ...]:
    """The entries of one dictionary (`source_lang` -> `target_lang`, base codes), in the order
    given; InvalidEntries or EntriesTooLarge on the first line that breaks a rule. CPU work in
    proportion to the text: call it off the event loop for a long one."""
    # A byte order mark is the file's (Excel saves "CSV UTF-8" with one), not the first term's.
    text = text.removeprefix("\ufeff")
    found = _FORBIDDEN_IN_TEXT.search(text)
    if found is not None:  # before the parser sees it (csv reads a NUL as any character)
        line = text.count("\n", 0, found.start()) + 1
        raise InvalidEntries(f"holds {describe(found.group()[0])}", line)
    tsv = entries_format == "tsv"
    rows = _tsv_rows(text) if tsv else _csv_rows(text, source_lang, target_lang)
    entries: dict[str, str] = {}
    lines: dict[str, int] = {}
    for line, (source, target) in rows:
        source = _term(source, "source", line, limits)
        target = _term(target, "target", line, limits)
        if source in entries:
            raise InvalidEntries(
                f"the source term {source!r} is already the source term of line {lines[source]}",
                line,
            )
        if len(entries) == limits.max_entries:
            raise EntriesTooLarge(
                f"a dictionary has more than {limits.max_entries} entries (line {line} is one "
                "too many)",
                len(entries) + 1,
                limits.max_entries,
                "NMT_MAX_GLOSSARY_ENTRIES",
            )
        entries[source], lines[source] = target, line
    if not entries:
        raise InvalidEntries("there are no entries (every line is blank)")
    return tuple(entries.items())


def write_tsv(entries: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> str:
    """Entries as DeepL returns them: `source<TAB>target`, one per line."""
    return "\n".join(f"{source}\t{target}" for source, target in entries)


def _tsv_rows(text: str) -> Iterator[tuple[int, tuple[str, str]]]:
    for line, row in enumerate(text.split("\n"), 1):
        row = row.removesuffix("\r")
        if not row.strip():
            continue
        terms = row.split("\t")
        if len(terms) == 1:
            raise InvalidEntries("has no tab between a source and a target term", line)
        if len(terms) > 2:
            raise InvalidEntries(
                f"has {len(terms) - 1} tabs; an entry is a source term, one tab and a target "
                "term (a term may not hold a tab)",
                line,
            )
        yield line, (terms[0], terms[1])


def _csv_rows(
    text: str, source_lang: str, target_lang: str
) -> Iterator[tuple[int, tuple[str, str]]]:
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    while True:
        line = reader.line_num + 1  # where the next record starts (a quoted field may span)
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            reason = str(error)
            if reason == "unexpected end of data":
                reason = "a quoted field is not closed (a quote is missing)"
            raise InvalidEntries(f"is not valid CSV: {reason}", line) from None
        if not any(field.strip() for field in row):
            continue
        if len(row) not in (2, 4):
            raise InvalidEntries(
                f"has {len(row)} columns; an entry is a source and a target term, optionally "
                "followed by their language codes (4 columns)",
                line,
            )
        if len(row) == 4:
            pair = tuple(code.strip().split("-")[0].lower() for code in row[2:])
            if not all(pair):
                raise InvalidEntries("has an empty language code", line)
            if pair != (source_lang, target_lang):
                continue  # another dictionary's line
        yield line, (row[0], row[1])


def clean_term(term: str) -> tuple[str, str | None]:
    """A term by DeepL's rules (stored entries and inline terms alike): whitespace around it
    dropped; and what is wrong with it ("holds a tab", "is empty"), or None."""
    character = forbidden_character(term)  # a quoted CSV field may hold a separator
    if character is not None:
        return term, f"holds {describe(character)}"
    term = term.strip()
    return term, None if term else "is empty"


def _term(term: str, which: str, line: int, limits: EntryLimits) -> str:
    term, problem = clean_term(term)
    if problem is not None:
        raise InvalidEntries(f"the {which} term {problem}", line)
    size = utf8_size(term)
    if size > limits.max_term_bytes:
        raise InvalidEntries(
            f"the {which} term is {size} bytes in UTF-8; the limit is {limits.max_term_bytes} "
            "(NMT_MAX_GLOSSARY_TERM_BYTES)",
            line,
        )
    return term
