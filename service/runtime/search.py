"""Batched greedy and beam search on the ONNX Runtime engine, as strategies behind one small
interface (as CTranslate2 separates GreedySearch from BeamSearch): a new way to search is a new
`SearchStrategy` subclass, not a new branch.

Same conventions as the torch reference (export/decoding.py), which the tests hold this to,
written once in nmt_contract:
* a sentence may produce at most `length_limit(source_length)` tokens, </s> included;
* a hypothesis' raw score (log_prob) is the sum of its tokens' log-probs;
* hypotheses are ranked by log_prob / length ** length_penalty.

Unlike the reference, rows stop costing compute when they are done: finished greedy rows and
finished beam sentences leave the batch (and their caches) at once, and source padding that no
remaining row needs is cut from the cross-attention keys/values. So do the sentences nobody
waits for any more (their request timed out or its client left): the caller's `abandoned`
callback names them between steps, and they come back with no hypothesis.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nmt_contract import Hypothesis, length_limit
from service.runtime.engine import Engine

# Which sources of the batch (by position) nobody waits for any more; asked between steps.
Abandoned = Callable[[], "np.ndarray | list[bool]"]

__all__ = [
    "Abandoned",
    "BeamSearch",
    "GreedySearch",
    "Hypothesis",
    "SearchOptions",
    "SearchStrategy",
    "length_limit",
    "pad_sources",
    "search",
    "strategy_for",
]


@dataclass(frozen=True)
class SearchOptions:
    beam_size: int = 1
    length_penalty: float = 1.0
    n_best: int = 1
    max_length: int = 256
    alignment: bool = False
    # Stop a hypothesis before it repeats an n-gram (n <= MAX_REPEAT_NGRAM) more than this
    # many times in a row (a model fed garbage loops: "the man the man the man ..."); 0: off.
    max_repeats: int = 0


MAX_REPEAT_NGRAM = 4


def _repeat_window(options: SearchOptions) -> int:
    """How many of the last tokens `repeat_closers` needs to see."""
    return MAX_REPEAT_NGRAM * (options.max_repeats + 1)


def repeat_closers(sequences: np.ndarray, max_repeats: int) -> np.ndarray:
    """sequences [rows, L] (tokens so far) -> [rows, MAX_REPEAT_NGRAM] token ids, -1 for none:
    for each n, the token that would make the row end in max_repeats + 1 copies of one n-gram.
    The last n*(max_repeats+1) - 1 tokens must already repeat with period n; the closing token
    is then the one n positions back."""
    rows, length = sequences.shape
    closers = np.full((rows, MAX_REPEAT_NGRAM), -1, dtype=np.int64)
    if max_repeats <= 0:
        return closers
    for n in range(1, MAX_REPEAT_NGRAM + 1):
        span = n * (max_repeats + 1) - 1
        if length < span:
            break
        tail = sequences[:, length - span :]  # [rows, span]
        periodic = np.all(tail[:, n:] == tail[:, :-n], axis=1)
        closers[periodic, n - 1] = tail[periodic, span - n]
    return closers


def pad_sources(sources: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Id lists -> source_ids [B, S] int64 and source_mask [B, S] bool."""
    width = max(len(s) for s in sources)
    ids = np.full((len(sources), width), pad_id, dtype=np.int64)
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    mask = np.arange(width)[None, :] < np.array([len(s) for s in sources])[:, None]
    return ids, mask


class SearchStrategy(ABC):
    """How the next tokens are chosen from each step's top-k, for a whole batch."""

    @abstractmethod
    def search(
        self,
        engine: Engine,
        sources: list[list[int]],
        options: SearchOptions,
        abandoned: Abandoned | None = None,
    ) -> list[list[Hypothesis]]:
        """Source id lists (each ending in </s>, at least one) -> the n-best hypotheses of
        each, best first, in the order of `sources` ([] for a source abandoned midway)."""


def strategy_for(options: SearchOptions) -> SearchStrategy:
    return GreedySearch() if options.beam_size == 1 else BeamSearch()


