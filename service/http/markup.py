"""Markup in, markup out: HTML (LibreTranslate `format=html`, DeepL `tag_handling=html`) and XML
(DeepL `tag_handling=xml`) translated with each tag carried to the words it wrapped.

How, the way Bergamot carries HTML:

1. **Parse** with a real parser: `html.parser` for HTML (lenient, as browsers are: an unclosed
   element is closed where its parent ends, a stray end tag is dropped), expat for XML (strict:
   markup it cannot read is a MarkupError, which each dialect answers with its 400).
2. **Lay out**: structural elements (p, div, li, h1 ... in HTML; DeepL's `splitting_tags`; in
   XML, the outline DeepL detects) stay where they are. What lies between them is a *run*:
   text, *spans* (inline elements that wrap text: b, i, a, span ...) and *points* (markup that
   wraps no text: br, img, comments, and in HTML script, style, code and the like). Elements
   the client leaves untranslated (`translate="no"`, `class="notranslate"`, `ignore_tags`)
   are *opaque* spans: the model reads their words, they are copied as they are.
3. **Translate** each run's plain text (entities unescaped) sentence by sentence through the
   pipeline with alignment on: every sentence comes back with its hard word alignment, the
   decoder's cross-attention (the same as `return_alignment`).
4. **Place**: each span goes around the target words aligned to the source words it wrapped
   (the smallest stretch that holds them), inside its parent, never crossing another span;
   each point goes to the place that best separates the target words aligned before it from
   those aligned after it. Where the alignment says nothing (no target word aligned to a span's
   words, or a sentence without alignment), the relative position in the sentence decides.
5. **Write** the output from this tree: it is well-formed whatever the alignment said, and holds
   each element of the input exactly once. Tags hug words (the whitespace between words stays
   outside them, so spacing never doubles or disappears); punctuation at a word's edge is
   inside a tag only if it was in the source. Attribute values, comments, points, opaque
   spans and runs with nothing to translate are copied byte for byte; translated text is
   escaped again.
"""

from __future__ import annotations

import asyncio
import html
from bisect import bisect_left, bisect_right
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from itertools import pairwise
from typing import Literal
from xml.parsers import expat

from service.runtime.search import SearchOptions
from service.serving.errors import InvalidInput, TranslationFailed
from service.serving.input_text import clean_text, has_letters
from service.serving.pipeline import (
    PREPARE_INLINE_CHARS,
    RequestResult,
    SentenceAlignment,
    TranslationService,
)
from service.serving.registry import LoadedModel
from service.serving.sentences import SplitMode, split_text
from service.serving.word_alignment import WordAlignment

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
_LINE_BREAKS = {ord(c): " " for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}
_XML_ROOT = "nmt-fragment"  # the element a fragment is read inside (XML needs one root)
# Deeper markup is refused: no prose nests this deep, and the tree is walked recursively.
MAX_DEPTH = 100


class MarkupError(ValueError):
    """Markup that cannot be read (XML only: HTML is always read, as browsers read it)."""


@dataclass(frozen=True)
class MarkupOptions:
    kind: MarkupKind = "html"
    split: SplitMode = "no_newlines"  # how runs are cut into sentences (DeepL split_sentences)
    ignore_tags: frozenset[str] = frozenset()  # content copied, not translated
    splitting_tags: frozenset[str] = frozenset()  # always structure
    non_splitting_tags: frozenset[str] = frozenset()  # never structure by themselves
    outline_detection: bool = True  # XML: find the structure as DeepL does


# --- The document tree: every node keeps the source text it came from -----------------------


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
        self.line_starts = [0, *(i + 1 for i, c in enumerate(source) if c == "\n")]
        self.root = Element("", {}, "", closed_by_start=True)
        self.stack = [self.root]

    def read(self) -> Element:
        self.feed(self.source)
        self.close()
        self.slicer.event(len(self.source), None)
        return self.root

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
    slicer.event(len(data), None)
    return root


# --- Layout: blocks stay in place; runs of inline content get translated -------------------


