"""EPUB 2 and 3 books: a zip whose `mimetype` member says application/epub+zip.

What is translated: each XHTML content document the spine lists, the EPUB 3 navigation
document and the EPUB 2 NCX (the reader's table of contents), and the book's title and
description in the package document (OPF), whose dc:language becomes the target language, as
`lang`/`xml:lang` do in the documents that had them. Every other member (images, fonts, CSS,
documents not in the spine) is copied byte for byte, and so is a document none of whose
segments changed.

A segment is a paragraph: the inline content of an XHTML element that structures the page
(p, h1, li, td, ... as the markup layer's HTML_BLOCKS say), between the blocks it holds, with
its inline children (b, i, a, span ...) as markup (see xliff.Fragments: the XHTML namespace
dropped, SVG, MathML, comments and entity references kept aside as points). Segments are
well-formed XML that the layer reads with its HTML kind, as a page's runs are read, so that a
`<br/>` ends a sentence and `<code>` is left alone.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from urllib.parse import unquote

from lxml import etree

from service.documents.formats.base import (
    DocumentFormat,
    DocumentLimits,
    DocumentRefused,
    Extracted,
)
from service.documents.formats.safety import (
    Archive,
    open_zip,
    parse_xml,
    small_member,
    xml_bytes,
)
from service.documents.formats.xliff import XML_NS, Fragments, check_characters
from service.documents.markup import HTML_BLOCKS, HTML_IGNORED, MarkupOptions

MEDIA_TYPE = b"application/epub+zip"
XHTML = "http://www.w3.org/1999/xhtml"
OPF = "http://www.idpf.org/2007/opf"
NCX = "http://www.daisy.org/z3986/2005/ncx/"
DC = "http://purl.org/dc/elements/1.1/"
CONTAINER = "urn:oasis:names:tc:opendocument:xmlns:container"
_XML_LANG = f"{{{XML_NS}}}lang"
# Package metadata a reader shows: translated like the book's text.
_SHOWN_METADATA = ("title", "description")


class EpubFormat(DocumentFormat):
    name = "epub"
    extensions = (".epub",)
    media_type = "application/epub+zip"
    markup = MarkupOptions(kind="html", split="no_newlines")

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        declared = small_member(data, "mimetype", 64)
        return declared is not None and declared.strip() == MEDIA_TYPE

    @classmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> EpubDocument:
        book = _Book(data, limits)
        check_characters(book.characters, limits)
        return EpubDocument(data, limits, book.segments)


class EpubDocument(Extracted):
    """A book read. `target_language`, set by the caller before write(), becomes the OPF's
    dc:language and the `lang`/`xml:lang` of the documents translated."""

    def __init__(self, data: bytes, limits: DocumentLimits, segments: list[str]) -> None:
        self.data = data
        self.limits = limits
        self.segments = segments
        self.target_language: str | None = None

    def write(self, translations: list[str]) -> bytes:
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        book = _Book(self.data, self.limits)  # fresh trees: write() may be called more than once
        return book.write(translations, self.target_language)


@dataclass
class _Segment:
    """Where a segment stands: in member `part`, the content of `parent` between its
    children `after` and `before` (None: from its start, to its end)."""

    part: str
    parent: etree._Element
    after: etree._Element | None
    before: etree._Element | None


@dataclass
class _Part:
    """An XML member of the book that holds segments."""

    root: etree._Element
    fragments: Fragments


class _Book:
    """One reading of the book: its members, the XML parts that hold text, their segments."""

    def __init__(self, data: bytes, limits: DocumentLimits) -> None:
        self.archive = open_zip(data, limits)
        self.package = self._package_path(self.archive)
        self.parts: dict[str, _Part] = {}
        self.segments: list[str] = []
        self.places: list[_Segment] = []
        self.characters = 0
        opf = parse_xml(self.archive.read(self.package), self.package)
        self.parts[self.package] = _Part(opf, Fragments(DC))
        for name in self._documents(opf):
            self._read_document(name)
        for name in self._ncx(opf):
            self._read_ncx(name)
        self._read_metadata(opf)

    # --- finding the parts -----------------------------------------------------------------

    @staticmethod
    def _package_path(archive: Archive) -> str:
        container = parse_xml(archive.read("META-INF/container.xml"), "META-INF/container.xml")
        for rootfile in container.iter(f"{{{CONTAINER}}}rootfile"):
            path = rootfile.get("full-path")
            if path and rootfile.get("media-type", "").strip() == "application/oebps-package+xml":
                return path
        raise DocumentRefused("the book's META-INF/container.xml names no package document")

    def _member(self, href: str) -> str | None:
        """The member an OPF href names (relative to the OPF, URL-escaped), if the book has it."""
        path = unquote(href.split("#", 1)[0])
        name = posixpath.normpath(posixpath.join(posixpath.dirname(self.package), path))
        return name if self.archive.has(name) else None

    def _manifest(self, opf: etree._Element) -> dict[str, etree._Element]:
        return {item.get("id", ""): item for item in opf.iter(f"{{{OPF}}}item")}

    def _documents(self, opf: etree._Element) -> list[str]:
        """The spine's XHTML documents in reading order, then the navigation document."""
        manifest = self._manifest(opf)
        items = [manifest.get(ref.get("idref", "")) for ref in opf.iter(f"{{{OPF}}}itemref")]
        items += [item for item in manifest.values() if "nav" in item.get("properties", "").split()]
        names: list[str] = []
        for item in items:
            if item is None or item.get("media-type") != "application/xhtml+xml":
                continue
            name = self._member(item.get("href", ""))
            if name is not None and name not in names:
                names.append(name)
        return names

    def _ncx(self, opf: etree._Element) -> list[str]:
        manifest = self._manifest(opf)
        spine = opf.find(f"{{{OPF}}}spine")
        toc = manifest.get(spine.get("toc", "")) if spine is not None else None
        items = [toc] if toc is not None else []
        items += [i for i in manifest.values() if i.get("media-type") == "application/x-dtbncx+xml"]
        names = [self._member(item.get("href", "")) for item in items]
        return list(dict.fromkeys(name for name in names if name is not None))

    # --- reading the parts -----------------------------------------------------------------

    def _add(
        self,
        part: str,
        parent: etree._Element,
        after: etree._Element | None,
        before: etree._Element | None,
        nodes: list[etree._Element],
    ) -> None:
        fragments = self.parts[part].fragments
        lead = parent.text if after is None else after.tail
        segment, text = fragments.markup(lead, nodes)
        if not text.strip():
            return
        self.segments.append(segment)
        self.places.append(_Segment(part, parent, after, before))
        self.characters += len(text)

    def _read_document(self, name: str) -> None:
        root = parse_xml(self.archive.read(name), name)
        self.parts[name] = _Part(root, Fragments(XHTML, silent=HTML_IGNORED))
        blocks = _blocks(root)
        self._read_block(name, root, blocks)

    def _read_block(self, part: str, element: etree._Element, blocks: set[etree._Element]) -> None:
        """Each stretch of inline content between the element's blocks is a segment."""
        if _left_alone(element):
            return
        after: etree._Element | None = None
        nodes: list[etree._Element] = []
        for child in element:
            if child in blocks:
                self._add(part, element, after, child, nodes)
                self._read_block(part, child, blocks)
                after, nodes = child, []
            else:
                nodes.append(child)
        self._add(part, element, after, None, nodes)

    def _read_ncx(self, name: str) -> None:
        root = parse_xml(self.archive.read(name), name)
        self.parts[name] = _Part(root, Fragments(NCX))
        for label in ("docTitle", "docAuthor", "navLabel"):
            for holder in root.iter(f"{{{NCX}}}{label}"):
                for text in holder.iter(f"{{{NCX}}}text"):
                    self._add(name, text, None, None, list(text))

    def _read_metadata(self, opf: etree._Element) -> None:
        for label in _SHOWN_METADATA:
            for element in opf.iter(f"{{{DC}}}{label}"):
                self._add(self.package, element, None, None, list(element))

    # --- writing ---------------------------------------------------------------------------

    def write(self, translations: list[str], language: str | None) -> bytes:
        changed: set[str] = set()
        for place, segment, translated in zip(
            self.places, self.segments, translations, strict=True
        ):
            if translated == segment:
                continue
            self.parts[place.part].fragments.splice(
                place.parent, place.after, place.before, translated
            )
            changed.add(place.part)
        if language:
            self._set_language(language, changed)
            changed.add(self.package)
        return self.archive.write({name: xml_bytes(self.parts[name].root) for name in changed})

    def _set_language(self, language: str, changed: set[str]) -> None:
        opf = self.parts[self.package].root
        found = list(opf.iter(f"{{{DC}}}language"))
        if found:
            found[0].text = language
        elif (metadata := opf.find(f"{{{OPF}}}metadata")) is not None:
            etree.SubElement(metadata, f"{{{DC}}}language").text = language
        for name in changed - {self.package}:
            root = self.parts[name].root
            for attribute in ("lang", _XML_LANG):
                if root.get(attribute) is not None:
                    root.set(attribute, language)


def _blocks(root: etree._Element) -> set[etree._Element]:
    """The XHTML elements that structure the page: the layer's HTML blocks, and any element
    that holds one (an inline element cannot: its tags move with words)."""
    blocks: set[etree._Element] = set()
    for element in reversed(list(root.iter(f"{{{XHTML}}}*"))):
        name = etree.QName(element).localname
        if name in HTML_IGNORED:
            continue
        if name in HTML_BLOCKS or any(child in blocks for child in element):
            blocks.add(element)
    return blocks


def _left_alone(element: etree._Element) -> bool:
    """A block the book marks untranslated (as the markup layer reads `translate="no"`)."""
    return (
        element.get("translate", "").strip().lower() == "no"
        or "notranslate" in element.get("class", "").split()
    )
