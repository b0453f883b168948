"""The document tree and how it is read: the markup constants and options, the nodes (each
keeping the source text it came from), and the HTML and XML readers."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Literal
from xml.parsers import expat

from service.serving.sentences import SplitMode

MarkupKind = Literal["html", "xml"]

# HTML elements that structure a page: each holds runs of its own and stays in place.
HTML_BLOCKS = frozenset({
    "address", "article", "aside", "blockquote", "body", "caption", "dd", "details", "dialog",
    "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3",
    "h4", "h5", "h6", "head", "header", "hgroup", "hr", "html", "legend", "li", "main", "menu",
    "nav", "ol", "optgroup", "option", "p", "pre", "section", "summary", "table", "tbody", "td",
    "tfoot", "th", "thead", "title", "tr", "ul",
})  # fmt: skip
# HTML elements with no content and no end tag.
HTML_VOID = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
    "source", "track", "wbr",
})  # fmt: skip
# HTML elements whose content is not prose to translate: copied as they are.
HTML_IGNORED = frozenset({
    "script", "style", "code", "kbd", "samp", "var", "textarea", "svg", "math", "template",
})  # fmt: skip
# HTML elements that end a line: sentences never run across them.
HTML_BREAKS = frozenset({"br", "hr"})
# `<li>a<li>b`: a start tag of these ends an open element of the same name, as in browsers.
HTML_SELF_ENDING = frozenset({"p", "li", "dt", "dd", "tr", "td", "th", "option"})
# What str.splitlines() reads as a line end; each becomes one space where lines do not split.
LINE_BREAKS = {ord(c): " " for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}
_XML_ROOT = "nmt-fragment"  # the element a fragment is read inside (XML needs one root)
# Deeper markup is refused: no prose nests this deep, and the tree is walked recursively.
MAX_DEPTH = 100


class MarkupError(ValueError):
    """Markup that cannot be read: XML expat refuses, markup nested too deep, or HTML whose
    `<script>` or `<style>` is never closed (a browser reads all the rest as script, so no text
    after it would be translated, nor kept by every version of html.parser)."""


@dataclass(frozen=True)
class MarkupOptions:
    kind: MarkupKind = "html"
    split: SplitMode = "no_newlines"  # how runs are cut into sentences (DeepL split_sentences)
    ignore_tags: frozenset[str] = frozenset()  # content copied, not translated
    splitting_tags: frozenset[str] = frozenset()  # always structure
    non_splitting_tags: frozenset[str] = frozenset()  # never structure by themselves
    outline_detection: bool = True  # XML: find the structure as DeepL does


@dataclass
class Text:
    raw: str  # as written, entities and all
    text: str  # as read


@dataclass
class Opaque:
    raw: str  # a comment, declaration, processing instruction or CDATA section


@dataclass
class Element:
    name: str
    attrs: dict[str, str]
    start: str  # the start tag as written (its attribute values are never touched)
    end: str | None = None  # the end tag as written; None where the source has none
    closed_by_start: bool = False  # `<x/>` or an HTML void element: no end tag is due
    children: list[Node] = field(default_factory=list)

    @property
    def end_tag(self) -> str:
        """The end tag to write: the source's, or one added where the source left it open."""
        if self.end is not None:
            return self.end
        return "" if self.closed_by_start else f"</{self.name}>"


Node = Text | Opaque | Element


def verbatim(node: Node) -> str:
    """A node as the source wrote it (plus the end tags it left out)."""
    if isinstance(node, Element):
        return node.start + "".join(map(verbatim, node.children)) + node.end_tag
    return node.raw


class _SourceSlicer:
    """Gives each parser event its exact source text: an event starts where the parser says,
    and runs to where the next event starts."""

    def __init__(self, source: str | bytes) -> None:
        self.source = source
        self.started = 0
        self.take: Callable[[str], None] | None = None

    def event(self, at: int, take: Callable[[str], None] | None) -> None:
        if self.take is not None:
            piece = self.source[self.started : at]
            self.take(piece.decode() if isinstance(piece, bytes) else piece)
        self.started, self.take = at, take