@dataclass
class Span:
    """An inline element that wraps text: run.text[start:end] (whitespace trimmed).

    An *opaque* span is an element left untranslated (`translate="no"`, `ignore_tags`) that
    stands in a sentence: the model reads its text, so that the sentence around it reads
    right ("en veste Adidas" -> "in an Adidas jacket"), and the element, copied as it is,
    takes the place of the target words aligned to it."""

    element: Element
    start: int
    end: int
    parent: int | None  # the enclosing span (an index into run.spans), None: the run itself
    words: range = range(0)  # the source words it touches
    opaque: bool = False


@dataclass
class Point:
    """Markup that wraps no text, kept verbatim where run.text[at] was."""

    raw: str
    at: int
    parent: int | None


@dataclass
class Word:
    """A whitespace-separated word: [start, end), and its core [core_start, core_end) without
    the punctuation at its edges ("rue." -> "rue")."""

    start: int
    end: int
    core_start: int
    core_end: int

    def anchor(self, which: int) -> int:
        return (self.start, self.core_start, self.core_end, self.end)[which]


# Where in a word a tag starts or ends: at the word's edge, or at its core's.
WORD_START, CORE_START, CORE_END, WORD_END = range(4)


@dataclass
class Run:
    nodes: list[Node]  # as in the source
    text: str  # the plain text the model reads
    spans: list[Span]  # in source order: a parent before its children
    points: list[Point]
    breaks: list[int]  # places in text where a line ends (br): sentences never cross them
    sentences: list[tuple[int, int]] = field(default_factory=list)  # [start, end) in text
    source_words: list[Word] = field(default_factory=list)
    translated: str | None = None  # the written output, once translated

    @property
    def needs_model(self) -> bool:
        """Is there text to translate, outside the elements left untranslated?"""
        cuts = sorted((span.start, span.end) for span in self.spans if span.opaque)
        bounds = [0, *(at for cut in cuts for at in cut), len(self.text)]
        return any(
            has_letters(self.text[a:b]) for a, b in zip(bounds[::2], bounds[1::2], strict=True)
        )


@dataclass
class Block:
    element: Element
    items: list[Block | Run]


@dataclass
class Document:
    root: Block
    runs: list[Run]

    @property
    def plain_text(self) -> str:
        """What the markup says, for language detection."""
        return "\n".join(run.text for run in self.runs)


def read(texts: list[str], options: MarkupOptions) -> list[Document]:
    """Parse and lay out each text; MarkupError for XML that cannot be read, InvalidInput for
    text that is not Unicode (naming the text, as the pipeline does)."""
    documents = []
    for index, text in enumerate(texts):
        clean_text(text, index)  # a lone surrogate: refused before any parsing
        documents.append(_Layout(options).document(parse(text, options.kind)))
    return documents


def parse(text: str, kind: MarkupKind) -> Element:
    """The document tree under a root of no name (its top-level nodes are its children)."""
    return _HtmlReader(text).read() if kind == "html" else _read_xml(text)


