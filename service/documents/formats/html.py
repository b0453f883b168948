"""A whole HTML page (.html, .htm), translated through the markup layer's HTML kind.

The markup layer already reads HTML as the text API's `tag_handling=html` does: blocks stay
in place, each run of inline content between them is translated with its inline tags carried
to the aligned words, script, style and code are left alone, and so is what says
`translate="no"` or `class="notranslate"`. So a page is read once with the layer, and each
run it would send to the model is one segment, as the source writes it (entities, attribute
quoting and all): one segment per paragraph, heading, list item, cell or title rather than one
for the page, so that a long page is translated, kept and resumed a chunk at a time by the
document worker, and progress means something.

The page is written back from the layer's tree of it, each translated run in place of its
source, everything else byte for byte (end tags that close nothing, which the tree drops as
browsers do, copied from the source). `<html lang>` names the target language once the
caller has set it (`target_language`). The text is decoded as its byte order mark, `<meta
charset>` (or `http-equiv` Content-Type) or XML declaration says, UTF-8 if none does, and
written back in the same encoding; text that does not decode is refused.

Not translated: attribute text (`alt`, `title`, `placeholder`), `<meta name="description">`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import webencodings

from service.documents import markup
from service.documents.formats.base import (
    DocumentFormat,
    DocumentLimits,
    DocumentRefused,
    Extracted,
)
from service.documents.formats.xliff import check_characters
from service.documents.markup import Element, MarkupError, MarkupOptions, verbatim
from service.documents.markup.layout import Run
from service.documents.markup.tree import Node
from service.serving.errors import ServiceError

_BOMS = (
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)
# Where a page names its encoding (HTML's prescan reads the first 1024 bytes; we read more).
_DECLARED = (
    re.compile(rb"<meta[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9_.:-]+)", re.IGNORECASE),
    re.compile(rb"\A\s*<\?xml[^>]*?encoding\s*=\s*[\"']([A-Za-z0-9_.:-]+)", re.IGNORECASE),
)
_PRESCAN = 4096
# Encoding Standard names that are no encoding to translate a page in: "replacement" (labels
# such as iso-2022-kr, which browsers decode as a single U+FFFD, against cross-site scripting
# through them) and "x-user-defined" (bytes past ASCII mapped to private-use characters).
_NOT_FOR_PAGES = ("replacement", "x-user-defined")
# A page, not a fragment: a doctype or <html> first, past whitespace, comments and an XML
# declaration (XHTML).
_PAGE_START = re.compile(
    r"\A(?:\s+|<!--.*?-->|<\?xml[^>]*>)*(?:<!doctype\s+html\b|<html[\s>])",
    re.IGNORECASE | re.DOTALL,
)
_END_TAG = re.compile(r"</[^>]*>")
_LANG = re.compile(r"""(\s(?:xml:)?lang\s*=\s*)("[^"]*"|'[^']*'|[^\s>]*)""", re.IGNORECASE)


class HtmlFormat(DocumentFormat):
    name = "html"
    extensions = (".html", ".htm")
    media_type = "text/html"
    markup = MarkupOptions(kind="html", split="no_newlines")

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        head = data[:_PRESCAN]
        bom, codec = next(((b, c) for b, c in _BOMS if head.startswith(b)), (b"", "latin-1"))
        body = head[len(bom) :]
        if codec.startswith("utf-16"):
            body = body[: len(body) - len(body) % 2]
        return bool(_PAGE_START.match(body.decode(codec, errors="replace")))

    @classmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> HtmlDocument:
        page = _Page.read(data)
        check_characters(sum(len(run.text) for run in page.runs), limits)
        return HtmlDocument(data, [page.segment(run) for run in page.runs])


class HtmlDocument(Extracted):
    """A page read. `target_language`, set by the caller before write(), goes into
    `<html lang>` (and `xml:lang`, where the page has it)."""

    def __init__(self, data: bytes, segments: list[str]) -> None:
        self.data = data
        self.segments = segments
        self.target_language: str | None = None

    def write(self, translations: list[str]) -> bytes:
        if len(translations) != len(self.segments):
            raise ValueError(f"{len(translations)} translations for {len(self.segments)} segments")
        page = _Page.read(self.data)  # a fresh tree: write() may be called more than once
        if self.target_language:
            page.set_language(self.target_language)
        return page.write(translations)


