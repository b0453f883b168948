"""What Word, PowerPoint and Excel files share (Office Open XML): a zip whose
`[Content_Types].xml` names the main part's type, relationships (`_rels/*.rels`) that lead from
one part to the next, and text held as runs in paragraphs.

Two run models are mapped here onto a Paragraph (formats/inline.py), so that the model reads a
paragraph as one sentence and each formatting lands on the words it wrapped:

- WordprocessingML (`w:p`): runs `w:r` with properties `w:rPr`, inside containers that are
  themselves formatting (a hyperlink, a tracked insertion, a smart tag). A run's formatting is
  its `w:rPr` and the containers around it, so a link is a span like bold is, and the
  translated words it lands on are written back inside a copy of the link.
- DrawingML (`a:p`, PowerPoint's text): runs `a:r` with `a:rPr`; a link is in the `a:rPr`.

Everything that is not text (tabs, breaks, pictures, fields, footnote marks, bookmarks) is a
point: moved as it is to where the markup layer puts it. A translated piece of text becomes a
new run with a deep copy of the original run's properties.

Writing is a second reading: `write()` parses the parts again from the archive and applies the
translations to that fresh tree, so an Extracted can be written any number of times.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote

from lxml import etree

from service.documents.formats.base import DocumentLimits, DocumentRefused, Extracted
from service.documents.formats.inline import Paragraph, Piece
from service.documents.formats.safety import (
    Archive,
    open_zip,
    parse_xml,
    small_member,
    xml_bytes,
)

CONTENT_TYPES = "[Content_Types].xml"
_CT = "{http://schemas.openxmlformats.org/package/2006/content-types}"
_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_VBA_CONTENT_TYPE = "application/vnd.ms-office.vbaproject"
_SNIFF_CAP = 1024 * 1024  # a [Content_Types].xml is a few kB; sniffing reads no more than this


def sniff_main_type(data: bytes, main_types: Collection[str]) -> bool:
    """Does the package declare a part of one of these main content types? Reads only
    `[Content_Types].xml` (capped), so sniffing costs nothing whatever the archive holds."""
    declared = small_member(data, CONTENT_TYPES, _SNIFF_CAP)
    if declared is None:
        return False
    try:
        root = parse_xml(declared, CONTENT_TYPES)
    except DocumentRefused:
        return False
    wanted = {kind.lower() for kind in main_types}
    return any(
        override.get("ContentType", "").strip().lower() in wanted
        for override in root.iter(f"{_CT}Override")
    )


class Package:
    """An OOXML package read into memory: its parts' content types, their relationships, and
    their XML, each part parsed once (through safety.parse_xml) and kept to be written."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self._xml: dict[str, etree._Element] = {}
        self._overrides: dict[str, str] = {}
        self._defaults: dict[str, str] = {}
        types = self.xml(CONTENT_TYPES)
        for override in types.iter(f"{_CT}Override"):
            name = override.get("PartName", "").lstrip("/").lower()
            self._overrides[name] = override.get("ContentType", "").strip()
        for default in types.iter(f"{_CT}Default"):
            extension = default.get("Extension", "").lower()
            self._defaults[extension] = default.get("ContentType", "").strip()

    def xml(self, name: str) -> etree._Element:
        if name not in self._xml:
            self._xml[name] = parse_xml(self.archive.read(name), name)
        return self._xml[name]

    def content_type(self, name: str) -> str:
        """The part's content type ("" if none is declared); OPC names are case-insensitive."""
        if name.lower() in self._overrides:
            return self._overrides[name.lower()]
        return self._defaults.get(posixpath.splitext(name)[1].lstrip(".").lower(), "")

    def relationships(self, part: str) -> dict[str, tuple[str, str]]:
        """The part's internal relationships: id -> (kind, target part), the kind being the
        relationship type's last word ("header", "slide", ...), alike in transitional and
        strict files. Targets that are not in the archive are left out."""
        folder, name = posixpath.split(part)
        rels = posixpath.join(folder, "_rels", f"{name}.rels")
        if not self.archive.has(rels):
            return {}
        found: dict[str, tuple[str, str]] = {}
        for rel in self.xml(rels).iter(f"{_REL}Relationship"):
            target = unquote(rel.get("Target", ""))
            if rel.get("TargetMode") == "External" or not target:
                continue
            if target.startswith("/"):
                target = target.lstrip("/")
            else:
                target = posixpath.normpath(posixpath.join(folder, target))
            if self.archive.has(target):
                kind = rel.get("Type", "").rstrip("/").rsplit("/", 1)[-1]
                found[rel.get("Id", "")] = (kind, target)
        return found

    def related(self, part: str, kinds: Collection[str]) -> list[str]:
        """The parts that `part` relates to with one of these kinds, in the order declared."""
        targets = (target for kind, target in self.relationships(part).values() if kind in kinds)
        return list(dict.fromkeys(targets))

    def main_part(self) -> str:
        parts = self.related("", ("officeDocument",))
        if not parts:
            raise DocumentRefused("the package has no main document (_rels/.rels)")
        return parts[0]


