"""Plain text (.txt): UTF-8 (with or without a byte order mark) or UTF-16 with one.

A paragraph (lines between blank lines) is one segment, not each line, because text files are
often hard-wrapped (mail, READMEs, Project Gutenberg books at 70-odd columns): translated line
by line, a sentence cut at the wrap is two fragments ("Un homme marche dans" / "la rue." gives
"A man is walking in" / "The street..."). Nor is every line break a point inside one long
sentence: a title line, a list item or a line of verse would then be read as part of the next
sentence, and the model drops words at such seams ("Titre\\nUn homme..." loses its title). So
each line break is judged:

- a *wrap* when the paragraph is set at a width (its longest line has 40 characters or more)
  and the next line's first word would not have fitted on this line: the lines are read as one
  text, and the translation is wrapped again at the same width (lines of a new language never
  break where the old ones did);
- a *break* otherwise (a short line, a list item, verse): the segment holds a line break there,
  which ends a sentence for the model (split="sentences"), and the translation keeps it.

Each line's indentation and a list item's marker (`- `, `* `, `1. `: the model drops a
leading dash) stay out of the segment and are kept, as are the file's line endings (`\\n`,
`\\r\\n`, `\\r`, each line its own); blank lines are copied as they are. Of the control characters
XML cannot hold, a form feed or vertical tab at a line's edge is kept as indentation is; any
other (or one inside a line) leaves its line untranslated, copied as it is.

The helpers after the decoding ones (attach_spaces, hug_words, check_characters...) are shared
with the subtitle and OpenDocument adapters.
"""

from __future__ import annotations

import codecs
import re
from bisect import bisect_left
from collections.abc import Hashable
from dataclasses import dataclass
from itertools import pairwise
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from service.documents.formats.base import (
    DocumentFormat,
    DocumentLimits,
    DocumentRefused,
    Extracted,
)
from service.documents.markup import MarkupOptions

_WRAP_WIDTH = 40  # a paragraph whose longest line is shorter is not taken as hard-wrapped
_LINE = re.compile(r"([^\r\n]*)(\r\n|\r|\n|$)")
# A list item's marker, kept out of the segment as indentation is (the model drops a leading
# "- "), and never the continuation of the line before.
_LIST_ITEM = re.compile(r"(?:[-*•–—+]|\d{1,3}[.)]|[a-z]\))\s+(?=\S)")
# Characters XML 1.0 cannot hold: a segment must be an XML fragment.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


# --- Decoding, shared with the subtitle formats -------------------------------------------


@dataclass(frozen=True)
class Encoding:
    """How a text file was written, so that it is written back the same way."""

    codec: str  # "utf-8", "utf-16-le", "utf-16-be"
    bom: bytes

    def encode(self, text: str) -> bytes:
        return self.bom + text.encode(self.codec)


_BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def decode(data: bytes, what: str) -> tuple[str, Encoding]:
    """The text of a file in UTF-8 (byte order mark or not) or UTF-16 with a byte order mark;
    DocumentRefused for anything else, saying what to do, rather than a guessed code page."""
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        raise DocumentRefused(f"the {what} is UTF-32 text: save it as UTF-8 or UTF-16")
    codec, bom = "utf-8", b""
    for mark, name in _BOMS:
        if data.startswith(mark):
            codec, bom = name, mark
            break
    try:
        text = data[len(bom) :].decode(codec)
    except UnicodeDecodeError as error:
        if bom:
            raise DocumentRefused(
                f"the {what} declares {codec} but is not valid {codec} (byte {error.start})"
            ) from None
        raise DocumentRefused(
            f"the {what} is not UTF-8 text (byte {error.start} is not UTF-8): save it as "
            "UTF-8, or UTF-16 with a byte order mark"
        ) from None
    if "\x00" in text:
        raise DocumentRefused(
            f"the {what} holds NUL characters: a binary file, or UTF-16 without a byte order "
            "mark; text is read as UTF-8, or UTF-16 with a byte order mark"
        )
    return text, Encoding(codec, bom)


def why_not_text(data: bytes, size: int = 4096) -> DocumentRefused | None:
    """Why a file that no format took cannot be read as text, if it is text at all (its first
    bytes nearly all printable ASCII, or ASCII in UTF-16 without a byte order mark: a Latin-1
    or UTF-16 export, a stray NUL); None for what is not text (a picture, an archive), which
    is simply in no format this server reads."""
    head = data[:size]
    if len(head) >= 16:
        for zeros, other in ((head[1::2], head[0::2]), (head[0::2], head[1::2])):
            if zeros.count(0) >= 0.9 * len(zeros) and other.count(0) == 0:
                return DocumentRefused(
                    "the file looks like UTF-16 text without a byte order mark: save it as "
                    "UTF-8, or UTF-16 with a byte order mark"
                )
    printable = sum(byte in _PRINTABLE_ASCII for byte in head)
    if head and printable < 0.9 * len(head):
        return None
    try:
        decode(data, "file")
    except DocumentRefused as refused:
        return refused
    return None


