"""Texts in, translations out: tokenize, batch by length, search, detokenize, restore order.

For a fixed set of sentences (the CLI, the warm-up, benchmarks): every sentence joins one
running batch at step 0 and nobody joins later. The server decodes through the same running
batches, letting sentences join and leave between steps (service/serving/loop.py).

Unlike the torch reference (export/decoding.py), rows stop costing compute when they are
done: finished sentences leave the batch (and its caches) at once, and so do the sentences
nobody waits for any more (the caller's `abandoned` callback names them between steps; they
come back with no hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from nmt_contract import Hypothesis
from service.runtime.bundle import Bundle
from service.runtime.engine import Engine
from service.runtime.running_batch import running_batch
from service.runtime.search import SearchOptions, Sentence
from service.runtime.sessions import EngineOptions
from service.runtime.tokenizer import BundleTokenizer

# Which sources of the batch (by position) nobody waits for any more; asked between steps.
Abandoned = Callable[[], "np.ndarray | list[bool]"]


def search(
    engine: Engine,
    sources: list[list[int]],
    options: SearchOptions,
    abandoned: Abandoned | None = None,
) -> list[list[Hypothesis]]:
    """Source id lists (each ending in </s>, at least one token) -> the n-best hypotheses of
    each, best first, in the order of `sources` ([] for a source abandoned midway)."""
    if not 1 <= options.n_best <= options.beam_size:
        raise ValueError(
            f"n_best must be between 1 and beam_size={options.beam_size}, got {options.n_best}"
        )
    results: list[list[Hypothesis]] = [[] for _ in sources]
    if not sources:
        return results
    batch = running_batch(engine, options.beam_size)
    batch.join([Sentence(source, options, ticket=i) for i, source in enumerate(sources)])
    while len(batch):
        for finished in batch.step():
            results[finished.sentence.ticket] = finished.hypotheses
        if abandoned is not None and len(batch):
            gone = np.asarray(abandoned(), dtype=bool)
            batch.drop(lambda sentence, gone=gone: bool(gone[sentence.ticket]))
    return results


@dataclass
class Translation:
    text: str
    hypotheses: list[Hypothesis]  # n-best, best first; hypotheses[0] made `text`
    source_ids: list[int]


class Translator:
    """One bundle, ready to translate. Knows nothing of HTTP."""

    def __init__(self, bundle: Bundle, options: EngineOptions | None = None) -> None:
        self.bundle = bundle
        self.engine = Engine(bundle, options)
        self.tokenizer = BundleTokenizer(bundle)

    def translate_ids(
        self,
        sources: list[list[int]],
        options: SearchOptions,
        batch_size: int = 32,
        abandoned: Abandoned | None = None,
    ) -> list[list[Hypothesis]]:
        """Sorted by length into batches of at most batch_size (less padding), then reordered.
        `abandoned` (by position in `sources`) lets sentences nobody waits for leave early."""
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        results: list[list[Hypothesis]] = [[] for _ in sources]
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            chunk_abandoned = None
            if abandoned is not None:

                def chunk_abandoned(chunk: list[int] = chunk) -> list[bool]:
                    flags = abandoned()
                    return [bool(flags[i]) for i in chunk]

            found = search(self.engine, [sources[i] for i in chunk], options, chunk_abandoned)
            for index, hypotheses in zip(chunk, found, strict=True):
                results[index] = hypotheses
        return results

    def first_token(self, target_lang: str | None) -> int | None:
        """What a translation into `target_lang` starts with: a multilingual bundle's target
        language token (UnknownLanguage for one it lacks); None for a bilingual bundle."""
        languages = self.tokenizer.languages
        if languages is None:
            return None
        return languages.forced_target(target_lang or self.bundle.target_lang)

    def translate(
        self,
        texts: list[str],
        options: SearchOptions | None = None,
        batch_size: int = 32,
        source_lang: str | None = None,
        target_lang: str | None = None,
    ) -> list[Translation]:
        """`source_lang`, `target_lang`: the pair, for a multilingual bundle (default: the
        bundle's own pair)."""
        options = replace(options or SearchOptions(), first_token=self.first_token(target_lang))
        sources = self.tokenizer.encode(texts, source_lang)
        found = self.translate_ids(sources, options, batch_size)
        return [
            Translation(self.tokenizer.decode(h[0].tokens), h, s)
            for h, s in zip(found, sources, strict=True)
        ]