@dataclass
class Unit:
    """One segment: where it lives, its runs as a Paragraph, how many characters it gives the
    model, and how to write its translation (the Paragraph's pieces) back into the tree."""

    part: str
    paragraph: Paragraph
    characters: int
    write: Callable[[list[Piece]], None]


Reader = Callable[[Package], list[Unit]]


@dataclass(frozen=True)
class Flavour:
    """What tells one OOXML format from another, and what its refusals say."""

    label: str  # "Word"
    extension: str  # ".docx"
    macro_extension: str  # ".docm"
    main_types: frozenset[str]  # of the main part, macro-enabled ones included

    def sniff(self, data: bytes) -> bool:
        return sniff_main_type(data, self.main_types)


def extract_package(
    data: bytes, limits: DocumentLimits, flavour: Flavour, read: Reader
) -> Extracted:
    """Open, refuse what must not be read (macros, another format, too much text), read."""
    archive = open_zip(data, limits)
    if not archive.has(CONTENT_TYPES):
        raise DocumentRefused("the file is not an Office Open XML package", 415)
    package = Package(archive)
    main_type = package.content_type(package.main_part())
    if _has_macros(package, main_type):
        raise DocumentRefused(
            f"the file is a macro-enabled {flavour.label} document ({flavour.macro_extension}): "
            f"macros are never read nor written back; save it as {flavour.extension} to "
            "translate it"
        )
    if main_type.lower() not in {kind.lower() for kind in flavour.main_types}:
        raise DocumentRefused(
            f"the file is not a {flavour.label} document (its main part is {main_type!r})", 415
        )
    units = read(package)
    characters = sum(unit.characters for unit in units)
    if characters > limits.max_characters:
        raise DocumentRefused(
            f"the document holds {characters} characters to translate, more than "
            f"{limits.max_characters} (NMT_MAX_DOCUMENT_CHARACTERS)",
            413,
        )
    return _Extracted(archive, read, [unit.paragraph.markup() for unit in units])


def _has_macros(package: Package, main_type: str) -> bool:
    if "macroenabled" in main_type.lower():
        return True
    for name in package.archive.names():
        if posixpath.basename(name).lower() == "vbaproject.bin":
            return True
        if package.content_type(name).lower() == _VBA_CONTENT_TYPE:
            return True
    return False


class _Extracted(Extracted):
    def __init__(self, archive: Archive, read: Reader, segments: list[str]) -> None:
        self._archive = archive
        self._read = read
        self.segments = segments

    def write(self, translations: list[str]) -> bytes:
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        package = Package(self._archive)  # a fresh tree: writing twice writes alike
        units = self._read(package)
        for unit, translated in zip(units, translations, strict=True):
            unit.write(unit.paragraph.read_back(translated))
        touched = dict.fromkeys(unit.part for unit in units)
        return self._archive.write({part: xml_bytes(package.xml(part)) for part in touched})


def worth_translating(text: str) -> bool:
    """Text with a letter in it: a cell or paragraph of numbers, dates or dashes is kept as it
    is (the model would only risk garbling it)."""
    return any(character.isalpha() for character in text)


