"""An in-process LRU cache of sentence translations, so that repeated sentences (a UI string
translated for every visitor, a bot re-posting a template) skip the queue and the engine.

Keyed by model and version, the sentence's token ids and the decoding options, which together
decide the result; the value is the sentence's hypotheses exactly as the engine returned them,
so a hit answers what a miss would. Bounded both in entries and in bytes (NMT_CACHE_ENTRIES,
NMT_CACHE_BYTES; 0 turns it off). Used only on the event loop, so it needs no lock.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Protocol

from nmt_contract import Hypothesis
from service.runtime.search import SearchOptions
from service.serving.observer import ModelLabels

# (model, version), the source ids, the options: a new version never answers from an old one's.
Key = tuple[ModelLabels, tuple[int, ...], SearchOptions]


class CacheObserver(Protocol):
    """What the cache reports (implemented by metrics.Metrics)."""

    def observe_cache(self, model: ModelLabels, hits: int, misses: int, evictions: int) -> None: ...


def _size(key: Key, hypotheses: list[Hypothesis]) -> int:
    """About how many bytes an entry holds: its ids, tokens, and alignment arrays."""
    size = sys.getsizeof(key[1]) + 8 * len(key[1])
    for hypothesis in hypotheses:
        size += 100 + 8 * len(hypothesis.tokens)
        if hypothesis.alignment is not None:
            size += hypothesis.alignment.nbytes
    return size


class TranslationCache:
    def __init__(
        self, max_entries: int, max_bytes: int, observer: CacheObserver | None = None
    ) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.bytes = 0
        self._entries: OrderedDict[Key, tuple[list[Hypothesis], int]] = OrderedDict()
        self._observer = observer

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, model: ModelLabels, sources: list[list[int]], options: SearchOptions
    ) -> list[list[Hypothesis] | None]:
        """Each source's cached hypotheses, or None for a miss."""
        if not self.enabled:
            return [None] * len(sources)
        found: list[list[Hypothesis] | None] = []
        for source in sources:
            entry = self._entries.get((model, tuple(source), options))
            if entry is not None:
                self._entries.move_to_end((model, tuple(source), options))
            found.append(entry[0] if entry is not None else None)
        hits = sum(f is not None for f in found)
        self._report(model, hits, len(found) - hits, 0)
        return found

    def store(
        self,
        model: ModelLabels,
        sources: list[list[int]],
        options: SearchOptions,
        results: list[list[Hypothesis]],
    ) -> None:
        if not self.enabled:
            return
        evicted = 0
        for source, hypotheses in zip(sources, results, strict=True):
            key = (model, tuple(source), options)
            size = _size(key, hypotheses)
            if size > self.max_bytes:
                continue  # larger than the whole cache: never worth it
            if key in self._entries:
                self.bytes -= self._entries.pop(key)[1]
            self._entries[key] = (hypotheses, size)
            self.bytes += size
            while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped
                evicted += 1
        if evicted:
            self._report(model, 0, 0, evicted)

    def _report(self, model: ModelLabels, hits: int, misses: int, evictions: int) -> None:
        if self._observer:
            self._observer.observe_cache(model, hits, misses, evictions)
