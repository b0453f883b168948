"""A running batch: sentences join and leave it between decoder steps (continuous batching).

Decoding a sentence is a loop of decoder steps. A `RunningBatch` runs that loop for many
sentences at once, and lets the caller change who is in it between two steps:

* `join(sentences)` encodes new sentences (one encoder call for all of them) and merges them
  in: their cross-attention keys/values are appended after the others' (source padding masked
  out), and their rows take free slots of the self-attention buffers, whose caches are just
  shorter (kv_cache.py). Each row keeps its own position, so a sentence decodes exactly as it
  would alone, whatever step the others are at.
* `step()` runs one decoder step for every row, has the search strategy choose each row's
  next token (strategies.py), and returns the sentences that ended: they leave the batch
  (and its caches) at once.
* `drop(condition)` takes sentences out that nobody waits for any more.

The rows of a sentence: 1 in greedy search; K (the beam size) in beam search, from the moment
it joins (the graph needs the same K rows for every source). What the maths needs all rows
of one batch to share is the beam size (rows per source). The rest is per sentence: length
limit, length penalty, n-best, repetition guard, alignment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from service.runtime.engine import Engine, StepResult
from service.runtime.kv_cache import KVCache
from service.runtime.search import Finished, Sentence, batch_key
from service.runtime.strategies import (
    MAX_REPEAT_NGRAM,
    SearchStrategy,
    TermWords,
    repeat_closers,
    strategy_for,
)

PADDING = -1  # in `sequences`, before the first token of a row that joined later
# Cache positions reserved for a batch when sentences join (its longest length limit, up to
# this many; beyond it the buffers double when they are full): 64 positions of this model's
# 3 layers are 384 KiB a row (fp32 keys and values), 48 MiB for 32 sentences with beam 4.
RESERVED_POSITIONS = 64
# While a sentence of the batch wants its confidence (SearchOptions.confidence), each row sees
# at least this many best next tokens a step, and keeps them: a produced token's log-prob and
# margin are read from them, and the step's entropy is estimated from them (token_confidence).
CONFIDENCE_CANDIDATES = 8


def pad_sources(sources: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Id lists -> source_ids [B, S] int64 and source_mask [B, S] bool."""
    width = max(len(s) for s in sources)
    ids = np.full((len(sources), width), pad_id, dtype=np.int64)
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    mask = np.arange(width)[None, :] < np.array([len(s) for s in sources])[:, None]
    return ids, mask


def running_batch(engine: Engine, beam_size: int, words: TermWords | None = None) -> RunningBatch:
    """A running batch of `beam_size` rows a sentence; `words`: the target vocabulary's
    pieces, for the word-level rules of a constrained search (strategies.TermWords)."""
    return RunningBatch(engine, strategy_for(beam_size, words))


_NEVER = int(np.iinfo(np.int64).max)  # a clock no batch reaches

# Per live sentence, what its steps need in arrays: one record each, so that sentences
# joining and leaving cost one copy into a new table or one gather for all of them.
_PER_SENTENCE = np.dtype(
    [
        ("limit", np.int64),  # the most tokens it may produce (Sentence.limit)
        ("joined", np.int64),  # the batch's clock when it joined (RunningBatch.steps)
        ("penalty", np.float64),  # length penalty
        ("repeats", np.int64),  # max_repeats (0: no repetition guard)
        ("source_length", np.int64),
        ("alignment", bool),  # wants its alignment
        ("layer", np.int64),  # of that alignment, in 0 .. layers - 1
        ("heads", bool),  # wants the alignment's heads apart
        ("first", np.int64),  # its first token (SearchOptions.first_token), -1: none
        ("confidence", bool),  # wants its token confidence
    ]
)


