"""OpenDocument text (.odt) and presentations (.odp): LibreOffice's own formats.

Both keep their text the same way, so one reader serves both: every `text:p` and `text:h` of
content.xml (body, tables' cells, lists, sections, text boxes, slides and their speaker notes)
and of styles.xml's master pages (headers, footers, what a master slide shows) is a segment.

Inside a paragraph:
- `text:span` and `text:a` are spans: each run's style key is the chain of spans and links
  around it (element name and attributes: `text:style-name`, `xlink:href`), so a bold word
  inside a link is both bold and linked after translation;
- a `text:line-break` is a line break in the segment, which ends a sentence for the model
  (split="sentences"): in office documents it separates lines the author wanted apart
  (address lines, verse, a two-line title), and the model drops words where two such lines are
  read as one sentence;
- `text:s` is spaces, and the whitespace of the XML text collapses as ODF says (runs of
  spaces, tabs and newlines read as one space), so the model reads the words a reader sees;
  writing back, runs of spaces are `text:s` again;
- everything else is a point, moved whole:
  - a tab; after text, with a line break before it in the segment (dropped again on the way
    back, with the spaces next to the tab): a tab separates a label from its value, a number
    from its item, columns; read as one sentence, "Un chat<tab>Un chien" came out "A dog cat";
  - a note (`text:note`): its citation is the point, its body's paragraphs are segments;
  - a frame or shape, whose text boxes' paragraphs are segments of their own;
  - a field (page number, date: their text is the application's), a bookmark, a comment
    (not translated: it is a reviewer's, not the document's).

Not translated: comments, tracked deletions, embedded objects (charts, formulas: sub-documents
of their own), alt texts and the document's metadata. A password-protected file is refused.
The archive is written back by safety.Archive: the `mimetype` member stays first and stored.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import ClassVar, cast

from lxml import etree

from service.documents.formats.base import (
    DocumentFormat,
    DocumentLimits,
    DocumentRefused,
    Extracted,
)
from service.documents.formats.inline import Paragraph
from service.documents.formats.safety import (
    Archive,
    open_zip,
    parse_xml,
    small_member,
    xml_bytes,
)
from service.documents.formats.text import (
    attach_spaces,
    check_characters,
    has_words,
    hug_words,
)
from service.documents.markup import MarkupOptions

_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_PARAGRAPHS = (f"{{{_TEXT}}}p", f"{{{_TEXT}}}h")
_SPANS = frozenset({f"{{{_TEXT}}}span", f"{{{_TEXT}}}a"})
_SPACE = f"{{{_TEXT}}}s"
_TAB = f"{{{_TEXT}}}tab"
_LINE_BREAK = f"{{{_TEXT}}}line-break"
_COUNT = f"{{{_TEXT}}}c"
# Text under these is not the document's to translate: comments, tracked deletions.
_SKIPPED = frozenset({f"{{{_OFFICE}}}annotation", f"{{{_TEXT}}}tracked-changes"})
_MASTER_STYLES = f"{{{_OFFICE}}}master-styles"
_COLLAPSE = re.compile(r"[ \t\r\n]+")
_WRITTEN = re.compile(r"( +|\n|\t)")

Chain = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # spans around a run, outermost first


@dataclass
class _Unit:
    """One paragraph element and its runs as a segment."""

    element: etree._Element
    paragraph: Paragraph
    tab_breaks: set[int]  # see _Reader.tab_breaks


class _Reader:
    """Walks a paragraph's inline content into a Paragraph, collapsing whitespace as ODF
    renders it: a space after a space, a line break or the paragraph's start is not there."""

    def __init__(self) -> None:
        self.runs: list[tuple[str | None, Chain]] = []  # text, or None for the next point
        self.points: list[etree._Element] = []
        self.last = ""  # the last character read, "" at the paragraph's start
        self.tab_breaks: set[int] = set()  # the tabs (point indexes) with a line break added

    def read(self, element: etree._Element) -> Paragraph:
        self._content(element, ())
        paragraph = Paragraph()
        points = iter(self.points)
        for text, chain in attach_spaces(cast(list[tuple[str | None, Hashable]], self.runs)):
            if text is None:
                paragraph.point(next(points), chain)
            else:
                paragraph.text(text, chain)
        return paragraph

    @property
    def plain(self) -> str:
        """The text read, to tell whether there is any to translate."""
        return "".join(text for text, _ in self.runs if text)

    def _content(self, element: etree._Element, chain: Chain) -> None:
        self._collapsible(element.text, chain)
        for child in element:
            tag = child.tag if isinstance(child.tag, str) else ""  # comments: points
            if tag in _SPANS:
                attributes = tuple(sorted((str(k), str(v)) for k, v in child.attrib.items()))
                self._content(child, (*chain, (tag, attributes)))
            elif tag == _SPACE:
                self._text(" " * _count(child), chain)
            elif tag == _LINE_BREAK:
                self._text("\n", chain)
            else:
                if tag == _TAB and self.last not in ("", "\n", "\t"):
                    self._text("\n", chain)  # dropped again by _write
                    self.tab_breaks.add(len(self.points))
                self.runs.append((None, chain))
                self.points.append(child)
                self.last = "\t" if tag == _TAB else self.last
            self._collapsible(child.tail, chain)

    def _collapsible(self, text: str | None, chain: Chain) -> None:
        if not text:
            return
        text = _COLLAPSE.sub(" ", text)
        if text.startswith(" ") and self.last in ("", " ", "\n", "\t"):
            text = text[1:]
        self._text(text, chain)

    def _text(self, text: str, chain: Chain) -> None:
        if text:
            self.runs.append((text, chain))
            self.last = text[-1]