class Spacing:
    """Spaces around the points that stand between words (a tab, a line break).

    The markup layer reads a point as nothing at all, so "homme<tab/>joue" would reach the
    model as "hommejoue". Such a point gets a space before it in the segment (when the text
    before has none), and on writing, the spaces next to it are dropped again: the tab or the
    break is the space."""

    def __init__(self, paragraph: Paragraph) -> None:
        self.paragraph = paragraph
        self.points: set[int] = set()
        self._spaced = True  # at the paragraph's start nothing needs separating

    def text(self, text: str) -> None:
        if text:
            self._spaced = text[-1].isspace()

    def point(self, style: Hashable) -> None:
        """Call before paragraph.point(); `style`: the text before's (the space joins it)."""
        if not self._spaced:
            self.paragraph.text(" ", style)
            self._spaced = True
        self.points.add(len(self.paragraph.points))

    def unspaced(self, pieces: list[Piece]) -> list[Piece]:
        out = []
        for index, piece in enumerate(pieces):
            text = piece.text
            if piece.point is None:
                if index + 1 < len(pieces) and pieces[index + 1].point in self.points:
                    text = text.rstrip()
                if index and pieces[index - 1].point in self.points:
                    text = text.lstrip()
                if not text:
                    continue
            out.append(Piece(text, piece.style, piece.point))
        return out


def text_style(text: str, style: Hashable, before: Hashable) -> Hashable:
    """The formatting a run's text goes in: its own, but a run of spaces alone joins the text
    before it (`before`, None at the paragraph's start). A span holding only spaces reaches
    the model as no space at all ("chien<s1> </s1>noir" reads "chiennoir"), and formatting on
    a space between words shows nothing worth keeping."""
    return before if before is not None and text.isspace() else style


def tag(element: object) -> str:
    """An element's tag; "" for comments and processing instructions (their tag is a function)."""
    name = getattr(element, "tag", "")
    return name if isinstance(name, str) else ""


def set_text(element: etree._Element, text: str) -> None:
    """A `t` element's text, its edge spaces kept (Word and Excel drop them otherwise)."""
    element.text = text
    if text != text.strip():
        element.set(_XML_SPACE, "preserve")


# --- WordprocessingML ------------------------------------------------------------------------

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def w(name: str) -> str:
    return f"{{{W}}}{name}"


# Inline containers of runs that are formatting in their own right: the translated words they
# land on are written inside a copy of them (their properties, w:smartTagPr, w:sdtPr and the
# like, copied too). An inline content control is two: w:sdt around w:sdtContent.
_W_CONTAINERS = frozenset(
    w(name)
    for name in (
        "hyperlink",
        "smartTag",
        "ins",
        "moveTo",
        "customXml",
        "dir",
        "bdo",
        "sdt",
        "sdtContent",
    )
)
# Marks about the source text that are wrong for its translation: a spelling error's range, a
# soft hyphen's place in a word, where the last layout broke the page (Word redoes it).
_W_DROPPED = frozenset(w(name) for name in ("proofErr", "softHyphen", "lastRenderedPageBreak"))
_W_FIELD_PARTS = frozenset(w(name) for name in ("instrText", "delInstrText"))
_W_SPACES = frozenset(w(name) for name in ("tab", "ptab", "br", "cr"))  # between words


@dataclass
class _NewRun:
    """A point made of run content (a tab, a picture): written as a new run with a copy of the
    original run's attributes and properties, around the original elements."""

    source: etree._Element
    children: list[etree._Element]


@dataclass
class _Kept:
    """A point's elements and the containers they sat in (a tab inside a link stays in it)."""

    shell: tuple[etree._Element, ...]
    items: list[etree._Element | _NewRun] = field(default_factory=list)


@dataclass(frozen=True)
class _RunStyle:
    shell: tuple[etree._Element, ...]
    source: etree._Element  # the first run in this formatting: its attributes and w:rPr