class _PerSentence:
    """Per live sentence, in row-group order (sentence j owns rows j*K .. j*K+K-1): the
    fields of _PER_SENTENCE, each an array [sentences] (per_sentence.limit, ...)."""

    def __init__(self) -> None:
        self.table = np.zeros(0, dtype=_PER_SENTENCE)
        self._sentences_changed([])

    def __getattr__(self, name: str) -> np.ndarray:
        if name in _PER_SENTENCE.names:
            return self.table[name]
        raise AttributeError(name)

    def _sentences_changed(self, live: list[Sentence]) -> None:
        """What is asked at every step but changes only when sentences join or leave
        (`live`: the batch's sentences now): whether any sentence wants its alignment or the
        repetition guard, and the tokens the sentences reserve (sources, and length limits:
        RunningBatch.reserved_tokens). From the sentences' options, in Python: a batch holds
        a few dozen sentences at most, where an array operation costs more than a loop."""
        if not live:
            self.any_alignment = self.any_repeats = self.any_first = False
            self.any_confidence = False
            self.one_repeats = None
            self.source_tokens = self.limit_tokens = self.first_joined = 0
            self.first_limit = _NEVER
            return
        options = [sentence.options for sentence in live]
        self.any_alignment = any(o.alignment for o in options)
        repeats = {o.max_repeats for o in options}
        self.any_repeats = any(repeats)
        # The max_repeats of every sentence when they share one (None: they differ, or none)
        self.one_repeats = next(iter(repeats)) if len(repeats) == 1 else None
        self.any_first = any(o.first_token is not None for o in options)
        self.any_confidence = any(o.confidence for o in options)
        self.source_tokens = sum(len(sentence.source) for sentence in live)
        limit = self.table["limit"]
        self.limit_tokens = int(limit.sum())
        # The batch's clock at which the first sentence reaches its length limit: until then
        # no step needs to look at the limits (RunningBatch.any_at_limit).
        joined = self.table["joined"]
        self.first_limit = int((joined + limit).min())
        self.first_joined = int(joined.min())  # the oldest sentence's

    def append(
        self, engine: Engine, sentences: list[Sentence], clock: int, live: list[Sentence]
    ) -> None:
        """Records for `sentences`, joining at `clock`; `live`: every sentence after it."""
        layers = engine.layers
        records = [
            (
                s.limit(engine.max_positions),
                clock,
                s.options.length_penalty,
                s.options.max_repeats,
                len(s.source),
                s.options.alignment,
                s.options.alignment_layer % layers,
                s.options.alignment_heads,
                -1 if s.options.first_token is None else s.options.first_token,
                s.options.confidence,
            )
            for s in sentences
        ]
        # (Not np.concatenate: on a structured dtype it promotes the fields in Python, about
        # 15 µs a call, a fifth of a decoder step at batch 1.)
        table = np.empty(len(self.table) + len(records), dtype=_PER_SENTENCE)
        table[: len(self.table)] = self.table
        table[len(self.table) :] = records
        self.table = table
        self._sentences_changed(live)

    def keep(self, kept: np.ndarray, live: list[Sentence]) -> None:
        self.table = self.table[kept]
        self._sentences_changed(live)