_PRINTABLE_ASCII = frozenset(range(0x20, 0x7F)) | {0x09, 0x0A, 0x0D}


def sniff_decode(data: bytes, size: int = 4096) -> str:
    """The start of a file as text, leniently (undecodable bytes replaced): enough for a
    format to recognise its header, so that extract() can refuse a bad encoding by name."""
    for mark, name in _BOMS:
        if data.startswith(mark):
            return data[len(mark) : len(mark) + size].decode(name, errors="replace")
    return data[:size].decode("utf-8", errors="replace")


def xml_safe(text: str) -> bool:
    """Can this text go into a segment (an XML fragment)?"""
    return not _NOT_XML.search(text)


def has_words(text: str) -> bool:
    """Is there anything for the model to translate (a letter), or only numbers and signs?"""
    return any(character.isalpha() for character in text)


def plain_text(segment: str) -> str:
    """A segment's text without its markup (entities read)."""
    return "".join(ElementTree.fromstring(f"<segment>{segment}</segment>").itertext())


def check_characters(segments: list[str], limits: DocumentLimits) -> None:
    """DocumentRefused (413) for a file with more text to translate than the limit."""
    total = sum(len(plain_text(segment)) for segment in segments)
    if total > limits.max_characters:
        raise DocumentRefused(
            f"the file holds {total} characters to translate, more than "
            f"{limits.max_characters} (NMT_MAX_DOCUMENT_CHARACTERS)",
            413,
        )


def attach_spaces(runs: list[tuple[str | None, Hashable]]) -> list[tuple[str | None, Hashable]]:
    """Runs (text, style; text None for a point) where no run of only whitespace would be a
    span of its own: it takes the style of the text right before it (or right after it), and
    between points the style of most characters, which is written without a span.

    Why: a paragraph's segment writes every style but the commonest as a span, and the markup
    layer reads a span that holds only the space between two words as no space at all:
    `<s1>Une femme</s1><s0> </s0>chante.` came back "A woman weaving." (femmechante), and
    `Un grand <s1>chien</s1><s2> </s2>noir` lost "noir". Inside the span before it, the space
    separates the words again: `<s1>Une femme </s1>chante.`."""
    sizes: dict[Hashable, int] = {}
    for text, style in runs:
        if text and text.strip():
            sizes[style] = sizes.get(style, 0) + len(text)
    base = max(sizes, key=sizes.__getitem__) if sizes else None  # first seen wins a tie
    out = list(runs)
    for index, (text, style) in enumerate(out):
        if text is None or text.strip():
            continue
        before = out[index - 1] if index > 0 else (None, None)
        after = out[index + 1] if index + 1 < len(out) else (None, None)
        if (before[0] and before[1] == style) or (after[0] and after[1] == style):
            continue  # part of a run of words
        if before[0]:
            out[index] = (text, before[1])
        elif after[0]:
            out[index] = (text, after[1])
        elif base is not None:
            out[index] = (text, base)
    return out


def hug_words(runs: list[tuple[str | None, tuple]]) -> list[tuple[str | None, tuple]]:
    """Runs (text, chain of elements around it, outermost first; text None for a point) with
    the whitespace at their edges moved out to the elements the words on both sides share,
    never further in: tags hug words, as the markup layer writes them, so that a space
    attach_spaces put into a span for the model goes back between the spans."""
    tokens: list[tuple[str | None, tuple]] = []
    for text, chain in runs:
        if text is None:
            tokens.append((None, chain))
            continue
        tokens += [(part, chain) for part in re.split(r"(\s+)", text) if part]
    words = [index for index, (text, _) in enumerate(tokens) if text and not text.isspace()]
    out: list[tuple[str | None, tuple]] = []
    for index, (text, chain) in enumerate(tokens):
        if text and text.isspace():
            at = bisect_left(words, index)  # the first word after this whitespace
            for word in words[max(at - 1, 0) : at + 1]:
                chain = _shared(chain, tokens[word][1])
        out.append((text, chain))
    return out


def _shared(left: tuple, right: tuple) -> tuple:
    common = 0
    while common < min(len(left), len(right)) and left[common] == right[common]:
        common += 1
    return left[:common]