class _Writer:
    """Rebuilds a paragraph element from translated pieces: spans opened and closed as the
    runs' chains change, points moved in, line breaks, tabs and spaces written as ODF wants
    them (a space after a space, a break or the start as text:s, which never collapses)."""

    def __init__(self, element: etree._Element) -> None:
        self.stack: list[tuple[object, etree._Element]] = [(None, element)]
        self.last = ""  # the last character written, "" at the paragraph's start
        element.text = None
        for child in list(element):
            element.remove(child)

    def point(self, kept: etree._Element, chain: Chain) -> None:
        self._close_to(chain)
        kept.tail = None
        self.stack[-1][1].append(kept)
        if kept.tag == _TAB:
            self.last = "\t"

    def text(self, text: str, chain: Chain) -> None:
        if not text:
            return
        self._close_to(chain)
        for key in chain[len(self.stack) - 1 :]:
            tag, attributes = key
            self.stack.append((key, etree.SubElement(self.stack[-1][1], tag, dict(attributes))))
        for piece in _WRITTEN.split(text):
            if piece == "\n":
                self._element(_LINE_BREAK, "\n")
            elif piece == "\t":
                self._element(_TAB, "\t")
            elif piece.startswith(" "):
                self._spaces(len(piece))
            elif piece:
                self._characters(piece)

    def _spaces(self, count: int) -> None:
        if self.last not in ("", " ", "\n", "\t"):
            self._characters(" ")
            count -= 1
        if count:
            spaces = self._element(_SPACE, " ")
            if count > 1:
                spaces.set(_COUNT, str(count))

    def _close_to(self, chain: Chain) -> None:
        keys = [key for key, _ in self.stack[1:]]
        common = 0
        while common < min(len(keys), len(chain)) and keys[common] == chain[common]:
            common += 1
        del self.stack[common + 1 :]

    def _element(self, tag: str, reads_as: str) -> etree._Element:
        self.last = reads_as
        return etree.SubElement(self.stack[-1][1], tag)

    def _characters(self, text: str) -> None:
        parent = self.stack[-1][1]
        if len(parent):
            parent[-1].tail = (parent[-1].tail or "") + text
        else:
            parent.text = (parent.text or "") + text
        self.last = text[-1]


def _count(element: etree._Element) -> int:
    try:
        return max(1, int(element.get(_COUNT, "1")))
    except ValueError:
        return 1