class RunningBatch:
    """The rows being decoded, for sentences that share one beam size, and their search."""

    def __init__(self, engine: Engine, strategy: SearchStrategy) -> None:
        self.engine = engine
        self.strategy = strategy
        self.beams = strategy.beams  # K rows per sentence
        self.sentences: list[Sentence] = []  # live, in row-group order
        # Steps this batch has taken: a sentence's steps are the clock less its clock when it
        # joined (per_sentence.joined), so that a step counts for every sentence at once.
        self.clock = 0
        self.per_sentence = _PerSentence()
        self.cache: KVCache | None = None
        # Per row: the tokens chosen so far, right-aligned like the cache (PADDING in front of
        # rows that joined later) [rows, T]; the token each row feeds next [rows]; and, while
        # a sentence of the batch wants it, the alignment so far, head by head, of the layer
        # its sentence asked for [rows, T, H, S].
        self.sequences = np.zeros((0, 0), dtype=np.int64)
        self.feed = np.zeros(0, dtype=np.int64)
        self.history: np.ndarray | None = None
        # While a sentence of the batch wants its confidence: each row's best next tokens at
        # every step, right-aligned like the sequences ([rows, T, CONFIDENCE_CANDIDATES] ids,
        # -1 for none, and their log-probs).
        self.candidates: StepCandidates | None = None

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def rows(self) -> int:
        return len(self.sentences) * self.beams

    @property
    def steps(self) -> np.ndarray:
        """[sentences]: the steps each sentence took part in, = the tokens each of its rows
        produced (its first token's step included)."""
        return self.clock - self.per_sentence.joined

    def any_at_limit(self) -> bool:
        """Whether a sentence has reached its length limit (only then does a step need
        `steps >= limit`)."""
        return self.clock >= self.per_sentence.first_limit

    def reserved_tokens(self) -> int:
        """What the batch may grow to hold: each sentence's source keys/values plus its rows'
        self-attention caches at their length limit (TGI's max-batch-total-tokens idea)."""
        return self.per_sentence.source_tokens + self.beams * self.per_sentence.limit_tokens

    def cost_of(self, sentence: Sentence) -> int:
        """What joining `sentence` adds to reserved_tokens()."""
        return len(sentence.source) + self.beams * sentence.limit(self.engine.max_positions)

    # Joining.

    def encode(self, sentences: list[Sentence], ahead: bool = False) -> KVCache:
        """The joining state of `sentences` (one encoder call; their cross-attention keys and
        values, empty caches, K rows each). Reads only the engine: another thread may call it
        while this batch steps (continuous batching encodes queued sentences ahead: `ahead`,
        on the engine's single-thread encoder)."""
        self._check(sentences)
        source_ids, source_mask = pad_sources([s.source for s in sentences], self.engine.pad_id)
        return self.engine.start(source_ids, source_mask, self.beams, ahead=ahead)

    def encode_each(self, sentences: list[Sentence]) -> list[KVCache]:
        """Encoding ahead: like encode (one encoder call), but a joining state per sentence,
        so that each may join on its own."""
        return self.encode(sentences, ahead=True).per_source()

    def _check(self, sentences: list[Sentence]) -> None:
        for sentence in sentences:
            layer, layers = sentence.options.alignment_layer, self.engine.layers
            if sentence.options.alignment and not -layers <= layer < layers:
                raise ValueError(
                    f"alignment_layer must be between {-layers} and {layers - 1}, got {layer}"
                )
            if batch_key(sentence.options) != self.beams:
                raise ValueError(
                    f"beam size {sentence.options.beam_size} in a batch of {self.beams}"
                )

    def join(self, sentences: list[Sentence], encoded: list[KVCache] | None = None) -> None:
        """Merge new sentences into the batch; they take part from the next step on. Every
        source must end in </s>. `encoded`: their joining states from `encode`, in the same
        order (each of one or more sentences), or None to encode them here."""
        if not sentences:
            return
        if encoded is None:
            encoded = [self.encode(sentences)]  # checks them
        else:
            self._check(sentences)
        parts = encoded
        if sum(part.sources for part in parts) != len(sentences):
            raise ValueError(f"encoded sources do not match the {len(sentences)} sentences")
        new_rows = len(sentences) * self.beams
        # Room for the caches to reach the longest length limit (within RESERVED_POSITIONS),
        # made before the join copies anything: the buffers are then grown at most once here,
        # and seldom midway.
        limits = [s.limit(self.engine.max_positions) for s in sentences]
        longest = max(int(self.per_sentence.limit.max(initial=0)), *limits)
        room = min(longest, RESERVED_POSITIONS)
        if self.cache is None or not self.sentences:
            self.cache = parts[0]
            self.engine.reuse_spare(self.cache)  # (a lone sentence after another: no allocating)
            self.cache.reserve(new_rows, room)
            if len(parts) > 1:
                self.cache.extend(*parts[1:])
            self.sequences = np.zeros((new_rows, 0), dtype=np.int64)
            self.feed = np.zeros(0, dtype=np.int64)
            self.history = None
            self.candidates = None
        else:
            self.cache.reserve(self.rows + new_rows, room)
            self.cache.extend(*parts)  # new rows in free slots; sources after ours
            padding = np.full((new_rows, self.sequences.shape[1]), PADDING, dtype=np.int64)
            self.sequences = np.concatenate([self.sequences, padding])
        self.feed = np.concatenate([self.feed, np.full(new_rows, self.engine.start_id)])
        self.sentences.extend(sentences)
        self.per_sentence.append(self.engine, sentences, self.clock, self.sentences)
        if self.history is not None or any(s.options.alignment for s in sentences):
            self._grow_history(new_rows)
        if self.candidates is not None:
            self.candidates = self.candidates.grown(new_rows)
        elif any(s.options.confidence for s in sentences):
            self.candidates = StepCandidates.empty(self.rows, self.sequences.shape[1])
        self.strategy.joined(sentences)

    def _grow_history(self, new_rows: int) -> None:
        """Alignment rows for the new rows (zeros: before they joined), wide enough for every
        source; started for every row when the first sentence that wants it joins."""
        # Right-aligned steps, like the sequences, but cut on its own (see _keep): its own width.
        steps = self.sequences.shape[1] if self.history is None else self.history.shape[1]
        shape = (self.rows, steps, self.engine.heads)
        width = self.cache.source_mask.shape[1]
        if self.history is None:
            self.history = np.zeros((*shape, width), dtype=np.float32)
            return
        old = self.history
        grown = np.zeros((*shape, width), dtype=np.float32)
        kept = min(width, old.shape[3])  # the sources may have got narrower: padding went
        grown[: len(old), :, :, :kept] = old[..., :kept]
        self.history = grown

    # Stepping.

    def step(self) -> list[Finished]:
        """One decoder step for every row; returns the sentences that ended (they have left)."""
        if not self.sentences:
            return []
        result = self.engine.step(
            self.cache,
            self.feed,
            top_k=self.top_k(),
            want_alignment=self.strategy.needs_focus(),
            want_attention=self.wants_alignment(),
            forced=self.strategy.forced(self),
        )
        return self.stepped(result)

    def top_k(self) -> int:
        """How many best next tokens each row sees this step: the strategy's choice, and at
        least CONFIDENCE_CANDIDATES while a sentence wants its confidence."""
        k = self.strategy.top_k(self)
        return max(k, CONFIDENCE_CANDIDATES) if self.per_sentence.any_confidence else k

    def wants_alignment(self) -> bool:
        return self.per_sentence.any_alignment

    def stepped(self, result: StepResult) -> list[Finished]:
        """Take in a step's result for this batch's rows (the state has moved on already)."""
        want_alignment = self.wants_alignment()
        if want_alignment:
            # Each row keeps the heads of its own sentence's layer: [rows, 1, H, S].
            layer_of_row = np.repeat(self.per_sentence.layer, self.beams)
            chosen = result.attention[np.arange(self.rows), layer_of_row]  # [rows, H, S]
            step_weights = np.zeros((self.rows, 1, *self.history.shape[2:]), dtype=np.float32)
            # (stepped together with another batch, S may be that batch's: padding here)
            step_weights[:, 0] = chosen[:, :, : step_weights.shape[3]]
            self.history = np.concatenate([self.history, step_weights], axis=1)
        self.clock += 1
        if self.candidates is not None:
            # The model's own view, before a forced first token replaces it.
            self.candidates = self.candidates.appended(result.top_ids, result.top_log_probs)
            result = _first_k(result, self.strategy.top_k(self))  # it decodes as without
        if self.per_sentence.any_first:
            result = self._forced_first(result)
        return self.strategy.choose(self, result)

    def _forced_first(self, result: StepResult) -> StepResult:
        """At a sentence's first step, its rows see its first token (SearchOptions.first_token)
        as their only candidate, with log-prob 0, as Hugging Face's forced_bos_token_id writes
        a multilingual model's target language: the strategy then chooses as usual (a glossary
        term's tokens cannot start there), and the token counts as produced (length limit,
        length penalty)."""
        per = self.per_sentence
        starting = np.flatnonzero((self.steps == 1) & (per.first >= 0))
        if not len(starting):
            return result
        top_ids, top_log_probs = result.top_ids.copy(), result.top_log_probs.copy()
        forced = None if result.forced_log_probs is None else result.forced_log_probs.copy()
        for j in starting:
            rows = slice(j * self.beams, (j + 1) * self.beams)
            top_ids[rows, 0] = per.first[j]
            top_log_probs[rows, 0] = 0.0
            top_log_probs[rows, 1:] = -np.inf
            if forced is not None:
                forced[rows] = -np.inf
        return replace(
            result, top_ids=top_ids, top_log_probs=top_log_probs, forced_log_probs=forced
        )

    def closers(self) -> np.ndarray | None:
        """[rows, MAX_REPEAT_NGRAM]: the tokens that would make each row repeat an n-gram
        once too often (-1: none), under its own sentence's max_repeats; None when no row can
        this step (strategies.repeat_closers)."""
        one = self.per_sentence.one_repeats
        if one is not None:  # one setting (a server's): every row at once
            return repeat_closers(self.sequences[:, -MAX_REPEAT_NGRAM * (one + 1) :], one)
        closers = np.full((self.rows, MAX_REPEAT_NGRAM), -1, dtype=np.int64)
        repeats_of_row = np.repeat(self.per_sentence.repeats, self.beams)
        for repeats in np.unique(repeats_of_row[repeats_of_row > 0]):
            rows = np.flatnonzero(repeats_of_row == repeats)
            window = MAX_REPEAT_NGRAM * (int(repeats) + 1)
            found = repeat_closers(self.sequences[rows, -window:], int(repeats))
            if found is not None:
                closers[rows] = found
        return closers

    # Leaving.

    def drop(self, condition: Callable[[Sentence], bool]) -> list[Finished]:
        """Take out the sentences for which condition(sentence) holds (nobody waits for them
        any more); they come back with no hypothesis."""
        flags = [condition(s) for s in self.sentences]
        if not any(flags):  # most calls: nobody is gone
            return []
        gone = np.array(flags, dtype=bool)
        steps = self.steps
        dropped = [Finished(self.sentences[j], [], int(steps[j])) for j in np.flatnonzero(gone)]
        kept = np.flatnonzero(~gone)
        rows = (kept[:, None] * self.beams + np.arange(self.beams)[None, :]).reshape(-1)
        self.keep(kept, rows, self.feed[rows])
        return dropped

    def keep(self, kept: np.ndarray | None, rows: np.ndarray, feed: np.ndarray) -> None:
        """Keep sentences `kept` (ascending positions; None: every one) with rows `rows` (row
        j continues old row rows[j], so beams may be reordered) that feed `feed` next. The
        sentences after the last kept place fill the places of those that left, so that the
        caches of the others do not move (KVCache copies only what moves)."""
        if kept is not None and not len(kept):  # nobody stays (a lone sentence ended)
            self.strategy.kept(kept)
            self.sentences = []
            self.per_sentence.keep(kept, self.sentences)
            self.engine.keep_spare(self.cache)
            self.cache, self.history, self.candidates = None, None, None
            self.sequences = np.zeros((0, 0), dtype=np.int64)
            self.feed = np.zeros(0, dtype=np.int64)
            return
        everyone = kept is None or len(kept) == len(self.sentences)  # most steps: none left
        if not everyone:
            order = filling_holes(kept)
            kept = kept[order]
            rows = rows.reshape(len(order), self.beams)[order].reshape(-1)
            feed = feed.reshape(len(order), self.beams)[order].reshape(-1)
            self.strategy.kept(kept)
            self.sentences = [self.sentences[i] for i in kept]
            self.per_sentence.keep(kept, self.sentences)
        self.cache.select_rows(rows, within_sources=everyone)
        if not everyone:  # some left (else no source moved)
            self.cache.select_sources(kept)
        # A row's tokens (and alignment) are at most its sentence's last `steps` columns
        # (right-aligned): the columns in front of the longest are nobody's any more.
        needed = self.clock - self.per_sentence.first_joined
        cut = max(0, self.sequences.shape[1] - needed)
        self.sequences = self.sequences[rows, cut:]
        self.feed = feed
        if self.history is not None:
            if self.per_sentence.any_alignment:
                width = self.cache.source_mask.shape[1]
                cut = max(0, self.history.shape[1] - needed)
                self.history = np.ascontiguousarray(self.history[rows, cut:, :, :width])
            else:
                self.history = None
        if self.candidates is not None:
            if self.per_sentence.any_confidence:
                self.candidates = self.candidates.kept(rows, needed)
            else:
                self.candidates = None

    def own(self, array: np.ndarray, row: int, sentence: int, count: int) -> np.ndarray:
        """The first `count` of a row's own columns (from the step its sentence joined) in a
        right-aligned per-row array whose last column is this step's."""
        start = array.shape[1] - (self.clock - int(self.per_sentence.joined[sentence]))
        return array[row, start : start + count]

    def details_of(self, row: int, sentence: int, produced: list[int]) -> dict:
        """What a row's sentence asked to know besides its tokens, over the row's `produced`
        tokens (</s> included when it ended): the Hypothesis fields alignment [count, source
        length] (head mean) and head_alignment [count, H, source length] (when asked for),
        and token_confidence [count, 3] (when asked for)."""
        found = {}
        count = len(produced)
        if self.per_sentence.alignment[sentence]:
            source_length = int(self.per_sentence.source_length[sentence])
            heads = self.own(self.history, row, sentence, count)[:, :, :source_length]
            found["alignment"] = heads.mean(axis=1)
            if self.per_sentence.heads[sentence]:
                found["head_alignment"] = heads.copy()
        if self.per_sentence.confidence[sentence]:
            ids = self.own(self.candidates.ids, row, sentence, count)
            log_probs = self.own(self.candidates.log_probs, row, sentence, count)
            found["token_confidence"] = token_confidence(ids, log_probs, np.array(produced))
        return found