def search(
    engine: Engine,
    sources: list[list[int]],
    options: SearchOptions,
    abandoned: Abandoned | None = None,
) -> list[list[Hypothesis]]:
    """Source id lists (each ending in </s>) -> options.n_best hypotheses each, in order."""
    if not sources:
        return []
    return strategy_for(options).search(engine, sources, options, abandoned)


class GreedySearch(SearchStrategy):
    """Each row takes its single most likely next token; a row leaves when it ends."""

    def search(
        self,
        engine: Engine,
        sources: list[list[int]],
        options: SearchOptions,
        abandoned: Abandoned | None = None,
    ) -> list[list[Hypothesis]]:
        return [[h] if h else [] for h in _greedy(engine, sources, options, abandoned)]


class BeamSearch(SearchStrategy):
    """K open hypotheses (beams) per sentence; see `_beam` for the stopping rule."""

    def search(
        self,
        engine: Engine,
        sources: list[list[int]],
        options: SearchOptions,
        abandoned: Abandoned | None = None,
    ) -> list[list[Hypothesis]]:
        return _beam(engine, sources, options, abandoned)


def _abandoned_now(abandoned: Abandoned | None, count: int) -> np.ndarray:
    """[sources] bool: True for the sources nobody waits for any more."""
    if abandoned is None:
        return np.zeros(count, dtype=bool)
    return np.asarray(abandoned(), dtype=bool)


def _greedy(
    engine: Engine,
    sources: list[list[int]],
    options: SearchOptions,
    abandoned: Abandoned | None = None,
) -> list[Hypothesis | None]:
    source_ids, source_mask = pad_sources(sources, engine.pad_id)
    state = engine.start(source_ids, source_mask)
    count, source_width = source_ids.shape
    source_lengths = [len(s) for s in sources]
    limits = np.array(
        [length_limit(n, options.max_length, engine.max_positions) for n in source_lengths]
    )
    steps = int(limits.max())
    sentence_of_row = np.arange(count)  # live rows, by the sentence they belong to
    output = np.full((count, steps), engine.pad_id, dtype=np.int64)  # [sentence, step] token
    log_probs = np.zeros(count)
    produced = np.zeros(count, dtype=np.int64)  # tokens produced, </s> included
    alignments = np.zeros((count, steps, source_width), np.float32) if options.alignment else None
    feed = np.full(count, engine.start_id, dtype=np.int64)
    dropped = np.zeros(count, dtype=bool)  # abandoned before they ended

    # With the repetition guard on, each row also gets its second choice, taken when the first
    # would repeat an n-gram once too often (the model then usually leaves the loop).
    top_k = 2 if options.max_repeats else 1
    for step in range(steps):
        result = engine.step(state, feed, top_k=top_k, want_alignment=options.alignment)
        best, best_log_prob = result.top_ids[:, 0], result.top_log_probs[:, 0]  # [rows]
        stuck = np.zeros(len(best), dtype=bool)  # both choices would loop: end before them
        if options.max_repeats:
            recent = output[sentence_of_row, max(0, step - _repeat_window(options)) : step]
            closers = repeat_closers(recent, options.max_repeats)

            def loops(tokens: np.ndarray, closers: np.ndarray = closers) -> np.ndarray:
                return (closers == tokens[:, None]).any(axis=1) & (tokens != engine.eos_id)

            first_loops, second = loops(best), result.top_ids[:, 1]
            use_second = first_loops & ~loops(second)
            best = np.where(use_second, second, best)
            best_log_prob = np.where(use_second, result.top_log_probs[:, 1], best_log_prob)
            stuck = first_loops & ~use_second
        output[sentence_of_row, step] = best
        log_probs[sentence_of_row] += np.where(stuck, 0.0, best_log_prob)
        produced[sentence_of_row] += ~stuck
        if alignments is not None:  # [rows, S'] (S' <= S once padding is cut)
            alignments[sentence_of_row, step, : result.alignment.shape[1]] = result.alignment
        ended = (best == engine.eos_id) | (step + 1 >= limits[sentence_of_row]) | stuck
        dropped_rows = _abandoned_now(abandoned, count)[sentence_of_row]
        dropped[sentence_of_row[dropped_rows]] = True
        ended |= dropped_rows
        if ended.any():
            keep = np.flatnonzero(~ended)
            if keep.size == 0:
                break
            state.select_rows(keep)  # one row per sentence: rows and sources leave together
            state.select_sources(keep)
            sentence_of_row, best = sentence_of_row[keep], best[keep]
        feed = best

    hypotheses: list[Hypothesis | None] = []
    for i in range(count):
        if dropped[i]:
            hypotheses.append(None)
            continue
        tokens = output[i, : produced[i]].tolist()
        if tokens[-1] == engine.eos_id:
            tokens.pop()
        alignment = alignments[i, : produced[i], : source_lengths[i]] if options.alignment else None
        score = float(log_probs[i] / produced[i] ** options.length_penalty)
        hypotheses.append(Hypothesis(tokens, score, float(log_probs[i]), alignment))
    return hypotheses


