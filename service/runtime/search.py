"""Batched greedy and beam search over a fixed set of sentences.

The search itself lives in running_batch.py: a `RunningBatch` decodes any set of sentences
step by step, letting sentences join and leave between steps (the server's continuous
batching uses it that way). Searching a fixed set is the special case where every sentence
joins at step 0 and nobody joins later: that is `search` here, for the CLI, the warm-up and
the benchmarks.

Unlike the torch reference (export/decoding.py), rows stop costing compute when they are
done: finished greedy rows and finished beam sentences leave the batch (and their caches) at
once, and source padding that no remaining row needs is cut from the cross-attention
keys/values. So do the sentences nobody waits for any more (their request timed out or its
client left): the caller's `abandoned` callback names them between steps, and they come back
with no hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nmt_contract import Hypothesis, length_limit
from service.runtime.engine import Engine
from service.runtime.running_batch import (
    MAX_REPEAT_NGRAM,
    SearchOptions,
    Sentence,
    pad_sources,
    repeat_closers,
    running_batch,
)

# Which sources of the batch (by position) nobody waits for any more; asked between steps.
Abandoned = Callable[[], "np.ndarray | list[bool]"]

__all__ = [
    "MAX_REPEAT_NGRAM",
    "Abandoned",
    "Hypothesis",
    "SearchOptions",
    "length_limit",
    "pad_sources",
    "repeat_closers",
    "search",
]


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
