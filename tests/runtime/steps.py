"""The whole next-token distribution of a step, for checks against torch: the engine's step
selects the top k in the graph, so asking for k = V and putting the answers back in
vocabulary order gives every word's log-prob."""

from __future__ import annotations

import numpy as np

from service.runtime.engine import Engine, StepResult
from service.runtime.kv_cache import KVCache


def full_log_probs(
    engine: Engine, cache: KVCache, tokens: np.ndarray, want_alignment: bool = False
) -> tuple[np.ndarray, StepResult]:
    """One step of every row: log-probs [rows, V] (-inf for a word a shortlist leaves out),
    and the step's result."""
    result = engine.step(cache, tokens, engine.vocab_size, want_alignment=want_alignment)
    log_probs = np.full((len(tokens), engine.vocab_size), -np.inf, dtype=np.float32)
    np.put_along_axis(log_probs, result.top_ids, result.top_log_probs, axis=1)
    return log_probs, result
