"""From subword cross-attention to words: which source word each target word attended to.

The decoder attends over SentencePiece pieces; people (and Moses-style tools) think in words.
A piece that starts with "▁" starts a word. For a target word t and a source word s, the word
weight is the attention of t's pieces on s's pieces, summed over s's pieces (how much of the
attention went to that word) and averaged over t's pieces (a long word is not worth more).
`</s>` on either side is no word. The hard alignment pairs each target word with the source
word it attended to most, as `source-target` index pairs (the order of Moses and fast_align).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WORD_START = "▁"
END = "</s>"


@dataclass
class WordAlignment:
    source_words: list[str]
    target_words: list[str]
    weights: list[list[float]]  # [target word][source word]
    pairs: list[tuple[int, int]]  # (source word, target word), one per target word

    @property
    def moses(self) -> str:
        """The hard alignment as Moses writes it: "0-0 1-2 ..." (source-target)."""
        return " ".join(f"{source}-{target}" for source, target in self.pairs)


def group_words(pieces: list[str]) -> tuple[list[str], list[int]]:
    """Pieces -> (words, the word index of each piece, -1 for </s>)."""
    words: list[str] = []
    word_of: list[int] = []
    for position, piece in enumerate(pieces):
        if piece == END:
            word_of.append(-1)
            continue
        if piece.startswith(WORD_START) or not words or (position and pieces[position - 1] == END):
            words.append(piece.removeprefix(WORD_START))
        else:
            words[-1] += piece
        word_of.append(len(words) - 1)
    return words, word_of


def word_alignment(
    source_pieces: list[str], target_pieces: list[str], weights: np.ndarray, decimals: int = 3
) -> WordAlignment:
    """weights [target pieces, source pieces] -> the word-level view and hard alignment."""
    source_words, source_word_of = group_words(source_pieces)
    target_words, target_word_of = group_words(target_pieces)
    source_index = np.array(source_word_of)
    target_index = np.array(target_word_of)
    # Sum over each source word's pieces: [target pieces, source words]
    by_source = np.zeros((len(target_pieces), len(source_words)))
    for word in range(len(source_words)):
        by_source[:, word] = weights[:, source_index == word].sum(axis=1)
    # Average over each target word's pieces: [target words, source words]
    by_word = np.zeros((len(target_words), len(source_words)))
    for word in range(len(target_words)):
        by_word[word] = by_source[target_index == word].mean(axis=0)
    pairs = [(int(row.argmax()), t) for t, row in enumerate(by_word)] if source_words else []
    return WordAlignment(source_words, target_words, by_word.round(decimals).tolist(), pairs)
