"""Placement: spans around aligned target words, points between them."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from service.documents.markup.layout import Run
from service.documents.markup.target import Target


def place_spans(run: Run, target: Target) -> list[tuple[int, int]]:
    """[first, end) target words of each span: inside its parent's, and apart from every span
    that is not its ancestor, as in the source. (Nested in a sibling, a span would change
    parent: two links side by side came back as a link inside a link, which is not HTML.)"""
    placed: list[tuple[int, int]] = []
    for index, span in enumerate(run.spans):
        low, high = (0, len(target.words)) if span.parent is None else placed[span.parent]
        ancestors = set(_ancestors(run, span.parent))
        others = [placed[i] for i in range(index) if i not in ancestors]
        placed.append(_place_span(span.words, low, high, others, target))
    return placed


def _place_span(
    wrapped: range, low: int, high: int, others: list[tuple[int, int]], target: Target
) -> tuple[int, int]:
    """The span's stretch in [low, high], apart from the `others` placed before it."""
    if low >= high:
        return (low, low)
    hits = [t for t in range(low, high) if target.links[t] in wrapped]
    # The words both directions agree on, or failing any, what the hard alignment says.
    core = [t for t in hits if target.agrees(t, wrapped)] or hits
    if core:
        wanted = target.reach(wrapped, core[0], core[-1] + 1, low, high)
    else:
        wanted = _unaligned_span(wrapped, low, high, target)
    crossed = [other for other in others if not _apart(wanted, other)]
    if not crossed:
        return wanted
    # It would overlap a span placed before it: of the stretches that do not, take the one
    # with the most of its words and the fewest others, then the nearest to what it wanted.
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
        if a < b and all(_apart((a, b), other) for other in others)
    ]
    if candidates:
        return max(candidates, key=score)
    # Every word it could hold is another's: empty, where it wanted to start (or the nearest
    # place that is not inside another span).
    free = [k for k in ends if all(_apart((k, k), other) for other in others)]
    start = min(free, key=lambda k: abs(k - wanted[0]), default=low)
    return (start, start)


def _unaligned_span(wrapped: range, low: int, high: int, target: Target) -> tuple[int, int]:
    """No target word is aligned to the span's words: the word that attended to them most, or
    failing that the same relative position."""
    attention = [sum(target.attention[t].get(s, 0.0) for s in wrapped) for t in range(low, high)]
    if attention and max(attention) > 0:
        best = low + attention.index(max(attention))
        return (best, best + 1)
    first = min(max(target.project(wrapped.start), low), high - 1)
    return (first, min(max(target.project(wrapped.stop), first + 1), high))


def _apart(one: tuple[int, int], other: tuple[int, int]) -> bool:
    """Neither holds the other's words, nor would be written inside it: an empty span at
    another's start is opened after it (writing.py opens the longer first), so inside it."""
    (a, b), (c, d) = one, other
    if c == d:  # an empty span placed before: only one starting inside it would hold it
        return not (a < c < b)
    if a == b:
        return a < c or d <= a
    return b <= c or d <= a


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