def wrap(text: str, width: int, first: int | None = None) -> list[str]:
    """Greedy wrapping at word boundaries (the first line `first` wide, the others `width`),
    never breaking a word: a word longer than the width has a line of its own."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        room = width if lines or first is None else first
        if current and len(current) + 1 + len(word) > room:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(current)
    return lines


# --- Plain text -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    indent: str  # leading whitespace and a list item's marker, kept
    body: str  # what is translated
    trailing: str  # trailing whitespace, kept
    end: str  # the line terminator: "\n", "\r\n", "\r", or "" at the end of the file
    item: bool = False  # starts a list item

    @property
    def width(self) -> int:
        return len(self.indent) + len(self.body)

    @classmethod
    def parse(cls, line: str, end: str) -> _Line:
        body = line.strip()
        if not body:
            return cls(line, "", "", end)
        start = len(line) - len(line.lstrip())
        marker = _LIST_ITEM.match(body)
        size = marker.end() if marker else 0
        trailing = line[start + len(body) :]
        return cls(line[: start + size], body[size:], trailing, end, marker is not None)

    @property
    def raw(self) -> str:
        return self.indent + self.body + self.trailing + self.end


@dataclass(frozen=True)
class _Paragraph:
    """Consecutive non-blank lines; blocks[i] are lines that wrap into one another."""

    blocks: list[list[_Line]]
    width: int  # of its longest line

    @property
    def segment(self) -> str:
        return "\n".join(escape(" ".join(line.body for line in block)) for block in self.blocks)

    def write(self, translation: str) -> str:
        texts = plain_text(translation).split("\n")
        blocks = self.blocks
        if len(texts) != len(blocks):  # the markup layer keeps line breaks; never trust it blind
            texts, blocks = [" ".join(texts)], [[line for block in blocks for line in block]]
        return "".join(
            self._write_block(block, text) for block, text in zip(blocks, texts, strict=True)
        )

    def _write_block(self, block: list[_Line], text: str) -> str:
        first, last = block[0], block[-1]
        if len(block) == 1:
            return first.indent + text.strip() + first.trailing + first.end
        hanging = block[1].indent  # a list item's or a quote's continuation lines
        lines = wrap(text, self.width - len(hanging), self.width - len(first.indent)) or [""]
        out = [first.indent + lines[0]] + [hanging + line for line in lines[1:]]
        return "".join(line + first.end for line in out[:-1]) + out[-1] + last.trailing + last.end


def _blocks(lines: list[_Line]) -> tuple[list[list[_Line]], int]:
    width = max(line.width for line in lines)
    blocks = [[lines[0]]]
    for before, after in pairwise(lines):
        next_word = after.body.split()[0]
        wraps = (
            width >= _WRAP_WIDTH and before.width + 1 + len(next_word) > width and not after.item
        )
        if wraps:
            blocks[-1].append(after)
        else:
            blocks.append([after])
    return blocks, width


def _parse(text: str) -> list[str | _Paragraph]:
    """The file as copied stretches (blank or untranslatable lines) and paragraphs."""
    parts: list[str | _Paragraph] = []
    pending: list[_Line] = []

    def close() -> None:
        if not pending:
            return
        blocks, width = _blocks(pending)
        paragraph = _Paragraph(blocks, width)
        if has_words(" ".join(line.body for line in pending)):
            parts.append(paragraph)
        else:
            parts.append("".join(line.raw for line in pending))
        pending.clear()

    for match in _LINE.finditer(text):
        if match.start() == len(text) and match.group(0) == "":
            break  # the empty match at the very end
        line = _Line.parse(match.group(1), match.group(2))
        if line.body and xml_safe(line.body):
            pending.append(line)
        else:
            close()
            parts.append(line.raw)
    close()
    return parts


class TxtFormat(DocumentFormat):
    name = "txt"
    extensions = (".txt",)
    media_type = "text/plain"
    # A line break in a segment is a break the author made: it ends a sentence.
    markup = MarkupOptions(kind="xml", split="sentences", outline_detection=False)

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        """Any text this server can decode: the registry tries this format last."""
        try:
            decode(data, "file")
        except DocumentRefused:
            return False
        return True

    @classmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> Extracted:
        text, encoding = decode(data, "text file")
        extracted = _TextExtracted(_parse(text), encoding)
        check_characters(extracted.segments, limits)
        return extracted


class _TextExtracted(Extracted):
    def __init__(self, parts: list[str | _Paragraph], encoding: Encoding) -> None:
        self.parts = parts
        self.encoding = encoding
        self.segments = [part.segment for part in parts if isinstance(part, _Paragraph)]

    def write(self, translations: list[str]) -> bytes:
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        given = iter(translations)
        out = [part if isinstance(part, str) else part.write(next(given)) for part in self.parts]
        return self.encoding.encode("".join(out))