def _write(unit: _Unit, translation: str) -> None:
    paragraph = unit.paragraph
    pieces = paragraph.read_back(translation)
    chains = cast(list[Chain], paragraph.styles)  # the reader's style keys
    points = cast(list[etree._Element], paragraph.points)
    writer = _Writer(unit.element)
    pending = set(unit.tab_breaks)  # tabs whose added line break is still to drop

    def tab(at: int) -> int | None:
        point = pieces[at].point if 0 <= at < len(pieces) else None
        return point if point is not None and points[point].tag == _TAB else None

    runs: list[tuple[str | None, tuple]] = []  # text, or None for the next point
    for index, piece in enumerate(pieces):
        if piece.point is not None:
            runs.append((None, chains[piece.style]))
            continue
        text = piece.text
        after, before = tab(index + 1), tab(index - 1)
        if after is not None:
            text = text.rstrip(" ")
            if after in pending and text.endswith("\n"):
                text = text[:-1].rstrip(" ")
                pending.discard(after)
        if before is not None:
            text = text.lstrip(" ")
            if before in pending and text.startswith("\n"):
                text = text[1:].lstrip(" ")
                pending.discard(before)
        runs.append((text, chains[piece.style]))
    kept = (points[piece.point] for piece in pieces if piece.point is not None)
    for text, chain in hug_words(runs):
        if text is None:
            writer.point(next(kept), chain)
        else:
            writer.text(text, chain)


def _paragraphs(root: etree._Element, masters_only: bool) -> Iterator[etree._Element]:
    scope = root.iter(_MASTER_STYLES) if masters_only else [root]
    for top in scope:
        for element in top.iter(*_PARAGRAPHS):
            if not any(ancestor.tag in _SKIPPED for ancestor in element.iterancestors()):
                yield element


class _OpenDocument(DocumentFormat):
    """What OdtFormat and OdpFormat share: all but the mimetype."""

    mimetype: ClassVar[str]
    # A segment's line break (text:line-break) ends a sentence.
    markup = MarkupOptions(kind="xml", split="sentences", outline_detection=False)

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        return _mimetype(data) == cls.mimetype

    @classmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> Extracted:
        archive = open_zip(data, limits)
        if archive.has("META-INF/manifest.xml") and b"encryption-data" in archive.read(
            "META-INF/manifest.xml"
        ):
            raise DocumentRefused(
                f"the {cls.name} file is password-protected: its text is encrypted"
            )
        extracted = _OpenDocumentExtracted(archive)
        check_characters(extracted.segments, limits)
        return extracted


class OdtFormat(_OpenDocument):
    name = "odt"
    extensions = (".odt",)
    media_type = "application/vnd.oasis.opendocument.text"
    mimetype = media_type


class OdpFormat(_OpenDocument):
    name = "odp"
    extensions = (".odp",)
    media_type = "application/vnd.oasis.opendocument.presentation"
    mimetype = media_type


def _mimetype(data: bytes) -> str | None:
    """The `mimetype` member, which ODF puts first and stored, naming the document's kind."""
    declared = small_member(data, "mimetype", 256)
    return None if declared is None else declared.decode("ascii", errors="replace").strip()


class _OpenDocumentExtracted(Extracted):
    """The parts are read again for each write, so writing twice starts from the file."""

    _PARTS = (("content.xml", False), ("styles.xml", True))

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self.segments = [unit.paragraph.markup() for _, _, units in self._read() for unit in units]

    def _read(self) -> list[tuple[str, etree._Element, list[_Unit]]]:
        parts = []
        for name, masters_only in self._PARTS:
            if not self.archive.has(name):
                if name == "content.xml":
                    raise DocumentRefused("the OpenDocument file has no content.xml")
                continue
            root = parse_xml(self.archive.read(name), name)
            units = []
            for element in _paragraphs(root, masters_only):
                reader = _Reader()
                paragraph = reader.read(element)
                if has_words(reader.plain):
                    units.append(_Unit(element, paragraph, reader.tab_breaks))
            parts.append((name, root, units))
        return parts

    def write(self, translations: list[str]) -> bytes:
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        given = iter(translations)
        replaced: dict[str, bytes] = {}
        for name, root, units in self._read():
            for unit in units:
                _write(unit, next(given))
            if units:
                replaced[name] = xml_bytes(root)
        return self.archive.write(replaced)