class _HtmlReader(HTMLParser):
    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.source = source
        self.slicer = _SourceSlicer(source)
        # (re finds the line ends in C: a Python loop over the characters took 1.7 s of a
        # 12 MB page's 15 s.)
        self.line_starts = [0, *(end.end() for end in re.finditer("\n", source))]
        self.root = Element("", {}, "", closed_by_start=True)
        self.stack = [self.root]
        # Where the script or style whose end tag has not come yet started (line, column).
        self.raw_text_at: tuple[int, int] | None = None

    def read(self) -> Element:
        self.feed(self.source)
        self.close()
        self._check_raw_text_closed()
        self.slicer.event(len(self.source), None)
        return self.root

    def _check_raw_text_closed(self) -> None:
        """Refuse a script or style left open: what follows its start tag is its content up
        to its end tag, so without one the rest of the text is script, not prose, and
        Python 3.11's parser drops it at close() instead of reporting it."""
        open_raw = next((e for e in self.stack if e.name in self.CDATA_CONTENT_ELEMENTS), None)
        if open_raw is None:
            return
        line, column = self.raw_text_at or self.getpos()
        raise MarkupError(
            f"<{open_raw.name}> at line {line}, column {column + 1} is never closed: everything "
            f"after it would be {open_raw.name} content, not text; close it with "
            f"</{open_raw.name}>"
        )

    def _here(self) -> int:
        line, column = self.getpos()
        return self.line_starts[line - 1] + column

    def _add(self, node: Node, take: Callable[[str], None] | None = None) -> None:
        self.slicer.event(self._here(), take)
        self.stack[-1].children.append(node)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not _is_name(tag):  # "<b;<x>": text that only looks like a tag
            self.handle_data(self.get_starttag_text() or "")
            return
        element = Element(tag, _attributes(attrs), self.get_starttag_text() or "")
        element.closed_by_start = tag in HTML_VOID
        if tag in HTML_SELF_ENDING:
            self._end_open(tag)
        self._add(element)
        if not element.closed_by_start:
            self.stack.append(element)
            _check_depth(len(self.stack))
        if tag in self.CDATA_CONTENT_ELEMENTS:
            self.raw_text_at = self.getpos()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        start = self.get_starttag_text() or ""
        if not _is_name(tag):
            self.handle_data(start)
            return
        self._add(Element(tag, _attributes(attrs), start, closed_by_start=True))

    def handle_endtag(self, tag: str) -> None:
        depth = next((d for d in range(len(self.stack) - 1, 0, -1) if self.stack[d].name == tag), 0)
        if not depth:  # a stray end tag: dropped, as browsers drop it
            self.slicer.event(self._here(), None)
            return
        element = self.stack[depth]
        del self.stack[depth:]  # what is still open inside it ends here too
        self.slicer.event(self._here(), lambda raw: setattr(element, "end", raw))

    def _end_open(self, tag: str) -> None:
        """A new `li` ends the open one, unless a block lies between them (a nested list)."""
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].name == tag:
                del self.stack[depth:]
                return
            if self.stack[depth].name in HTML_BLOCKS:
                return

    def handle_data(self, data: str) -> None:
        node = Text("", data)
        if self.cdata_elem is not None:  # a script's or a style's own text, kept as it is
            self._add(node, lambda raw: setattr(node, "raw", raw))
            return
        self._add(node, lambda raw: setattr(node, "raw", _inert(raw)))

    def _opaque(self, _content: str) -> None:
        node = Opaque("")
        self._add(node, lambda raw: setattr(node, "raw", raw))

    handle_comment = handle_decl = handle_pi = unknown_decl = _opaque


def _inert(raw: str) -> str:
    """Text as written, but for a "<" that reads as text only because no ">" follows it
    ("a <b" at the end): written "&lt;", so that no tag written after it can complete it."""
    head, *rest = raw.split("<")
    return head + "".join(
        ("&lt;" if part[:1].isalpha() or part[:1] in "/!?" else "<") + part for part in rest
    )


def _is_name(tag: str) -> bool:
    """A tag name a browser and an XML parser both read as one."""
    return tag[:1].isalpha() and all(c.isalnum() or c in "-_:." for c in tag)


def _check_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise MarkupError(f"elements nested more than {MAX_DEPTH} deep")


def _attributes(attrs: list[tuple[str, str | None]]) -> dict[str, str]:
    return {name: value or "" for name, value in attrs}


_XML_HANDLERS = (
    "StartElementHandler",
    "EndElementHandler",
    "CharacterDataHandler",
    "CommentHandler",
    "ProcessingInstructionHandler",
    "StartCdataSectionHandler",
    "EndCdataSectionHandler",
)


def _read_xml(source: str) -> Element:
    """The fragment read inside a root element of our own (XML allows one root; a fragment
    such as `Press <b>here</b>.` has none)."""
    opening = f"<{_XML_ROOT}>"
    data = f"{opening}{source}</{_XML_ROOT}>".encode()
    parser = expat.ParserCreate()
    parser.buffer_text = False  # one event per piece, so that each has its source offset
    slicer = _SourceSlicer(data)
    root = Element("", {}, "", closed_by_start=True)
    stack: list[Element] = []
    in_cdata = False

    def add(node: Node, take: Callable[[str], None] | None) -> None:
        slicer.event(parser.CurrentByteIndex, take)
        stack[-1].children.append(node)

    def start(name: str, attrs: dict[str, str]) -> None:
        if not stack:  # our own root
            slicer.event(parser.CurrentByteIndex, None)
            stack.append(root)
            return
        element = Element(name, attrs, "")
        add(element, lambda raw: setattr(element, "start", raw))
        stack.append(element)
        _check_depth(len(stack))

    def end(_name: str) -> None:
        element = stack.pop()

        def take(raw: str) -> None:  # `<x/>` reports its end where it ends: no source of its own
            element.end, element.closed_by_start = (raw, False) if raw else (None, True)

        slicer.event(parser.CurrentByteIndex, None if element is root else take)

    def characters(text: str) -> None:
        node: Node = Opaque("") if in_cdata else Text("", text)
        add(node, lambda raw: setattr(node, "raw", raw))

    def opaque(*_: object) -> None:
        node = Opaque("")
        add(node, lambda raw: setattr(node, "raw", raw))

    def cdata(starts: bool) -> None:
        nonlocal in_cdata
        in_cdata = starts
        opaque()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = characters
    parser.CommentHandler = opaque
    parser.ProcessingInstructionHandler = opaque
    parser.StartCdataSectionHandler = lambda: cdata(True)
    parser.EndCdataSectionHandler = lambda: cdata(False)
    try:
        parser.Parse(data, True)
    except expat.ExpatError as error:
        column = error.offset - (len(opening) if error.lineno == 1 else 0)
        reason = expat.errors.messages[error.code]
        raise MarkupError(f"{reason} (line {error.lineno}, column {column + 1})") from None
    finally:
        # The parser holds its handlers, whose closures hold the parser: a cycle that would
        # keep the tree until the cycle collector runs, rather than free it with its last
        # reference (documents/collection.py). Letting go of the handlers breaks it.
        for handler in _XML_HANDLERS:
            setattr(parser, handler, None)
    slicer.event(len(data), None)
    return root


def parse(text: str, kind: MarkupKind) -> Element:
    """The document tree under a root of no name (its top-level nodes are its children)."""
    return _HtmlReader(text).read() if kind == "html" else _read_xml(text)
