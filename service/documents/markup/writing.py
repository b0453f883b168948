"""Writing: the output tree of a translated run, and the documents written from it."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from service.documents.markup.layout import (
    CORE_END,
    CORE_START,
    WORD_END,
    WORD_START,
    Block,
    Document,
    Point,
    Run,
    Span,
    Word,
)
from service.documents.markup.placement import place_points, place_spans
from service.documents.markup.target import Target
from service.documents.markup.tree import Element, verbatim


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
    # Each span in its parent, as in the source (placement keeps it inside its parent's words
    # and apart from the others'); an element copied as it is holds nothing of its own.
    for span, out in zip(run.spans, spans, strict=True):
        holder = root if span.parent is None else spans[span.parent]
        holder.children.append(out)
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
