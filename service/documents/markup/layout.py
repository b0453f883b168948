"""Layout: blocks stay in place; runs of inline content (text, spans and points) get
translated, cut into sentences and words."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise

from service.documents.markup.tree import (
    HTML_BLOCKS,
    HTML_BREAKS,
    HTML_IGNORED,
    LINE_BREAKS,
    Element,
    MarkupOptions,
    Node,
    Opaque,
    Text,
    parse,
    verbatim,
)
from service.serving.errors import RequestTooLarge
from service.serving.input_text import clean_text, has_letters
from service.serving.requests import off_loop
from service.serving.sentences import SplitMode, split_text

# Markup is read and written by pure Python that holds the GIL: threads cannot share that work
# out, only take turns. One thread does it in turn (FIFO), so that the event loop competes with
# one holder of the GIL, not several (measured: docs/reliability.md, "Markup parsed on the
# event loop").
MARKUP_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-markup")


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
    chars: int = 0  # of the markup it was read from: what decides whether writing leaves the loop

    @property
    def plain_text(self) -> str:
        """What the markup says, for language detection."""
        return "\n".join(run.text for run in self.runs)

    @cached_property
    def model_sentences(self) -> list[str]:
        """What the model reads: each sentence that has letters, on one line (the others are
        written as they came)."""
        return [
            sentence.translate(LINE_BREAKS)
            for run in self.runs
            if run.needs_model
            for start, end in run.sentences
            if has_letters(sentence := run.text[start:end])
        ]


def read(
    texts: list[str], options: MarkupOptions, max_sentences: int | None = None
) -> list[Document]:
    """Parse and lay out each text; MarkupError for XML that cannot be read, InvalidInput for
    text that is not Unicode (naming the text, as the pipeline does). With `max_sentences`
    (NMT_MAX_SENTENCES_PER_REQUEST, which the pipeline would apply to these sentences),
    RequestTooLarge as soon as the texts read so far pass it: a request far past the limit is
    refused without parsing the rest."""
    documents: list[Document] = []
    sentences = 0
    for index, text in enumerate(texts):
        clean_text(text, index)  # a lone surrogate: refused before any parsing
        document = _Layout(options).document(parse(text, options.kind), len(text))
        documents.append(document)
        sentences += len(document.model_sentences) if max_sentences is not None else 0
        if max_sentences is not None and sentences > max_sentences:
            raise RequestTooLarge(sentences, max_sentences, at_least=index + 1 < len(texts))
    return documents


async def read_off_loop(
    texts: list[str], options: MarkupOptions, max_sentences: int | None = None
) -> list[Document]:
    """read(), on a worker thread when the texts are long (pipeline.off_loop's rule): parsing
    312 KB of markup takes seconds of CPU, which the event loop must not spend."""
    return await off_loop(
        sum(map(len, texts)), read, texts, options, max_sentences, executor=MARKUP_THREAD
    )


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

    def document(self, root: Element, chars: int) -> Document:
        block = self.block(root)
        return Document(block, self.runs, chars)

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
        # (A method, not a closure that calls itself: such a closure is a reference cycle,
        # which would hold the run and its tree until the cycle collector runs instead of
        # freeing them with their last reference: documents/collection.py.)
        self._walk(run, nodes, None, parts, 0)
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

    def _walk(
        self, run: Run, children: list[Node], parent: int | None, parts: list[str], length: int
    ) -> int:
        """The run's spans and points under `parent` (a span's index), its text appended to
        `parts`; `length`: the text's length so far, returned as it is after `children`."""
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
                length = self._walk(run, node.children, index, parts, length)
                run.spans[index].end = length
            else:
                run.points.append(Point(verbatim(node), length, parent))
                if self._breaks_line(node):
                    run.breaks.append(length)
        return length

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
            piece = piece.translate(LINE_BREAKS)
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