class _Layout:
    def __init__(self, options: MarkupOptions) -> None:
        self.options = options
        fold = str.lower if options.kind == "html" else str
        self.ignore = {fold(t) for t in options.ignore_tags}
        self.splitting = {fold(t) for t in options.splitting_tags}
        self.non_splitting = {fold(t) for t in options.non_splitting_tags}
        self.runs: list[Run] = []
        self._structural: dict[int, bool] = {}
        self._has_text: dict[int, bool] = {}

    def document(self, root: Element) -> Document:
        block = self.block(root)
        return Document(block, self.runs)

    def block(self, element: Element) -> Block:
        """The element's children: structural ones as blocks, the rest gathered into runs."""
        items: list[Block | Run] = []
        pending: list[Node] = []
        outline = self._is_outline(element)
        for child in element.children:
            if isinstance(child, Element) and self.is_structural(child, outline):
                if pending:
                    items.append(self.run(pending))
                    pending = []
                # A block left untranslated: a run of its own, with nothing to translate.
                items.append(self.run([child]) if self.ignored(child) else self.block(child))
            else:
                pending.append(child)
        if pending:
            items.append(self.run(pending))
        return Block(element, items)

    def ignored(self, element: Element) -> bool:
        if element.name in self.ignore:
            return True
        if element.attrs.get("translate", "").strip().lower() == "no":
            return True
        if "notranslate" in element.attrs.get("class", "").split():
            return True
        return self.options.kind == "html" and element.name in HTML_IGNORED

    def is_structural(self, element: Element, parent_is_outline: bool) -> bool:
        """Does the element stay in place? Blocks do, and so does anything holding a block
        (an inline element cannot hold one: its tags move with words); what is left
        untranslated is looked into no further."""
        key = id(element)
        if key not in self._structural:
            self._structural[key] = self._splits(element, parent_is_outline) or (
                not self.ignored(element)
                and any(
                    self.is_structural(child, self._is_outline(element))
                    for child in element.children
                    if isinstance(child, Element)
                )
            )
        return self._structural[key]

    def _splits(self, element: Element, parent_is_outline: bool) -> bool:
        if element.name in self.non_splitting or element.closed_by_start:
            return False
        if element.name in self.splitting:
            return True
        if self.options.kind == "html":
            return element.name in HTML_BLOCKS
        # DeepL's outline detection: an element holding text inside one that holds none of its
        # own (`<content><par>...</par></content>`) is structure.
        return self.options.outline_detection and parent_is_outline and self.has_text(element)

    def _is_outline(self, element: Element) -> bool:
        """An XML element with element children and no text of its own."""
        if self.options.kind == "html":
            return False
        children = element.children
        return any(isinstance(c, Element) for c in children) and not any(
            isinstance(c, Text) and c.text.strip() for c in children
        )

    def has_text(self, element: Element) -> bool:
        key = id(element)
        if key not in self._has_text:
            self._has_text[key] = not self.ignored(element) and any(
                (isinstance(c, Text) and bool(c.text.strip()))
                or (isinstance(c, Element) and self.has_text(c))
                for c in element.children
            )
        return self._has_text[key]

    def run(self, nodes: list[Node]) -> Run:
        run = Run(nodes, "", [], [], [])
        parts: list[str] = []
        length = 0

        def walk(children: list[Node], parent: int | None) -> None:
            nonlocal length
            for node in children:
                if isinstance(node, Text):
                    parts.append(node.text)
                    length += len(node.text)
                elif isinstance(node, Element) and self._reads_as_prose(node):
                    text = _plain(node)
                    run.spans.append(Span(node, length, length + len(text), parent, opaque=True))
                    parts.append(text)
                    length += len(text)
                elif isinstance(node, Element) and not node.closed_by_start and self.has_text(node):
                    index = len(run.spans)
                    run.spans.append(Span(node, length, length, parent))
                    walk(node.children, index)
                    run.spans[index].end = length
                else:
                    run.points.append(Point(verbatim(node), length, parent))
                    if self._breaks_line(node):
                        run.breaks.append(length)

        walk(nodes, None)
        run.text = "".join(parts)
        for span in run.spans:
            while span.start < span.end and run.text[span.start].isspace():
                span.start += 1
            while span.end > span.start and run.text[span.end - 1].isspace():
                span.end -= 1
        run.sentences = sentences(run.text, self.options.split, run.breaks)
        run.source_words = [w for a, b in run.sentences for w in words(run.text, a, b)]
        starts = [w.start for w in run.source_words]
        ends = [w.end for w in run.source_words]
        for span in run.spans:
            span.words = range(bisect_right(ends, span.start), bisect_left(starts, span.end))
        self.runs.append(run)
        return run

    def _reads_as_prose(self, element: Element) -> bool:
        """Left untranslated by the client's choice (not code or a script), holding words."""
        by_kind = self.options.kind == "html" and element.name in HTML_IGNORED
        return self.ignored(element) and not by_kind and bool(_plain(element).strip())

    def _breaks_line(self, node: Node) -> bool:
        return (
            self.options.kind == "html" and isinstance(node, Element) and (node.name in HTML_BREAKS)
        )


def _plain(element: Element) -> str:
    """The text of an element and its descendants."""
    return "".join(
        node.text if isinstance(node, Text) else _plain(node)
        for node in element.children
        if not isinstance(node, Opaque)
    )