def step_together(batches: list[RunningBatch]) -> list[list[Finished]]:
    """One decoder step for the rows of several running batches (of different beam sizes) in
    one engine call; returns each batch's sentences that ended, as its step() would.

    Why: at a few rows a step costs about what reading the decoder's weights costs (fp32, one
    thread: 2.6 ms at 1 row, 4.3 ms at 8), so a greedy and a beam batch stepped apart pay for
    the weights twice. Together their rows are one batch to the graph: each row gets its own
    copy of its source's cross-attention keys/values (rows per source 1; a beam sentence's K
    rows repeat its source), and the self-attention caches are copied into one set of buffers
    (KVCache.rows_together). That copy is what it costs; it is made again only after someone
    joined or left, and it is small next to the weights at a few rows, not at many, so the
    caller decides when to use it. Each batch then keeps its rows of the new buffers (views,
    no copy) and chooses its tokens as it would alone.
    """
    live = [batch for batch in batches if batch.sentences]
    if len(live) < 2:
        return [batch.step() for batch in batches]
    engine = live[0].engine
    caches = [batch.cache for batch in live]
    together = KVCache.went_on_together(caches) or KVCache.rows_together(caches)
    top_k = max(batch.top_k() for batch in live)
    want_attention = any(batch.wants_alignment() for batch in live)
    want_alignment = any(batch.strategy.needs_focus() for batch in live)
    feed = np.concatenate([batch.feed for batch in live])
    forced = [batch.strategy.forced(batch) for batch in live]  # (once a step: it keeps them)
    result = engine.step(
        together,
        feed,
        top_k=top_k,
        want_alignment=want_alignment,
        want_attention=want_attention,
        forced=_stacked_forced(forced, [batch.rows for batch in live]),
    )
    ended: dict[int, list[Finished]] = {}
    start = 0
    for batch, words in zip(live, forced, strict=True):
        stop = start + batch.rows
        batch.cache.take_rows_of(together, start, stop)
        width = 0 if words is None else words.shape[1]
        rows = _rows_of(result, start, stop, batch.top_k(), width)
        ended[id(batch)] = batch.stepped(rows)
        start = stop
    return [ended.get(id(batch), []) for batch in batches]


