"""Sentences too long for the model, cut at spaces into pieces it can read: for document files.

A sentence is what the model reads at once, at most NMT_MAX_TOKENS_PER_SENTENCE tokens (and
the model's positions). Text sent to the translation API gets a 4xx naming the sentence, so
that its client can split it. A document file has no one to tell: a paragraph without
sentence ends (a list run on with semicolons, verse, a table cell of keywords) longer than that
would fail the whole file, after its upload was accepted. There such a sentence is cut at
spaces into pieces, each translated as a sentence of its own, the spaces between them kept.

How big a piece: one as long as the limit allows is translated badly (a model learns from
sentences of a few dozen tokens: Multi30k's captions are about 16), with repetitions and
drops. Run-on paragraphs of twelve test_2016_flickr captions joined by commas (190 tokens),
translated by the committed model: chrF 34 whole, 41 in pieces of up to 128 tokens, 62 in
pieces of up to 48 ending at a clause's end once they hold 60% of an even piece, 66 once they
hold 30%; each caption alone, 72. On test_2017_flickr, not looked at before: 32 whole, 64 cut
so, 68 each alone (`python -m bench.long_sentences`, docs/benchmarks.md). So
pieces hold at most PIECE_TOKENS and end at a comma or semicolon once they hold
CLAUSE_SHARE of an even piece. A single word longer than the limit (no space to cut at) is a
piece of its own, and still fails its file, naming the limit.

Only sentences past the limit are cut: one within it is the model's to read whole, as the
translation API reads it (a model that reads long sentences badly, as the committed one does
a 190-token paragraph, is better served with NMT_MAX_TOKENS_PER_SENTENCE lowered: the API
then refuses such sentences, and documents cut them). Cutting at spaces keeps the run's
words as the layout found them (a word never crosses a space), and so the inline tags' places
(their word ranges).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from service.documents.markup.layout import Document, Run, Word, words
from service.serving.input_text import has_letters

# The tokens the model would read for each text, its special tokens included.
TokenCounter = Callable[[list[str]], list[int]]
# The most tokens a piece of a cut sentence holds (the sentence's limit, if lower), and the
# share of an even piece after which it ends at a clause's end: measured, see above.
PIECE_TOKENS = 48
CLAUSE_SHARE = 0.3
_CLAUSE_ENDS = ",;:，；：、"


def fit_sentences(
    documents: list[Document],
    tokens_of: TokenCounter,
    limit: int,
    piece_tokens: int = PIECE_TOKENS,
    clause_share: float = CLAUSE_SHARE,
) -> int:
    """Cut, in place (each run's `sentences`), every sentence the model would read as more than
    `limit` tokens into pieces of at most `piece_tokens` (or `limit`). Returns how many were
    cut. (The two last arguments: for bench/long_sentences.py, which measured them.)"""
    found = [
        (document, run, index)
        for document in documents
        for run in document.runs
        if run.needs_model
        for index, (start, end) in enumerate(run.sentences)
        if has_letters(run.text[start:end])
    ]
    counts = tokens_of([_sentence(run, index) for _, run, index in found])
    too_long = [
        (document, run, index)
        for (document, run, index), count in zip(found, counts, strict=True)
        if count > limit
    ]
    # Last first within a run, so that the indices still to cut stay where they were.
    for document, run, index in reversed(too_long):
        start, end = run.sentences[index]
        sentence_words = words(run.text, start, end)
        run.sentences[index : index + 1] = _pieces(
            run.text, sentence_words, tokens_of, min(limit, piece_tokens), clause_share
        )
        document.__dict__.pop("model_sentences", None)  # a cached_property of the sentences
    return len(too_long)


def _sentence(run: Run, index: int) -> str:
    start, end = run.sentences[index]
    return run.text[start:end]


def _pieces(
    text: str,
    sentence_words: list[Word],
    tokens_of: TokenCounter,
    piece_tokens: int,
    clause_share: float,
) -> list[tuple[int, int]]:
    """[start, end) of each piece: runs of whole words, each read as at most `piece_tokens`
    tokens (a word longer than that alone is a piece of its own), of about equal size, ending
    at a clause's end (a comma, a semicolon) once they hold `clause_share` of an even one."""
    overhead = tokens_of([""])[0]  # the special tokens every text is read with
    own = [count - overhead for count in tokens_of([text[w.start : w.end] for w in sentence_words])]
    room = max(piece_tokens - overhead, 1)
    target = sum(own) / max(math.ceil(sum(own) / room), 1)
    groups: list[list[int]] = [[]]
    size = 0
    for index, count in enumerate(own):
        if groups[-1] and size + count > room:
            groups.append([])
            size = 0
        groups[-1].append(index)
        size += count
        clause_end = text[sentence_words[index].end - 1] in _CLAUSE_ENDS
        if size >= target or (clause_end and size >= clause_share * target):
            groups.append([])
            size = 0
    groups = [group for group in groups if group]
    # Pieces read alone are cut as the words were (SentencePiece cuts at spaces), so each
    # count is exact but for the text's normalization: checked, and halved until it fits.
    pieces: list[tuple[int, int]] = []
    while groups:
        group = groups.pop(0)
        span = (sentence_words[group[0]].start, sentence_words[group[-1]].end)
        if len(group) > 1 and tokens_of([text[span[0] : span[1]]])[0] > piece_tokens:
            half = len(group) // 2
            groups[:0] = [group[:half], group[half:]]
            continue
        pieces.append(span)
    return pieces