def sentences(text: str, mode: SplitMode, breaks: Iterable[int] = ()) -> list[tuple[int, int]]:
    """[start, end) of each sentence of text, cut as the pipeline cuts plain text, and at every
    line break of the markup."""
    found = []
    bounds = [0, *sorted(set(breaks)), len(text)]
    for start, end in pairwise(bounds):
        piece = text[start:end]
        if mode != "sentences":  # line breaks read as spaces (HTML's own whitespace rule)
            piece = piece.translate(_LINE_BREAKS)
        split = split_text(piece, "none" if mode == "none" else "sentences")
        at = start + len(piece) - len(piece.lstrip())
        for index, sentence in enumerate(split.sentences):
            found.append((at, at + len(sentence)))
            at += len(sentence) + (
                len(split.separators[index]) if index < len(split.separators) else 0
            )
    return found


def words(text: str, start: int = 0, end: int | None = None) -> list[Word]:
    """The whitespace-separated words of text[start:end], as the model's words are (a
    SentencePiece word begins after whitespace), with offsets in text."""
    end = len(text) if end is None else end
    found = []
    at = start
    while at < end:
        if text[at].isspace():
            at += 1
            continue
        stop = at
        while stop < end and not text[stop].isspace():
            stop += 1
        found.append(_word(text, at, stop))
        at = stop
    return found


def _word(text: str, start: int, end: int) -> Word:
    core_start, core_end = start, end
    while core_start < end and not text[core_start].isalnum():
        core_start += 1
    if core_start == end:  # punctuation only: all of it is the core
        return Word(start, end, start, end)
    while not text[core_end - 1].isalnum():
        core_end -= 1
    return Word(start, end, core_start, core_end)


# --- The translated side of a run ----------------------------------------------------------


@dataclass
class SentenceTranslation:
    text: str
    alignment: WordAlignment | None  # None: the sentence was not translated, or has none


@dataclass
class Target:
    """A run's translation: its text (the translated sentences, with the source's whitespace
    between them), its words, and for each target word the source word it is aligned to."""

    text: str = ""
    words: list[Word] = field(default_factory=list)
    links: list[int | None] = field(default_factory=list)  # target word -> source word
    attention: list[dict[int, float]] = field(default_factory=list)  # target word -> weights
    # The source words that attend to each target word most of all (the other direction).
    claimed_by: list[set[int]] = field(default_factory=list)
    # (target offset, source offset, length) of the text copied from the source between
    # sentences: a point that stood there goes back to the same character.
    copied: list[tuple[int, int, int]] = field(default_factory=list)
    # (first source word, end, first target word, end) of each sentence.
    sentences: list[tuple[int, int, int, int]] = field(default_factory=list)

    def agrees(self, t: int, wrapped: range) -> bool:
        """Do both directions of the alignment tie target word t to the wrapped words? The
        hard alignment gives each target word the source word it attends to most; the other
        direction gives each source word the target word attending to it most. A word only
        one direction ties to a tag lies at its edge and belongs to a neighbour: in
        "la <b>rue</b>", "the" attends to "rue" most, but "la" claims it; in
        "en chemise <b>bleue</b>", the "a" of "a blue shirt" has no French word at all."""
        return any(s in wrapped for s in self.claimed_by[t])

    def reach(self, wrapped: range, first: int, end: int, low: int, high: int) -> tuple[int, int]:
        """[first, end) grown over the next words that attend to the wrapped ones most and
        that no source word claims: the decoder, writing left to right, is still translating
        them ("une <i>glace</i>" -> "an <i>ice cream</i>", "un enfant <b>joue</b>" -> "a child
        <b>is playing</b>"). Before the tag such words look ahead at what comes (the "a" of
        "a blue shirt"): they join only where nothing in the sentence comes before the tag."""
        if wrapped.start in {s0 for s0, *_ in self.sentences}:
            while first > low and self._free(first - 1, wrapped):
                first -= 1
        while end < high and self._free(end, wrapped):
            end += 1
        return first, end

    def _free(self, t: int, wrapped: range) -> bool:
        return self.links[t] in wrapped and not self.claimed_by[t]

    def project(self, boundary: int) -> int:
        """A place between source words -> the same relative place in the target sentence."""
        for s0, s1, t0, t1 in self.sentences:
            if boundary <= s1:
                return t0 + round(max(0, boundary - s0) * (t1 - t0) / max(1, s1 - s0))
        return len(self.words)


