"""The translated side of a run: its text, its words and their alignment to the source words."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.documents.markup.layout import Run, Word, words
from service.serving.word_alignment import WordAlignment


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
