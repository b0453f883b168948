"""Translating through a pivot language: when no model translates A → B but A → en and en → B
exist, the text goes through English, as LibreTranslate and Argos do.

The first model's sentences become the second model's inputs one by one (split "none"), so the
sentences of both legs line up and the text keeps its layout. Alignment composes: if the
first model's target piece i attended to source piece j with weight W1[i, j], and the second
model's target piece k attended to its source piece i' with W2[k, i'], then k attended to j
with (W2 · M · W1)[k, j], where M maps the second model's pieces of the English sentence onto
the first model's pieces of it (the same text cut by two tokenizers: by shared characters).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.serving.registry import LoadedModel
from service.serving.word_alignment import END, WORD_START

PIVOT_LANGUAGE = "en"


@dataclass(frozen=True)
class Pivot:
    """A → B as two models chained: `first` (A → via), then `second` (via → B)."""

    first: LoadedModel
    second: LoadedModel

    @property
    def via(self) -> str:
        return self.first.target_lang

    @property
    def name(self) -> str:
        return f"{self.first.name}+{self.second.name}"

    @property
    def version(self) -> None:
        return None

    @property
    def labels(self) -> tuple[str, str]:
        return self.name, ""

    @property
    def source_lang(self) -> str:
        return self.first.source_lang

    @property
    def target_lang(self) -> str:
        return self.second.target_lang

    @property
    def pair(self) -> str:
        return f"{self.source_lang}-{self.target_lang}"

    @property
    def decoder_layers(self) -> int:
        """An alignment layer must exist in both models."""
        return min(self.first.decoder_layers, self.second.decoder_layers)

    @property
    def max_tokens_per_sentence(self) -> int:
        return self.first.max_tokens_per_sentence

    @property
    def first_token(self) -> None:
        """Each leg forces its own (TranslationService._through)."""
        return None


def pivot_for(models: list[LoadedModel], source: str, target: str) -> Pivot | None:
    """source -> PIVOT_LANGUAGE -> target, when both legs are served (and neither end is the
    pivot language itself); bilingual models before multilingual ones, as for a direct pair."""
    if PIVOT_LANGUAGE in (source, target) or source == target:
        return None
    first = _serving(models, source, PIVOT_LANGUAGE)
    second = _serving(models, PIVOT_LANGUAGE, target)
    return Pivot(first, second) if first is not None and second is not None else None


def _serving(models: list[LoadedModel], source: str, target: str) -> LoadedModel | None:
    found = [m for m in models if m.translates(source, target)]
    if not found:
        return None
    return min(found, key=lambda m: m.multilingual).directed(source, target)


def pivot_pairs(models: list[LoadedModel]) -> list[tuple[str, str]]:
    """The (source, target) pairs that only a pivot translates."""
    direct = {pair for m in models for pair in m.pairs()}
    into = {a for a, b in direct if b == PIVOT_LANGUAGE}
    out_of = {b for a, b in direct if a == PIVOT_LANGUAGE}
    return sorted((a, b) for a in into for b in out_of if a != b and (a, b) not in direct)


def compose_weights(
    first_weights: np.ndarray,
    first_target: list[str],
    second_weights: np.ndarray,
    second_source: list[str],
) -> np.ndarray:
    """[second target, second source] · M · [first target, first source] ->
    [second target, first source], M [second source, first target] from shared characters."""
    bridge = piece_overlap(second_source, first_target)
    return second_weights @ bridge @ first_weights


def piece_overlap(rows: list[str], columns: list[str]) -> np.ndarray:
    """[len(rows), len(columns)]: the share of each row piece's characters that lie in each
    column piece, the two being cuts of one text (word starts "▁" and spaces ignored).
    `</s>` maps to `</s>`. Where the two cuts do not spell the same characters (a tokenizer
    normalised something), pieces map by their relative position instead."""
    row_spans, row_text = _spans(rows)
    column_spans, column_text = _spans(columns)
    overlap = np.zeros((len(rows), len(columns)))
    same = row_text == column_text and len(row_text) > 0
    scale = len(column_text) / max(len(row_text), 1)
    for r, (start, end) in enumerate(row_spans):
        if start < 0:  # </s>
            overlap[r, [c for c, piece in enumerate(columns) if piece == END]] = 1.0
            continue
        if start == end and row_text:  # a lone "▁": it starts the word of the next character
            start = min(start, len(row_text) - 1)
            end = start + 1
        if not same:
            start, end = start * scale, max(end * scale, start * scale + 1e-9)
        length = end - start
        for c, (column_start, column_end) in enumerate(column_spans):
            if column_start < 0 or length <= 0:
                continue
            shared = min(end, column_end) - max(start, column_start)
            if shared > 0:
                overlap[r, c] = shared / length
    return overlap


def _spans(pieces: list[str]) -> tuple[list[tuple[int, int]], str]:
    """Each piece's [start, end) in the text the pieces spell without spaces; (-1, -1) for
    </s>."""
    spans, text = [], ""
    for piece in pieces:
        if piece == END:
            spans.append((-1, -1))
            continue
        characters = piece.replace(WORD_START, "").replace(" ", "")
        spans.append((len(text), len(text) + len(characters)))
        text += characters
    return spans, text