def _stacked_forced(forced: list[np.ndarray | None], rows: list[int]) -> np.ndarray | None:
    """The batches' forced words one batch after the other, right-padded with word 0 to the
    widest (None when no batch has any)."""
    if all(words is None for words in forced):
        return None
    width = max(words.shape[1] for words in forced if words is not None)
    stacked = np.zeros((sum(rows), width), dtype=np.int64)
    start = 0
    for words, count in zip(forced, rows, strict=True):
        if words is not None:
            stacked[start : start + count, : words.shape[1]] = words
        start += count
    return stacked


def _rows_of(result: StepResult, start: int, stop: int, top_k: int, forced: int) -> StepResult:
    """A batch's rows of a step taken together: its own top k and forced words."""

    def rows(array: np.ndarray | None) -> np.ndarray | None:
        return None if array is None else array[start:stop]

    return StepResult(
        top_log_probs=result.top_log_probs[start:stop, :top_k],
        top_ids=result.top_ids[start:stop, :top_k],
        alignment=rows(result.alignment),
        attention=rows(result.attention),
        forced_log_probs=None if not forced else result.forced_log_probs[start:stop, :forced],
    )


@dataclass(frozen=True)
class StepCandidates:
    """Each row's best next tokens at every step so far, right-aligned like the sequences:
    ids [rows, T, C] (-1: none) and their log-probs [rows, T, C] (-inf: none)."""

    ids: np.ndarray
    log_probs: np.ndarray

    @classmethod
    def empty(cls, rows: int, steps: int) -> StepCandidates:
        shape = (rows, steps, CONFIDENCE_CANDIDATES)
        return cls(np.full(shape, -1, dtype=np.int64), np.full(shape, -np.inf, dtype=np.float32))

    def grown(self, new_rows: int) -> StepCandidates:
        """With rows for sentences that just joined (no steps yet)."""
        more = StepCandidates.empty(new_rows, self.ids.shape[1])
        return StepCandidates(
            np.concatenate([self.ids, more.ids]), np.concatenate([self.log_probs, more.log_probs])
        )

    def appended(self, top_ids: np.ndarray, top_log_probs: np.ndarray) -> StepCandidates:
        """With this step's top-k ([rows, k], best first) as the last column."""
        step = StepCandidates.empty(len(top_ids), 1)
        width = min(top_ids.shape[1], CONFIDENCE_CANDIDATES)
        step.ids[:, 0, :width] = top_ids[:, :width]
        step.log_probs[:, 0, :width] = top_log_probs[:, :width]
        return StepCandidates(
            np.concatenate([self.ids, step.ids], axis=1),
            np.concatenate([self.log_probs, step.log_probs], axis=1),
        )

    def kept(self, rows: np.ndarray, steps: int) -> StepCandidates:
        """Rows `rows` (row j continues old row rows[j]), their last `steps` steps."""
        cut = max(0, self.ids.shape[1] - steps)
        return StepCandidates(self.ids[rows, cut:], self.log_probs[rows, cut:])