class _WordParagraph:
    """One w:p read into a Paragraph; write() puts translated pieces back as runs.

    A complex field (`w:fldChar` begin ... end: a page number, a table of contents entry, a
    date) is one point, instruction and shown result together, so the model never reads
    `PAGE` and no translated word lands inside a field. A field that goes on past the
    paragraph is kept from its start to the paragraph's end."""

    def __init__(self, p: etree._Element) -> None:
        self.p = p
        self.paragraph = Paragraph()
        self.styles: dict[Hashable, _RunStyle] = {}
        self.plain: list[str] = []
        self.spacing = Spacing(self.paragraph)
        self._last_style: Hashable = None  # of the text read last
        self._containers = 0
        self._added = 0  # pieces added so far (text and points)
        self._depth = 0  # complex fields open
        self._field: _Kept | None = None  # the field point that the next field part joins
        self._walk(p, (), ())

    def _walk(
        self, parent: etree._Element, shell: tuple[etree._Element, ...], key: tuple[int, ...]
    ) -> None:
        for child in parent:
            name = tag(child)
            if (name == w("pPr") and parent is self.p) or name in _W_DROPPED:
                continue
            if parent is not self.p and name.endswith("Pr"):
                continue  # a container's own properties, copied with it
            if name == w("r"):
                self._run(child, shell, key)
            elif name in _W_CONTAINERS and self._depth == 0:
                self._containers += 1
                added = self._added
                self._walk(child, (*shell, child), (*key, self._containers))
                if self._added == added:  # nothing in it to carry it: kept as it is
                    self._point(_Kept(shell, [child]), key)
            elif self._depth:
                self._field_part(child, None, shell, key)
            else:  # bookmarks, deleted text, w:fldSimple, math, comments: points
                self._point(_Kept(shell, [child]), key)

    def _run(
        self, run: etree._Element, shell: tuple[etree._Element, ...], key: tuple[int, ...]
    ) -> None:
        properties = run.find(w("rPr"))
        style = (key, b"" if _empty(properties) else etree.tostring(properties))
        for child in run:
            name = tag(child)
            if name == w("rPr") or name in _W_DROPPED:
                continue
            if name == w("fldChar"):
                kind = child.get(w("fldCharType"))
                self._depth += kind == "begin"
                self._field_part(child, run, shell, style)
                if kind == "end":
                    self._depth = max(self._depth - 1, 0)
                    if not self._depth:
                        self._field = None
            elif self._depth or name in _W_FIELD_PARTS:
                self._field_part(child, run, shell, style)
            elif name == w("t"):
                text = child.text or ""
                joined = text_style(text, style, self._last_style)
                self.styles.setdefault(joined, _RunStyle(shell, run))
                self.paragraph.text(text, joined)
                self.plain.append(text)
                self.spacing.text(text)
                if text:
                    self._last_style = joined
                    self._added += 1
                self._field = None
            else:  # tabs, breaks, drawings, footnote marks, symbols
                if name in _W_SPACES:
                    self.spacing.point(self._last_style)
                self._point(_Kept(shell, [_NewRun(run, [child])]), style)

    def _point(self, kept: _Kept, style: Hashable) -> None:
        self.paragraph.point(kept, style)
        self._added += 1
        self._field = None

    def _field_part(
        self,
        element: etree._Element,
        run: etree._Element | None,
        shell: tuple[etree._Element, ...],
        style: Hashable,
    ) -> None:
        kept = self._field
        if kept is None or kept.shell != shell:
            kept = _Kept(shell)
            self._point(kept, style)
            self._field = kept
        last = kept.items[-1] if kept.items else None
        if run is None:
            kept.items.append(element)
        elif isinstance(last, _NewRun) and last.source is run:
            last.children.append(element)
        else:
            kept.items.append(_NewRun(run, [element]))

    def write(self, pieces: list[Piece]) -> None:
        pieces = self.spacing.unspaced(pieces)
        for child in list(self.p):
            if tag(child) != w("pPr"):
                self.p.remove(child)
        opened: list[tuple[etree._Element, etree._Element]] = []  # (original, its copy)
        for piece in pieces:
            if piece.point is not None:
                kept: _Kept = self.paragraph.points[piece.point]  # type: ignore[assignment]
                parent = self._open(opened, kept.shell)
                for item in kept.items:
                    if isinstance(item, _NewRun):
                        _append_all(_new_run(parent, item.source), item.children)
                    else:
                        _append_all(parent, [item])
            else:
                style = self.styles[self.paragraph.styles[piece.style]]
                parent = self._open(opened, style.shell)
                set_text(etree.SubElement(_new_run(parent, style.source), w("t")), piece.text)

    def _open(
        self,
        opened: list[tuple[etree._Element, etree._Element]],
        shell: tuple[etree._Element, ...],
    ) -> etree._Element:
        """The innermost copy of `shell`'s containers, reusing those already open: runs of one
        link that stay together stay in one link."""
        common = 0
        while common < min(len(opened), len(shell)) and opened[common][0] is shell[common]:
            common += 1
        del opened[common:]
        parent = opened[-1][1] if opened else self.p
        for original in shell[common:]:
            parent = etree.SubElement(parent, original.tag, dict(original.attrib))
            for child in original:
                if tag(child).endswith("Pr"):
                    parent.append(copy.deepcopy(child))
            opened.append((original, parent))
        return parent