@dataclass
class _Page:
    bom: bytes
    codec: str
    text: str
    root: Element
    runs: list[Run]  # those with text for the model, in document order
    start_tags: dict[int, str] = field(default_factory=dict)  # rewritten, by id(element)

    @classmethod
    def read(cls, data: bytes) -> _Page:
        bom, codec = _encoding(data)
        try:
            text = data[len(bom) :].decode(codec)
        except UnicodeDecodeError as error:
            raise DocumentRefused(
                f"the page is not valid {codec} text (byte {error.start + len(bom)}): declare "
                'its encoding (<meta charset="...">) or send UTF-8'
            ) from None
        try:
            document = markup.read([text], HtmlFormat.markup)[0]
        except (MarkupError, ServiceError) as error:  # ServiceError: a lone surrogate
            raise DocumentRefused(f"the page cannot be read: {error}") from None
        runs = [run for run in document.runs if run.needs_model]
        return cls(bom, codec, text, document.root.element, runs)

    @staticmethod
    def segment(run: Run) -> str:
        return "".join(map(verbatim, run.nodes))

    def set_language(self, language: str) -> None:
        """`<html lang>` (and `xml:lang` where there is one) say `language`."""
        html = next(_elements_named(self.root, "html"), None)
        if html is None:
            return
        if _LANG.search(html.start):
            start = _LANG.sub(lambda m: f'{m.group(1)}"{language}"', html.start)
        else:
            cut = len("<html")
            start = f'{html.start[:cut]} lang="{language}"{html.start[cut:]}'
        self.start_tags[id(html)] = start

    def write(self, translations: list[str]) -> bytes:
        """The page with each run that changed in place of its source."""
        replaced = {
            id(run.nodes[0]): (run, translated)
            for run, translated in zip(self.runs, translations, strict=True)
            if translated != self.segment(run)
        }
        out = _Writer(self.text, self.start_tags)
        out.element(self.root, replaced)
        return self.bom + "".join(out.written).encode(self.codec, errors="xmlcharrefreplace")


class _Writer:
    """Writes the layer's tree of the page back as the source has it. The tree holds each
    piece of the source as written, except end tags that close nothing, which the parser
    drops: they are copied from the source where they stood (a cursor follows the source)."""

    def __init__(self, source: str, start_tags: dict[int, str]) -> None:
        self.source = source
        self.start_tags = start_tags
        self.cursor: int | None = 0  # None: lost track (the tree rewrote a piece)
        self.written: list[str] = []

    def element(self, element: Element, replaced: dict[int, tuple[Run, str]]) -> None:
        """The element, each replaced run written as its translation."""
        if (start := self.start_tags.get(id(element))) is not None:
            self.piece(element.start, write=False)
            self.written.append(start)
        else:
            self.piece(element.start)
        children = element.children
        at = 0
        while at < len(children):
            child = children[at]
            if (found := replaced.get(id(child))) is not None:
                run, translated = found
                self.written.append(translated)
                for node in run.nodes:
                    self.skip(node)
                at += len(run.nodes)
                continue
            if isinstance(child, Element):
                self.element(child, replaced)
            else:
                self.piece(child.raw)
            at += 1
        self.piece(element.end or "")

    def piece(self, raw: str, write: bool = True) -> None:
        if self.cursor is not None:
            while not self.source.startswith(raw, self.cursor) and (
                stray := _END_TAG.match(self.source, self.cursor)
            ):
                if write:
                    self.written.append(stray.group())
                self.cursor = stray.end()
            if self.source.startswith(raw, self.cursor):
                self.cursor += len(raw)
            else:
                self.cursor = None
        if write:
            self.written.append(raw)

    def skip(self, node: Node) -> None:
        """Past a node of a translated run in the source (its stray end tags are gone)."""
        if isinstance(node, Element):
            self.piece(node.start, write=False)
            for child in node.children:
                self.skip(child)
            self.piece(node.end or "", write=False)
        else:
            self.piece(node.raw, write=False)


def _elements_named(element: Element, name: str) -> Iterator[Element]:
    for child in element.children:
        if isinstance(child, Element):
            if child.name == name:
                yield child
            yield from _elements_named(child, name)


def _encoding(data: bytes) -> tuple[bytes, str]:
    """The page's byte order mark (b"" for none) and the codec its text is in."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            return bom, codec
    head = data[:_PRESCAN]
    for pattern in _DECLARED:
        if found := pattern.search(head):
            label = found.group(1).decode("ascii")
            # The label as a browser reads it (the WHATWG Encoding Standard's labels), not as
            # Python's codecs would: those also name codecs no browser has (utf-7,
            # unicode_escape), which would read text the browser shows as text (`+ADw-script`)
            # as markup, and byte transforms (base64, zlib) that are no text encoding at all.
            encoding = webencodings.lookup(label)
            if encoding is None or encoding.name in _NOT_FOR_PAGES:
                raise DocumentRefused(
                    f"the page declares the encoding {label!r}, which web browsers do not read "
                    "pages in: declare one of the Encoding Standard's "
                    "(https://encoding.spec.whatwg.org/#names-and-labels), or send UTF-8"
                )
            codec = encoding.codec_info.name
            # A declaration readable as ASCII is not in UTF-16 (HTML reads it as UTF-8).
            return b"", "utf-8" if codec.startswith("utf-16") else codec
    return b"", "utf-8"