def token_confidence(ids: np.ndarray, log_probs: np.ndarray, produced: np.ndarray) -> np.ndarray:
    """How sure the decoder was of each produced token: [count, 3] (TOKEN_CONFIDENCE), from
    each step's best candidates ids [count, C] and log-probs [count, C] (best first) and the
    tokens it produced [count].

    * log_prob: the token's log-prob (NaN when it was not among the candidates: forced);
    * entropy: of the step's distribution, estimated from the candidates with everything
      else as one more outcome (a lower bound of the full entropy; close to it when the
      candidates hold most of the mass, which is when it matters);
    * margin: the token's log-prob minus the best other candidate's (negative when a beam
      took a token that was not the step's best; NaN without another candidate)."""
    probs = np.exp(log_probs.astype(np.float64))  # -inf -> 0
    rest = np.clip(1.0 - probs.sum(axis=1), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(probs > 0, -probs * np.log(probs), 0.0).sum(axis=1)
        entropy = terms + np.where(rest > 0, -rest * np.log(rest), 0.0)
    chosen = ids == produced[:, None]  # [count, C]
    found = chosen.any(axis=1)
    chosen_log_prob = np.where(found, np.where(chosen, log_probs, -np.inf).max(axis=1), np.nan)
    others = np.where(chosen | (ids < 0), -np.inf, log_probs).max(axis=1)
    with np.errstate(invalid="ignore"):
        margin = np.where(found & np.isfinite(others), chosen_log_prob - others, np.nan)
    return np.stack([chosen_log_prob, entropy, margin], axis=1).astype(np.float32)


def _first_k(result: StepResult, top_k: int) -> StepResult:
    """A step's result with each row's top_k best tokens only."""
    if result.top_ids.shape[1] <= top_k:
        return result
    return replace(
        result, top_ids=result.top_ids[:, :top_k], top_log_probs=result.top_log_probs[:, :top_k]
    )


def filling_holes(kept: np.ndarray) -> np.ndarray:
    """For kept (ascending positions of what stays, out of more): an order of its entries in
    which those already among the first len(kept) places keep their place, and the others
    fill the places that were left, so that kept[order][i] == i wherever possible.
    Example: kept [0, 2, 3, 5] -> order [0, 3, 1, 2] (5 takes the place of 1)."""
    count = len(kept)
    stays = kept < count
    order = np.empty(count, dtype=np.int64)
    order[kept[stays]] = np.flatnonzero(stays)
    hole = np.ones(count, dtype=bool)
    hole[kept[stays]] = False
    order[hole] = np.flatnonzero(~stays)
    return order