def _top_candidates(candidates: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The `count` best entries of each row of candidates [m, n], best first."""
    top = np.argpartition(-candidates, count - 1, axis=1)[:, :count]
    top_scores = np.take_along_axis(candidates, top, axis=1)
    order = np.argsort(-top_scores, axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1), np.take_along_axis(top_scores, order, axis=1)


def _beam(
    engine: Engine,
    sources: list[list[int]],
    options: SearchOptions,
    abandoned: Abandoned | None = None,
) -> list[list[Hypothesis]]:
    """Each step ranks the 2K best continuations of a sentence's K open beams. A candidate
    ending in </s> among the first K is finished; the best K others stay open. A sentence is
    done when it has K finished hypotheses and its best open beam, scored at the current
    length, cannot beat the worst of them, or at its length limit; it then leaves the batch.

    The bookkeeping is vectorized over sentences; only finished hypotheses are handled one
    by one (a few per sentence in all).
    """
    width, penalty = options.beam_size, options.length_penalty
    if not 1 <= options.n_best <= width:
        raise ValueError(f"n_best must be between 1 and beam_size={width}, got {options.n_best}")
    source_ids, source_mask = pad_sources(sources, engine.pad_id)
    count, source_width = source_ids.shape
    source_lengths = [len(s) for s in sources]
    limits = np.array(
        [length_limit(n, options.max_length, engine.max_positions) for n in source_lengths]
    )

    # Every live sentence owns `beams` consecutive rows: row j*beams + k is beam k of alive[j].
    # A sentence starts with one beam (nothing to tell beams apart yet); the K best first
    # tokens then make its K beams. Its source keys/values are kept once, shared by its rows.
    state = engine.start(source_ids, source_mask)
    alive, beams = np.arange(count), 1
    scores = np.zeros((count, beams))  # [live, beams]: sum of log-probs so far
    sequences = np.zeros((count, 0), dtype=np.int64)  # [rows, length]
    history = np.zeros((count, 0, source_width), dtype=np.float32)  # alignment so far
    finished: list[list[Hypothesis]] = [[] for _ in range(count)]
    kth_best = np.full(count, -np.inf)  # score of the K-th best finished hypothesis, if K exist
    feed = np.full(count, engine.start_id, dtype=np.int64)
    # Each beam's K+1 best next tokens are enough: ranking a sentence's continuations stops
    # once K are kept open, so no beam gets more than K open ones and one </s> in.
    per_beam = width + 1

    for step in range(int(limits.max())):
        length = step + 1
        result = engine.step(state, feed, top_k=per_beam, want_alignment=options.alignment)
        live = len(alive)
        if options.alignment:
            padded = np.zeros((live * beams, 1, source_width), dtype=np.float32)
            padded[:, 0, : result.alignment.shape[1]] = result.alignment
            history = np.concatenate([history, padded], axis=1)
        # candidates [live, beams * (K+1)]: a beam's score plus the log-prob of one of its tokens
        candidates = scores[:, :, None] + result.top_log_probs.reshape(live, beams, per_beam)
        if options.max_repeats and sequences.shape[1]:
            # A token that would repeat an n-gram once too often is no candidate at all.
            recent = sequences[:, -_repeat_window(options) :]
            closers = repeat_closers(recent, options.max_repeats).reshape(live, beams, 1, -1)
            tokens = result.top_ids.reshape(live, beams, per_beam)
            closes = (closers == tokens[..., None]).any(axis=3) & (tokens != engine.eos_id)
            candidates = np.where(closes, -np.inf, candidates)
        candidates = candidates.reshape(live, -1)
        # At most K open ones and one </s> per beam are looked at: 2K, or all there are.
        ranked = min(2 * width, candidates.shape[1])
        top, top_scores = _top_candidates(candidates, ranked)  # [live, ranked], best first
        first_row = np.arange(live)[:, None] * beams
        top_row = first_row + top // per_beam  # the beam (row) each candidate continues
        top_token = np.take_along_axis(result.top_ids.reshape(live, -1), top, axis=1)
        at_limit = length >= limits[alive]  # [live]
        valid = top_scores > -np.inf
        ends = valid & ((top_token == engine.eos_id) | at_limit[:, None])

        # Candidates that end among the first K are finished hypotheses.
        for j, rank in zip(*np.nonzero(ends[:, :width]), strict=True):
            sentence, row, token = alive[j], top_row[j, rank], top_token[j, rank]
            body = sequences[row].tolist() + ([] if token == engine.eos_id else [int(token)])
            score = float(top_scores[j, rank])
            alignment = history[row, :, : source_lengths[sentence]] if options.alignment else None
            finished[sentence].append(Hypothesis(body, score / length**penalty, score, alignment))
            if len(finished[sentence]) >= width:
                kth_best[sentence] = sorted(h.score for h in finished[sentence])[-width]

        # The K best of the others stay open (fewer only when the sentence is done anyway).
        open_ = valid & ~ends
        pick = np.argsort(~open_, axis=1, kind="stable")[:, :width]  # open first, by rank
        picked = np.take_along_axis(open_, pick, axis=1)  # [live, K]
        next_scores = np.where(picked, np.take_along_axis(top_scores, pick, axis=1), -np.inf)
        next_rows = np.where(picked, np.take_along_axis(top_row, pick, axis=1), first_row)
        next_tokens = np.where(picked, np.take_along_axis(top_token, pick, axis=1), engine.pad_id)

        complete = np.isfinite(kth_best[alive])
        cannot_improve = next_scores.max(axis=1) / length**penalty <= kth_best[alive]
        done = at_limit | (complete & cannot_improve) | ~picked.any(axis=1)
        # Done with nothing finished: every way on would have repeated an n-gram once too
        # often. Its best beam, as it stands, is its translation.
        for j in np.flatnonzero(done & ~np.array([bool(finished[s]) for s in alive])):
            beam = int(np.argmax(scores[j]))
            row, sentence = j * beams + beam, alive[j]
            score, produced = float(scores[j, beam]), max(length - 1, 1)
            alignment = None
            if options.alignment:
                alignment = history[row, : length - 1, : source_lengths[sentence]]
            body = sequences[row].tolist()
            finished[sentence].append(Hypothesis(body, score / produced**penalty, score, alignment))
        gone = _abandoned_now(abandoned, count)[alive]
        for sentence in alive[gone]:  # no hypothesis for them, not even finished ones
            finished[sentence] = []
        done |= gone
        if done.all():
            break

        # Reorder everything that belongs to a beam by the beam it came from; drop done sentences.
        kept_sentences = np.flatnonzero(~done)
        rows = next_rows[kept_sentences].reshape(-1)
        tokens = next_tokens[kept_sentences].reshape(-1)
        sequences = np.concatenate([sequences[rows], tokens[:, None]], axis=1)
        if options.alignment:
            history = history[rows]
        state.select_rows(rows)
        if done.any():
            state.select_sources(kept_sentences)
        scores, alive, feed = next_scores[kept_sentences], alive[kept_sentences], tokens
        beams = width

    return [sorted(f, key=lambda h: -h.score)[: options.n_best] for f in finished]