def assemble(run: Run, translations: list[SentenceTranslation]) -> Target:
    target = Target()
    parts: list[str] = []
    copied_until = 0

    def copy(until: int) -> None:
        gap = run.text[copied_until:until]
        target.copied.append((sum(map(len, parts)), copied_until, len(gap)))
        parts.append(gap)

    source_index = 0
    for (start, end), translation in zip(run.sentences, translations, strict=True):
        copy(start)
        offset = sum(map(len, parts))
        sentence_words = words(run.text, start, end)
        target_words = [_shift(w, offset) for w in words(translation.text)]
        links, attention = _links(len(sentence_words), len(target_words), translation.alignment)
        target.links += [None if s is None else s + source_index for s in links]
        target.attention += [{s + source_index: w for s, w in row.items()} for row in attention]
        target.claimed_by += [{s + source_index for s in c} for c in _claims(attention)]
        target.sentences.append(
            (
                source_index,
                source_index + len(sentence_words),
                len(target.words),
                len(target.words) + len(target_words),
            )
        )
        target.words += target_words
        source_index += len(sentence_words)
        parts.append(translation.text)
        copied_until = end
    copy(len(run.text))
    target.text = "".join(parts)
    return target


def _shift(word: Word, offset: int) -> Word:
    return Word(*(at + offset for at in (word.start, word.end, word.core_start, word.core_end)))


def _links(
    source_count: int, target_count: int, alignment: WordAlignment | None
) -> tuple[list[int | None], list[dict[int, float]]]:
    """Each target word's aligned source word, and its attention over the source words, in
    this sentence's words. The model's words are whitespace-separated like ours; if the counts
    still differ (a normalization of the tokenizer), indices are scaled. Without an alignment
    the diagonal stands in: the same relative position."""
    if alignment is None or not alignment.pairs or not alignment.source_words:
        return [_rescale(t, target_count, source_count) for t in range(target_count)], [
            {} for _ in range(target_count)
        ]
    model_sources, model_targets = len(alignment.source_words), len(alignment.target_words)
    links: list[int | None] = [None] * target_count
    for source, target in alignment.pairs:
        at = _rescale(target, model_targets, target_count)
        if links[at] is None:
            links[at] = _rescale(source, model_sources, source_count)
    attention: list[dict[int, float]] = [{} for _ in range(target_count)]
    for target, row in enumerate(alignment.weights):
        weights = attention[_rescale(target, model_targets, target_count)]
        for source, weight in enumerate(row):
            at = _rescale(source, model_sources, source_count)
            weights[at] = weights.get(at, 0.0) + weight
    return links, attention


def _claims(attention: list[dict[int, float]]) -> list[set[int]]:
    """For each target word, the source words whose attention peaks on it."""
    claimed: list[set[int]] = [set() for _ in attention]
    for source in {s for row in attention for s in row}:
        column = [row.get(source, 0.0) for row in attention]
        if max(column) > 0:
            claimed[column.index(max(column))].add(source)
    return claimed


def _rescale(index: int, count: int, new_count: int) -> int:
    if count == new_count:
        return index
    if count <= 1 or new_count <= 1:
        return 0
    return round(index * (new_count - 1) / (count - 1))


# --- Placement: spans around aligned words, points between them ----------------------------


def place_spans(run: Run, target: Target) -> list[tuple[int, int]]:
    """[first, end) target words of each span: laminar (two spans are nested or apart), each
    inside its parent's."""
    placed: list[tuple[int, int]] = []
    for span in run.spans:
        low, high = (0, len(target.words)) if span.parent is None else placed[span.parent]
        placed.append(_place_span(span.words, low, high, placed, target))
    return placed


def _place_span(
    wrapped: range, low: int, high: int, placed: list[tuple[int, int]], target: Target
) -> tuple[int, int]:
    if low >= high:
        return (low, low)
    hits = [t for t in range(low, high) if target.links[t] in wrapped]
    # The words both directions agree on, or failing any, what the hard alignment says.
    core = [t for t in hits if target.agrees(t, wrapped)] or hits
    if core:
        wanted = target.reach(wrapped, core[0], core[-1] + 1, low, high)
    else:
        wanted = _unaligned_span(wrapped, low, high, target)
    crossed = [other for other in placed if not _laminar(wanted, other)]
    if not crossed:
        return wanted
    # It would cross a span placed before it: of the stretches that do not, take the one with
    # the most of its words and the fewest others, then the nearest to what it wanted.
    ends = sorted(
        {low, high, *wanted, *(e for other in crossed for e in other if low <= e <= high)}
    )

    members = set(core)

    def score(stretch: tuple[int, int]) -> tuple[int, int]:
        inside = sum(1 for t in range(*stretch) if t in members)
        distance = abs(stretch[0] - wanted[0]) + abs(stretch[1] - wanted[1])
        return (2 * inside - (stretch[1] - stretch[0]), -distance)

    candidates = [
        (a, b)
        for a in ends
        for b in ends
        if a < b and all(_laminar((a, b), other) for other in placed)
    ]
    return max(candidates, key=score, default=(low, high))


