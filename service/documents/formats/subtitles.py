"""Subtitles: SubRip (.srt) and WebVTT (.vtt).

Everything but a cue's text is copied as it is: cue numbers and identifiers, timings, cue
settings, SRT positioning codes at a cue's start (`{\\an8}`), the WebVTT header and its NOTE,
STYLE and REGION blocks, blank lines, line endings. The libraries read the files: `srt`'s own
cue grammar (srt.SRT_REGEX, through srt.parse, which refuses what is not SRT) and webvtt-py's
(its block rules and parse_item, and WebVTT.from_string to check that we found the cues it
finds). Neither library writes a file back unchanged (srt.compose renumbers and rewrites the
timing lines, webvtt-py moves comments and styles), so the cue texts are replaced in place at
the offsets the parsers give.

Cues are read as sentences, not as the screenfuls they are cut into: consecutive cues are
joined until one ends a sentence (`.`, `!`, `?` or `…`, perhaps followed by a closing quote
or bracket), at most 5 cues or 400 characters (a file without punctuation, song lyrics say,
must not become one endless sentence). The joined text is one segment; its translation is cut
back into as many cues at word boundaries, each as near as it can be to the share of the
source's characters its cue held (a cue never ends up empty: with fewer words than cues, the
last ones show `…`). Inside a cue, lines that a long text was wrapped on are joined for the
model and the cue's translation is wrapped again over the same number of lines, at the word
boundaries nearest to the source lines' proportions (a short translation takes fewer lines).
A dialogue cue (every line starts with a dash: two speakers) is never joined: each line is a
segment of its own, its dash kept.

Inline markup is carried by alignment: `<i>`, `<b>`, `<u>`, `<s>`, `<font ...>` in SRT;
`<i>`, `<b>`, `<u>`, `<c.class>`, `<v Speaker>`, `<lang>`, `<ruby>` in WebVTT are spans
(written back as they were written, an end tag the source left out left out again), WebVTT
timestamps and other codes are points. WebVTT text has its character references read
(`&amp;`, `&nbsp;`...) and written back; SRT text is taken literally.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import ClassVar, cast

import srt
import webvtt
from webvtt import vtt as webvtt_blocks
from webvtt.errors import MalformedCaptionError, MalformedFileError

from service.documents.formats.base import (
    DocumentFormat,
    DocumentLimits,
    DocumentRefused,
    Extracted,
)
from service.documents.formats.inline import Paragraph
from service.documents.formats.text import (
    Encoding,
    attach_spaces,
    check_characters,
    decode,
    has_words,
    hug_words,
    sniff_decode,
    xml_safe,
)

_MAX_GROUP_CUES = 5
_MAX_GROUP_CHARACTERS = 400
_ENDS_SENTENCE = re.compile(r"[.!?…][\"'»”’)\]]*\s*\Z")
_DASH = re.compile(r"[-–—]\s*")
_NEWLINE = re.compile(r"\r\n|\r|\n")
_LINE = re.compile(r"([^\r\n]*)(\r\n|\r|\n|\Z)")
_ELLIPSIS = "…"


# --- A cue's text as runs -------------------------------------------------------------------


@dataclass(frozen=True)
class _Tag:
    """An inline element of a cue, as written."""

    start: str  # "<i>", "<font color=#ff0>", "<c.yellow>", "<v Roger>"
    name: str  # "i", "font", "c", "v" (lower case)
    end: str | None  # its end tag as written; None where the cue leaves it open


Chain = tuple[_Tag, ...]  # the elements around a character, outermost first


@dataclass(frozen=True)
class _Point:
    raw: str  # a timestamp tag, a code, a stray end tag: copied as it is


# A cue's text, character by character: (character, chain) or (point, chain).
Entry = tuple[str | _Point, Chain]


@dataclass(frozen=True)
class _Syntax:
    """How a format writes markup in its cues."""

    markup: re.Pattern[str]  # one tag or code
    span: Callable[[str], str | None]  # a start tag's element name, None if it is a point
    unescape: Callable[[str], str]
    escape: Callable[[str], str]
    prefix: re.Pattern[str] | None = None  # codes at a cue's start, kept there


def _srt_span(tag: str) -> str | None:
    match = re.match(r"<([a-zA-Z]+)", tag)
    return match.group(1).lower() if match else None


def _vtt_span(tag: str) -> str | None:
    match = re.match(r"<([a-zA-Z][^\s.>]*)", tag)
    return match.group(1).lower() if match else None


# What WebVTT text writes as a character reference (the others it can hold as they are).
_VTT_ESCAPES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    "\xa0": "&nbsp;",
    "\u200e": "&lrm;",
    "\u200f": "&rlm;",
}
_VTT_ESCAPE = re.compile("[" + "".join(_VTT_ESCAPES) + "]")

_SRT = _Syntax(
    markup=re.compile(r"</?(?:[ibus]|font)(?:\s[^<>]*)?>|\{\\[^{}]*\}", re.IGNORECASE),
    span=_srt_span,
    unescape=lambda text: text,
    escape=lambda text: text,
    prefix=re.compile(r"(?:\{\\[^{}]*\}\s*)+"),
)
_VTT = _Syntax(
    markup=re.compile(r"<[^<>]*>"),
    span=_vtt_span,
    unescape=html.unescape,
    escape=lambda text: _VTT_ESCAPE.sub(lambda match: _VTT_ESCAPES[match.group(0)], text),
)


def _entries(payload: str, syntax: _Syntax) -> list[list[Entry]]:
    """The cue's lines, each as entries; an end tag closes its element, and an element never
    closed (WebVTT's `<v Roger>` often is not) is known as such."""
    tokens: list[tuple[str, str]] = []  # ("text" | "start" | "end" | "point", raw)
    at = 0
    for match in syntax.markup.finditer(payload):
        if match.start() > at:
            tokens.append(("text", payload[at : match.start()]))
        raw = match.group(0)
        kind = "point"
        if raw.startswith("</"):
            kind = "end"
        elif raw.startswith("<") and syntax.span(raw):
            kind = "start"
        tokens.append((kind, raw))
        at = match.end()
    if at < len(payload):
        tokens.append(("text", payload[at:]))

    ends: dict[int, str] = {}  # a start token's index -> the end tag that closes it
    matched: set[int] = set()  # end tokens that close something (the others are points)
    open_starts: list[int] = []
    for index, (kind, raw) in enumerate(tokens):
        if kind == "start":
            open_starts.append(index)
        elif kind == "end":
            name = raw[2:-1].strip().lower()
            for depth in range(len(open_starts) - 1, -1, -1):
                if syntax.span(tokens[open_starts[depth]][1]) == name:
                    ends[open_starts[depth]] = raw
                    matched.add(index)
                    del open_starts[depth:]
                    break

    lines: list[list[Entry]] = [[]]
    chain: list[_Tag] = []
    for index, (kind, raw) in enumerate(tokens):
        if kind == "start":
            chain.append(_Tag(raw, cast(str, syntax.span(raw)), ends.get(index)))
        elif kind == "end" and index in matched:
            name = raw[2:-1].strip().lower()
            while chain and chain.pop().name != name:
                pass
        elif kind == "text":
            for part_index, part in enumerate(_NEWLINE.split(syntax.unescape(raw))):
                if part_index:
                    lines.append([])
                lines[-1].extend((character, tuple(chain)) for character in part)
        else:
            lines[-1].append((_Point(raw), tuple(chain)))
    return lines


def _render(entries: list[Entry], syntax: _Syntax) -> str:
    """Entries as cue text: elements opened and closed as the chains change."""
    runs = hug_words([(item if isinstance(item, str) else None, chain) for item, chain in entries])
    entries = [(item, run[1]) for (item, _), run in zip(entries, runs, strict=True)]
    out: list[str] = []
    open_tags: list[_Tag] = []

    def close_to(length: int) -> None:
        while len(open_tags) > length:
            tag = open_tags.pop()
            out.append(tag.end or f"</{tag.name}>")

    for item, chain in entries:
        common = 0
        while common < min(len(open_tags), len(chain)) and open_tags[common] == chain[common]:
            common += 1
        close_to(common)
        if isinstance(item, _Point):
            out.append(item.raw)
            continue
        for tag in chain[common:]:
            open_tags.append(tag)
            out.append(tag.start)
        out.append(item if item == "\n" else syntax.escape(item))
    while open_tags:  # at the cue's end an element the source left open stays so
        tag = open_tags.pop()
        if tag.end is not None:
            out.append(tag.end)
    return "".join(out)


def _plain(entries: list[Entry]) -> str:
    return "".join(item for item, _ in entries if isinstance(item, str))


def _strip(entries: list[Entry]) -> list[Entry]:
    """Without whitespace at either end (points stay)."""
    start, end = 0, len(entries)
    while start < end and isinstance(entries[start][0], str) and entries[start][0].isspace():
        start += 1
    while end > start and isinstance(entries[end - 1][0], str) and entries[end - 1][0].isspace():
        end -= 1
    return entries[start:end]


def _proportional(text: str, weights: list[int]) -> list[int] | None:
    """Where to cut text into len(weights) parts at word boundaries, each part's length as
    near as can be to its weight's share: the starts of parts 2..n. None when there are fewer
    words than parts."""
    words = [match.span() for match in re.finditer(r"\S+", text)]
    parts = len(weights)
    if len(words) < parts:
        return None
    total = sum(weights) or parts
    cuts: list[int] = []
    first_word = 0  # of the current part
    share = 0
    for part in range(1, parts):
        share += weights[part - 1] or 1
        ideal = len(text) * share / total
        last = len(words) - (parts - part)  # leave a word for each part after
        best = min(
            range(first_word + 1, last + 1),
            key=lambda word: abs((words[word - 1][1] + words[word][0]) / 2 - ideal),
        )
        cuts.append(words[best][0])
        first_word = best
    return cuts


def _cut(entries: list[Entry], cuts: list[int]) -> list[list[Entry]]:
    """Entries cut at plain-text positions (a point before a cut's whitespace stays with the
    part before), each part stripped."""
    parts: list[list[Entry]] = [[]]
    position = 0
    pending = iter(cuts)
    cut = next(pending, None)
    for entry in entries:
        if isinstance(entry[0], str):
            if position == cut:
                parts.append([])
                cut = next(pending, None)
            position += 1
        parts[-1].append(entry)
    return [_strip(part) for part in parts]


def _join_lines(lines: list[list[Entry]]) -> list[Entry]:
    """Lines as one cue: a line break between them in the elements both sides share."""
    joined: list[Entry] = []
    for line in lines:
        if joined:
            joined.append(("\n", _shared(joined[-1][1], line[0][1] if line else ())))
        joined.extend(line)
    return joined


def _shared(left: Chain, right: Chain) -> Chain:
    common = 0
    while common < min(len(left), len(right)) and left[common] == right[common]:
        common += 1
    return left[:common]


# --- Cues, and the units that are translated -----------------------------------------------


@dataclass
class _Cue:
    start: int  # the cue text's span in the file's text
    end: int
    newline: str  # between its lines
    prefix: str  # SRT positioning codes at its start
    lines: list[list[Entry]]
    written: list[list[Entry]] | None = None  # its lines once translated

    @property
    def plain_lines(self) -> list[str]:
        return [_plain(line).strip() for line in self.lines]

    @property
    def translatable(self) -> bool:
        text = " ".join(self.plain_lines)
        return has_words(text) and xml_safe(text)

    @property
    def dialogue(self) -> bool:
        plain = self.plain_lines
        return len(plain) > 1 and all(_DASH.match(line) for line in plain)

    @property
    def ends_sentence(self) -> bool:
        return bool(_ENDS_SENTENCE.search(" ".join(self.plain_lines)))


@dataclass
class _Unit:
    """One segment: several cues' lines read as one text, or one dialogue line."""

    cues: list[_Cue]
    line: int | None = None  # a dialogue line's index in its (only) cue
    dash: list[Entry] = field(default_factory=list)  # a dialogue line's dash, kept
    said: list[Entry] = field(default_factory=list)  # a dialogue line after its dash
    paragraph: Paragraph = field(default_factory=Paragraph)
    weights: list[int] = field(default_factory=list)  # each cue's characters in the segment

    def build(self) -> str:
        runs: list[tuple[str | None, Hashable]] = []  # characters, None for the next point
        points: list[_Point] = []
        previous: Chain | None = None
        for cue in self.cues:
            lines = [self.said] if self.line is not None else cue.lines
            size = 0
            for line in lines:
                entries = _strip(line)
                if not entries:
                    continue
                if previous is not None:  # the space a line end or a cue change stood for
                    runs.append((" ", previous if previous == entries[0][1] else ()))
                for item, chain in entries:
                    if isinstance(item, _Point):
                        runs.append((None, chain))
                        points.append(item)
                    else:
                        runs.append((item, chain))
                        size += 1
                previous = entries[-1][1]
            self.weights.append(size)
        given = iter(points)
        for text, chain in attach_spaces(runs):
            if text is None:
                self.paragraph.point(next(given), chain)
            else:
                self.paragraph.text(text, chain)
        return self.paragraph.markup()

    def write(self, translation: str) -> None:
        chains = cast(list[Chain], self.paragraph.styles)
        points = cast(list[_Point], self.paragraph.points)
        entries: list[Entry] = []
        for piece in self.paragraph.read_back(translation):
            chain = chains[piece.style]
            if piece.point is not None:
                entries.append((points[piece.point], chain))
            else:
                entries.extend((character, chain) for character in piece.text)
        entries = _strip(entries)
        if self.line is not None:
            cue = self.cues[0]
            if cue.written is None:
                cue.written = [list(line) for line in cue.lines]
            cue.written[self.line] = self.dash + entries
            return
        cuts = _proportional(_plain(entries), self.weights)
        if cuts is None:  # fewer words than cues: one word each, then an ellipsis
            words = [match.start() for match in re.finditer(r"\S+", _plain(entries))]
            parts = [part for part in _cut(entries, words[1:]) if part]
            chain = entries[-1][1] if entries else ()
            parts += [[(_ELLIPSIS, chain)]] * (len(self.cues) - len(parts))
        else:
            parts = _cut(entries, cuts)
        for cue, part in zip(self.cues, parts, strict=True):
            cue.written = _wrap(part, [len(line) for line in cue.plain_lines if line])


def _wrap(entries: list[Entry], line_weights: list[int]) -> list[list[Entry]]:
    """A cue's translation over as many lines as the source cue had (fewer if short)."""
    text = _plain(entries)
    for count in range(len(line_weights), 1, -1):
        cuts = _proportional(text, line_weights[:count])
        if cuts is not None:
            return _cut(entries, cuts)
    return [entries]


def _units(cues: list[_Cue]) -> list[_Unit]:
    units: list[_Unit] = []
    group: list[_Cue] = []

    def close() -> None:
        if group:
            units.append(_Unit(list(group)))
            group.clear()

    for cue in cues:
        if not cue.translatable or cue.dialogue:
            close()
            if cue.translatable:
                for index, line in enumerate(cue.lines):
                    stripped = _strip(line)
                    dash = _DASH.match(_plain(stripped))
                    size = dash.end() if dash else 0
                    if has_words(_plain(stripped)):
                        units.append(_Unit([cue], index, stripped[:size], stripped[size:]))
            continue
        group.append(cue)
        characters = sum(len(" ".join(member.plain_lines)) for member in group)
        if (
            cue.ends_sentence
            or len(group) >= _MAX_GROUP_CUES
            or characters >= _MAX_GROUP_CHARACTERS
        ):
            close()
    close()
    return units


class _SubtitlesExtracted(Extracted):
    def __init__(
        self, text: str, spans: list[tuple[int, int]], syntax: _Syntax, encoding: Encoding
    ) -> None:
        self.text = text
        self.spans = spans
        self.syntax = syntax
        self.encoding = encoding
        self.segments = [unit.build() for unit in _units(self._cues())]

    def _cues(self) -> list[_Cue]:
        """Read afresh for every write, so that a write starts from the file."""
        cues = []
        for start, end in self.spans:
            payload = self.text[start:end]
            newline = _NEWLINE.search(payload)
            prefix = self.syntax.prefix.match(payload) if self.syntax.prefix else None
            kept = prefix.group(0) if prefix else ""
            cues.append(
                _Cue(
                    start,
                    end,
                    newline.group(0) if newline else "\n",
                    kept,
                    _entries(payload[len(kept) :], self.syntax),
                )
            )
        return cues

    def write(self, translations: list[str]) -> bytes:
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        cues = self._cues()
        for unit, translation in zip(_units(cues), translations, strict=True):
            unit.build()
            unit.write(translation)
        out: list[str] = []
        at = 0
        for cue in cues:
            if cue.written is None:
                continue
            rendered = _render(_join_lines([line for line in cue.written if line]), self.syntax)
            out += [self.text[at : cue.start], cue.prefix, rendered.replace("\n", cue.newline)]
            at = cue.end
        out.append(self.text[at:])
        return self.encoding.encode("".join(out))


# --- The formats ------------------------------------------------------------------------------


_SRT_START = re.compile(
    r"\A\s*\d+[ \t]*\r?\n[ \t]*\d+:\d{1,2}:\d{1,2}[,.]\d{1,3}[ \t]*-->[ \t]*"
    r"\d+:\d{1,2}:\d{1,2}[,.]\d{1,3}"
)


class _Subtitles(DocumentFormat):
    syntax: ClassVar[_Syntax]

    @classmethod
    def _extracted(
        cls, data: bytes, limits: DocumentLimits, spans: Callable[[str], list[tuple[int, int]]]
    ) -> Extracted:
        text, encoding = decode(data, f"{cls.name} file")
        extracted = _SubtitlesExtracted(text, spans(text), cls.syntax, encoding)
        check_characters(extracted.segments, limits)
        return extracted


class SrtFormat(_Subtitles):
    name = "srt"
    extensions = (".srt",)
    media_type = "application/x-subrip"
    syntax = _SRT

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        """A cue number line, then a timing line, whatever the encoding (extract() says
        which encodings it reads)."""
        return bool(_SRT_START.match(sniff_decode(data)))

    @classmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> Extracted:
        return cls._extracted(data, limits, _srt_spans)


class VttFormat(_Subtitles):
    name = "vtt"
    extensions = (".vtt",)
    media_type = "text/vtt"
    syntax = _VTT

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        return bool(re.match(r"WEBVTT(?:[ \t\r\n]|\Z)", sniff_decode(data)))

    @classmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> Extracted:
        return cls._extracted(data, limits, _vtt_spans)


def _srt_spans(text: str) -> list[tuple[int, int]]:
    """Each cue's text span, by srt's own grammar (srt.parse refuses what is not SRT)."""
    try:
        parsed = list(srt.parse(text))
    except (srt.SRTParseError, srt.TimestampParseError, ValueError, OverflowError) as error:
        raise DocumentRefused(f"the file is not valid SRT ({error})") from None
    for subtitle in parsed:
        # srt lets a cue's text run on past blank lines until the next well-formed cue: a cue
        # whose timing line is broken becomes text of the cue before, number, timing and all,
        # and would be translated so. Players skip it; here it is named.
        broken = next((line for line in subtitle.content.splitlines() if "-->" in line), None)
        if broken is not None:
            raise DocumentRefused(
                f"the file is not valid SRT: the cue after cue {subtitle.index} has a timing "
                f"line that cannot be read ({broken[:80]!r})"
            )
    spans = [match.span(5) for match in srt.SRT_REGEX.finditer(text)]
    if len(spans) != len(parsed):  # the same expression: never, unless srt changes
        raise DocumentRefused("the SRT file's cues could not be located")
    return spans


def _vtt_spans(text: str) -> list[tuple[int, int]]:
    """Each cue's text span: blocks cut as webvtt-py cuts them, each judged by its
    parse_item, and the cues found checked against WebVTT.from_string's."""
    try:
        captions = webvtt.WebVTT.from_string(text).captions
    except (MalformedFileError, MalformedCaptionError, ValueError, OverflowError) as error:
        raise DocumentRefused(f"the file is not valid WebVTT ({error})") from None
    spans: list[tuple[int, int]] = []
    found: list[list[str]] = []
    seen_cue = False
    for index, block in enumerate(_vtt_blocks(text)):
        lines = [text[start:end] for start, end in block]
        if index == 0:
            continue  # the header: WEBVTT and its metadata
        item = webvtt_blocks.parse_item(lines, False, seen_cue)
        seen_cue = seen_cue or any("-->" in line for line in lines)
        if not isinstance(item, webvtt.Caption):
            continue  # NOTE, STYLE, REGION and what webvtt-py ignores: copied as they are
        timing = next(
            at
            for at, line in enumerate(lines)
            if webvtt_blocks.WebVTTCueBlock.CUE_TIMINGS_PATTERN.match(line)
        )
        payload = block[timing + 1 :]
        found.append(lines[timing + 1 :])
        spans.append((payload[0][0], payload[-1][1]) if payload else (block[-1][1],) * 2)
    if found != [caption.lines for caption in captions]:
        raise DocumentRefused("the WebVTT file's cues could not be read consistently")
    return spans


def _vtt_blocks(text: str) -> list[list[tuple[int, int]]]:
    """The file's blocks as webvtt-py reads them (each line's span): a block ends at an empty
    line, and a line with "-->" that cannot be the block's timings starts a new one."""
    blocks: list[list[tuple[int, int]]] = []
    block: list[tuple[int, int]] = []
    in_header = True
    for match in _LINE.finditer(text):
        if match.start() == len(text):
            break
        line = match.group(1)
        first = text[block[0][0] : block[0][1]] if block else ""
        timings_of_next = "-->" in line and (in_header or len(block) > 1 or "-->" in first)
        if block and (not line or timings_of_next):
            blocks.append(block)
            block = []
            in_header = False
        if line:
            block.append(match.span(1))
    if block:
        blocks.append(block)
    return blocks