def _new_run(parent: etree._Element, source: etree._Element) -> etree._Element:
    run = etree.SubElement(parent, w("r"), dict(source.attrib))
    properties = source.find(w("rPr"))
    if properties is not None:
        run.append(copy.deepcopy(properties))
    return run


def _append_all(parent: etree._Element, elements: Iterable[etree._Element]) -> None:
    for element in elements:
        element.tail = None
        parent.append(element)


def word_units(part: str, root: etree._Element) -> list[Unit]:
    """Every w:p of a WordprocessingML part that holds text: body, table cells, text boxes
    (their paragraphs are read in their own right; the drawing that holds them is a point)."""
    units = []
    for p in root.iter(w("p")):
        read = _WordParagraph(p)
        plain = "".join(read.plain)
        if read.paragraph.has_text and worth_translating(plain):
            units.append(Unit(part, read.paragraph, len(plain), read.write))
    return units


# --- DrawingML -------------------------------------------------------------------------------

A = "http://schemas.openxmlformats.org/drawingml/2006/main"


def a(name: str) -> str:
    return f"{{{A}}}{name}"


def drawing_units(part: str, root: etree._Element) -> list[Unit]:
    """Every a:p of a DrawingML part that holds text: shapes, placeholders, table cells."""
    units = []
    for p in root.iter(a("p")):
        unit = _drawing_unit(part, p)
        if unit is not None:
            units.append(unit)
    return units


# Proofing state of the source words (a spelling error, text not yet checked): PowerPoint splits
# runs on it, which is no formatting, and it says nothing true about the translation.
_PROOFING = ("err", "dirty", "smtClean", "smtId")


def _without_proofing(rpr: etree._Element | None) -> etree._Element | None:
    if rpr is not None and any(name in rpr.attrib for name in _PROOFING):
        rpr = copy.deepcopy(rpr)
        for name in _PROOFING:
            rpr.attrib.pop(name, None)
    return rpr


def _empty(element: etree._Element | None) -> bool:
    return element is None or (not element.attrib and len(element) == 0)


def _drawing_unit(part: str, p: etree._Element) -> Unit | None:
    """a:p holds a:pPr, then runs (a:r), line breaks (a:br) and fields (a:fld: a slide number,
    a date), then a:endParaRPr; breaks, fields and anything else are points."""
    paragraph = Paragraph()
    spacing = Spacing(paragraph)
    properties: dict[Hashable, etree._Element | None] = {}
    plain: list[str] = []
    last_style: Hashable = None
    for child in p:
        name = tag(child)
        if name in (a("pPr"), a("endParaRPr")):
            continue
        if name == a("r"):
            rpr = _without_proofing(child.find(a("rPr")))
            own = b"" if _empty(rpr) else etree.tostring(rpr)  # an empty a:rPr is none
            text = "".join(t.text or "" for t in child.iter(a("t")))
            style = text_style(text, own, last_style)
            properties.setdefault(style, rpr)
            paragraph.text(text, style)
            plain.append(text)
            spacing.text(text)
            last_style = style if text else last_style
        else:
            if name == a("br"):
                spacing.point(last_style)
            paragraph.point(child, None)
    text = "".join(plain)
    if not (paragraph.has_text and worth_translating(text)):
        return None

    def write(pieces: list[Piece]) -> None:
        pieces = spacing.unspaced(pieces)
        end = p.find(a("endParaRPr"))
        for child in list(p):
            if tag(child) != a("pPr"):
                p.remove(child)
        for piece in pieces:
            if piece.point is not None:
                _append_all(p, [paragraph.points[piece.point]])  # type: ignore[list-item]
                continue
            run = etree.SubElement(p, a("r"))
            rpr = properties[paragraph.styles[piece.style]]
            if rpr is not None:
                run.append(copy.deepcopy(rpr))
            etree.SubElement(run, a("t")).text = piece.text
        if end is not None:
            _append_all(p, [end])

    return Unit(part, paragraph, len(text), write)