def _unaligned_span(wrapped: range, low: int, high: int, target: Target) -> tuple[int, int]:
    """No target word is aligned to the span's words: the word that attended to them most, or
    failing that the same relative position."""
    attention = [sum(target.attention[t].get(s, 0.0) for s in wrapped) for t in range(low, high)]
    if attention and max(attention) > 0:
        best = low + attention.index(max(attention))
        return (best, best + 1)
    first = min(max(target.project(wrapped.start), low), high - 1)
    return (first, min(max(target.project(wrapped.stop), first + 1), high))


def _laminar(one: tuple[int, int], other: tuple[int, int]) -> bool:
    (a, b), (c, d) = one, other
    return b <= c or d <= a or (a <= c and d <= b) or (c <= a and b <= d)


def place_points(run: Run, target: Target, placed: list[tuple[int, int]]) -> list[int]:
    """The place of each point: k, between target words k-1 and k."""
    starts = [w.start for w in run.source_words]
    blocked: dict[int | None, set[int]] = {}  # by the points' parent
    places = []
    for point in run.points:
        if point.parent not in blocked:
            blocked[point.parent] = _inside_others(run, placed, point.parent)
        boundary = bisect_left(starts, point.at)  # the source words before the point
        low, high = (0, len(target.words)) if point.parent is None else placed[point.parent]
        places.append(_place_point(boundary, low, high, target, blocked[point.parent]))
    return places


def _place_point(boundary: int, low: int, high: int, target: Target, blocked: set[int]) -> int:
    """The place in [low, high] where the words before it are aligned to source words before
    the point and the words after it to words after it, not inside another span; ties go to
    the same relative position."""
    expected = target.project(boundary)
    links = target.links[low:high]
    misplaced = sum(1 for s in links if s is not None and s < boundary)  # all after it
    best: tuple[tuple[int, int], int] | None = None
    for k in range(low, high + 1):
        if k > low:  # word k-1 moves before the point
            s = links[k - 1 - low]
            misplaced += 0 if s is None else (1 if s >= boundary else -1)
        if k in blocked:
            continue
        key = (misplaced, abs(k - expected))
        if best is None or key < best[0]:
            best = (key, k)
    return low if best is None else best[1]


def _inside_others(run: Run, placed: list[tuple[int, int]], parent: int | None) -> set[int]:
    """The places strictly inside a span that does not hold the point's parent: a point put
    there would leave its parent."""
    ancestors = set(_ancestors(run, parent))
    return {
        k
        for index, (first, end) in enumerate(placed)
        if index not in ancestors
        for k in range(first + 1, end)
    }


def _ancestors(run: Run, parent: int | None) -> Iterable[int]:
    while parent is not None:
        yield parent
        parent = run.spans[parent].parent


# --- Writing --------------------------------------------------------------------------------


@dataclass
class _Out:
    """A span or point of the output tree, at characters [start, end) of the target text."""

    start: int
    end: int
    order: int  # source position: breaks ties between things at the same character
    element: Element | None = None  # None: markup copied as it is (a point, an opaque span)
    raw: str = ""
    children: list[_Out] = field(default_factory=list)


