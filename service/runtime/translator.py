"""Texts in, translations out: tokenize, batch by length, search, detokenize, restore order."""

from __future__ import annotations

from dataclasses import dataclass

from service.runtime.bundle import Bundle
from service.runtime.engine import Engine, EngineOptions
from service.runtime.search import Abandoned, Hypothesis, SearchOptions, search
from service.runtime.tokenizer import BundleTokenizer


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

    def translate(
        self, texts: list[str], options: SearchOptions | None = None, batch_size: int = 32
    ) -> list[Translation]:
        options = options or SearchOptions()
        sources = self.tokenizer.encode(texts)
        found = self.translate_ids(sources, options, batch_size)
        return [
            Translation(self.tokenizer.decode(h[0].tokens), h, s)
            for h, s in zip(found, sources, strict=True)
        ]