def render_run(run: Run, target: Target) -> str:
    placed = place_spans(run, target)
    root = _Out(0, len(target.text), -1)
    spans = [
        _span_out(span, stretch, run, target)
        for span, stretch in zip(run.spans, placed, strict=True)
    ]
    # Nest by word stretches: a parent (or, for the same stretch, the element first in the
    # source) before its children.
    stack: list[tuple[tuple[int, int], _Out]] = [((0, len(target.words)), root)]
    for index in sorted(range(len(placed)), key=lambda i: (placed[i][0], -placed[i][1], i)):
        a, b = placed[index]
        while len(stack) > 1 and not (stack[-1][0][0] <= a and b <= stack[-1][0][1]):
            stack.pop()
        stack[-1][1].children.append(spans[index])
        if spans[index].element is not None:  # what is copied as it is holds nothing
            stack.append((placed[index], spans[index]))
    for point, k in zip(run.points, place_points(run, target, placed), strict=True):
        at, raw = _point_out(point, k, run, target)
        holder = root if point.parent is None else spans[point.parent]
        holder.children.append(_Out(at, at, point.at, raw=raw))
    out: list[str] = []
    _write(root, target.text, out)
    return "".join(out)


def _span_out(span: Span, stretch: tuple[int, int], run: Run, target: Target) -> _Out:
    first, end = stretch
    if first >= end:  # nowhere to go (its parent has no words): an empty element
        at = target.words[first].start if first < len(target.words) else len(target.text)
        raw = verbatim(span.element) if span.opaque else ""
        return _Out(at, at, span.start, None if span.opaque else span.element, raw)
    start_anchor, end_anchor = WORD_START, WORD_END
    if span.words:
        start_anchor = _start_anchor(run.source_words[span.words.start], span.start)
        end_anchor = _end_anchor(run.source_words[span.words.stop - 1], span.end)
    start = target.words[first].anchor(start_anchor)
    end_at = max(start, target.words[end - 1].anchor(end_anchor))
    if span.opaque:  # the element as it was, in place of the words aligned to it
        return _Out(start, end_at, span.start, raw=verbatim(span.element))
    return _Out(start, end_at, span.start, span.element)


def _start_anchor(word: Word, at: int) -> int:
    """Where in its first word a span starts. A target word's leading punctuation goes inside
    the tag only if the source word's did."""
    if at <= word.start and word.core_start > word.start:
        return WORD_START
    return CORE_START if at < word.core_end else CORE_END


def _end_anchor(word: Word, at: int) -> int:
    """Where in its last word a span ends: "la <b>rue</b>." gives "the <b>street</b>."."""
    if at >= word.end and word.core_end < word.end:
        return WORD_END
    return CORE_END if at > word.core_start else CORE_START


def _point_out(point: Point, k: int, run: Run, target: Target) -> tuple[int, str]:
    """Where a point at place k goes, character for character, and what is written there."""
    gap_start = target.words[k - 1].end if k > 0 else 0
    gap_end = target.words[k].start if k < len(target.words) else len(target.text)
    for at, source_at, length in target.copied:  # between sentences: the source's own spot
        if (
            gap_start <= at
            and at + length <= gap_end
            and source_at <= point.at <= source_at + length
        ):
            return at + point.at - source_at, point.raw
    # Inside a translated sentence: keep whether whitespace stood before and after it.
    text = run.text
    space_before = point.at > 0 and text[point.at - 1].isspace()
    space_after = point.at < len(text) and text[point.at].isspace()
    gap = target.text[gap_start:gap_end] or " "
    if space_before and space_after:
        return gap_end, (gap if k == len(target.words) else "") + point.raw + (
            gap if k < len(target.words) else ""
        )
    if space_before:
        return gap_end, (gap if k == len(target.words) else "") + point.raw
    if space_after:
        return gap_start, point.raw + (gap if k == 0 else "")
    return gap_start, point.raw


def _write(node: _Out, text: str, out: list[str]) -> None:
    """Write node's children in order, each clamped inside node and after the one before it:
    whatever the placement, the output nests."""
    cursor = node.start
    for child in sorted(node.children, key=lambda c: (c.start, c.order)):
        start = min(max(child.start, cursor), node.end)
        out.append(_escape(text[cursor:start]))
        if child.element is None:  # copied as it is, over the target text it stands for
            out.append(child.raw)
            cursor = min(max(child.end, start), node.end)
            continue
        child.start, child.end = start, min(max(child.end, start), node.end)
        out.append(child.element.start)
        _write(child, text, out)
        out.append(child.element.end_tag)
        cursor = child.end
    out.append(_escape(text[cursor : node.end]))


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


def render(document: Document) -> str:
    return _render_block(document.root)


def _render_block(block: Block) -> str:
    inner = "".join(
        _render_block(item) if isinstance(item, Block) else _written(item) for item in block.items
    )
    return block.element.start + inner + block.element.end_tag


def _written(run: Run) -> str:
    """A run as translated, or as the source has it when there was nothing to translate."""
    if run.translated is not None:
        return run.translated
    return "".join(map(verbatim, run.nodes))


# --- Through the pipeline -------------------------------------------------------------------


@dataclass
class MarkupResult:
    texts: list[str]
    sentences: int
    input_tokens: int
    output_tokens: int


async def translate(
    service: TranslationService,
    model: LoadedModel,
    documents: list[Document],
    options: SearchOptions,
    client_gone: Callable[[], Awaitable[object]] | None = None,
) -> MarkupResult:
    """Every sentence of every document in one pipeline request, with alignment on; then each
    run written with its tags placed."""
    sources, owners = model_sentences(documents)
    if not sources:  # nothing but markup, numbers and symbols: the documents as they came
        return MarkupResult(write(documents, []), 0, 0, 0)
    options = replace(options, alignment=True, n_best=1)
    result = await _translate_sentences(service, model, sources, owners, options, client_gone)
    found = from_pipeline(result)
    if sum(map(len, sources)) > PREPARE_INLINE_CHARS:  # keep the event loop free
        texts = await asyncio.to_thread(write, documents, found)
    else:
        texts = write(documents, found)
    return MarkupResult(texts, result.sentences, result.input_tokens, result.output_tokens)


def model_sentences(documents: list[Document]) -> tuple[list[str], list[int]]:
    """What the model reads: each sentence that has letters, on one line; and the index of the
    document it belongs to."""
    sources, owners = [], []
    for owner, document in enumerate(documents):
        for run in document.runs:
            if not run.needs_model:  # written as it came
                continue
            for start, end in run.sentences:
                if has_letters(sentence := run.text[start:end]):
                    sources.append(sentence.translate(_LINE_BREAKS))
                    owners.append(owner)
    return sources, owners


def write(documents: list[Document], translations: list[SentenceTranslation]) -> list[str]:
    """The documents written with the translations of their model_sentences(), in order."""
    found = iter(translations)
    for document in documents:
        for run in document.runs:
            if not run.needs_model:
                continue
            sentences = [
                next(found) if has_letters(sentence) else SentenceTranslation(sentence, None)
                for sentence in (run.text[start:end] for start, end in run.sentences)
            ]  # a sentence without letters comes back as it was, as the pipeline does
            run.translated = render_run(run, assemble(run, sentences))
    return [render(document) for document in documents]


def from_pipeline(result: RequestResult) -> list[SentenceTranslation]:
    """The pipeline's answer to model_sentences() (one text per sentence), as write() takes it."""
    return [
        SentenceTranslation(_model_text(item.text), _word_view(item.alignment))
        for item in result.texts
    ]


def _word_view(alignment: list[SentenceAlignment]) -> WordAlignment | None:
    return alignment[0].words if alignment else None


def _model_text(text: str) -> str:
    """The model learned English with "&" written "&amp;" (Multi30k's references): read as
    text, the markup gets "&amp;" again when written, not "&amp;amp;"."""
    return html.unescape(text) if "&" in text else text


async def _translate_sentences(
    service: TranslationService,
    model: LoadedModel,
    sources: list[str],
    owners: list[int],
    options: SearchOptions,
    client_gone: Callable[[], Awaitable[object]] | None,
) -> RequestResult:
    """The pipeline sees one text per sentence; its errors name the client's text instead."""
    try:
        return await service.translate(model, sources, options, client_gone, split="none")
    except InvalidInput as error:
        index = error.location[-1]
        if error.kind != "too_many_tokens" or not isinstance(index, int):
            raise
        owner = owners[index]
        raise InvalidInput(
            ("body", "text", owner),
            f"text[{owner}] holds a sentence longer than {model.max_tokens_per_sentence} "
            "tokens (NMT_MAX_TOKENS_PER_SENTENCE): split it into shorter sentences",
            error.kind,
        ) from error
    except TranslationFailed as error:
        reason = str(error).partition(": ")[2]
        raise TranslationFailed(owners[error.text_index], reason) from error
