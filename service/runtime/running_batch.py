"""A running batch: sentences join and leave it between decoder steps (continuous batching).

Decoding a sentence is a loop of decoder steps. A `RunningBatch` runs that loop for many
sentences at once, and lets the caller change who is in it between two steps:

* `join(sentences)` encodes new sentences (one encoder call for all of them) and merges them
  in: their cross-attention keys/values are appended after the others' (source padding masked
  out), and their rows get an empty self-attention cache: with caches written in place
  (InPlaceState, the default) a free slot whose cache is just shorter; with the
  concatenating step (DecoderState) one left-padded to the batch's current cache length and
  masked out by `past_mask`. Each row keeps its own position, so a sentence decodes exactly
  as it would alone, whatever step the others are at.
* `step()` runs one decoder step for every row, chooses each row's next token, and returns the
  sentences that ended: they leave the batch (and its caches) at once.
* `drop(condition)` takes sentences out that nobody waits for any more.

The rows of a sentence: 1 in greedy search; K (the beam size) in beam search, from the moment
it joins (the graph needs the same K rows for every source). A new sentence's beams 1..K-1
start with a score of -inf, so its first step picks the K best first tokens of beam 0 only,
exactly as a search that starts with one beam. `GreedyBatch` and `BeamBatch` differ only in
how they choose (`_choose`); joining, leaving and the caches are shared.

What the maths needs all rows of one batch to share is the beam size (rows per source). The
rest is per sentence: length limit, length penalty, n-best, repetition guard, alignment.

Same conventions as the torch reference (export/decoding.py), written once in nmt_contract:
* a sentence may produce at most `length_limit(source_length)` tokens, </s> included;
* a hypothesis' raw score (log_prob) is the sum of its tokens' log-probs;
* hypotheses are ranked by log_prob / length ** length_penalty.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from nmt_contract import Hypothesis, length_limit
from service.runtime.engine import DecoderState, Engine, StepResult

PADDING = -1  # in `sequences`, before the first token of a row that joined later
# Cache positions reserved for a batch when sentences join (its longest length limit, up to
# this many; beyond it the buffers double when they are full): 64 positions of this model's
# 3 layers are 384 KiB a row (fp32 keys and values), 48 MiB for 32 sentences with beam 4.
RESERVED_POSITIONS = 64


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
    # With alignment: which decoder layer's cross-attention (0 = first, -1 = last), and
    # whether to keep its heads apart (Hypothesis.head_alignment) besides their mean.
    alignment_layer: int = -1
    alignment_heads: bool = False


MAX_REPEAT_NGRAM = 4


def sentence_limit(sentence: Sentence, engine: Engine) -> int:
    """The most tokens `sentence` may produce, </s> included (length_limit)."""
    return length_limit(len(sentence.source), sentence.options.max_length, engine.max_positions)


def repeat_closers(sequences: np.ndarray, max_repeats: int) -> np.ndarray:
    """sequences [rows, L] (tokens so far) -> [rows, MAX_REPEAT_NGRAM] token ids, -1 for none:
    for each n, the token that would make the row end in max_repeats + 1 copies of one n-gram.
    The last n*(max_repeats+1) - 1 tokens must already repeat with period n; the closing token
    is then the one n positions back. (PADDING never matches a real token.)"""
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


@dataclass(eq=False)
class Sentence:
    """One source sentence to decode (ids ending in </s>), how, and the caller's handle."""

    source: list[int]
    options: SearchOptions
    ticket: Hashable = None


@dataclass
class Finished:
    """A sentence that left the batch: its n-best hypotheses, best first ([] if dropped)."""

    sentence: Sentence
    hypotheses: list[Hypothesis]
    steps: int  # decoder steps it took part in


def batch_key(options: SearchOptions) -> int:
    """Sentences that may share a running batch: the same rows per source (beam size)."""
    return options.beam_size


def running_batch(engine: Engine, beam_size: int) -> RunningBatch:
    return GreedyBatch(engine) if beam_size == 1 else BeamBatch(engine, beam_size)


@dataclass
class _PerSentence:
    """Per live sentence, in row-group order (sentence j owns rows j*K .. j*K+K-1)."""

    limit: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    penalty: np.ndarray = field(default_factory=lambda: np.zeros(0))
    repeats: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    source_length: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    alignment: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    layer: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    heads: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def __post_init__(self) -> None:
        self._sentences_changed()

    def _sentences_changed(self) -> None:
        """What is asked at every step but changes only when sentences join or leave:
        whether any sentence wants its alignment or the repetition guard, and the tokens the
        sentences reserve (sources, and length limits: RunningBatch.reserved_tokens)."""
        self.any_alignment = bool(self.alignment.any())
        self.any_repeats = bool(self.repeats.any())
        self.source_tokens = int(self.source_length.sum())
        self.limit_tokens = int(self.limit.sum())

    def append(self, engine: Engine, sentences: list[Sentence]) -> None:
        def grow(old: np.ndarray, new: list) -> np.ndarray:
            return np.concatenate([old, np.array(new, dtype=old.dtype)])

        lengths = [len(s.source) for s in sentences]
        self.limit = grow(self.limit, [sentence_limit(s, engine) for s in sentences])
        self.steps = grow(self.steps, [0] * len(sentences))
        self.penalty = grow(self.penalty, [s.options.length_penalty for s in sentences])
        self.repeats = grow(self.repeats, [s.options.max_repeats for s in sentences])
        self.source_length = grow(self.source_length, lengths)
        self.alignment = grow(self.alignment, [s.options.alignment for s in sentences])
        layers = engine.layers
        self.layer = grow(self.layer, [s.options.alignment_layer % layers for s in sentences])
        self.heads = grow(self.heads, [s.options.alignment_heads for s in sentences])
        self._sentences_changed()

    def keep(self, kept: np.ndarray) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name)[kept])
        self._sentences_changed()


class RunningBatch(ABC):
    """The rows being decoded, for sentences that share one beam size."""

    def __init__(self, engine: Engine, rows_per_sentence: int) -> None:
        self.engine = engine
        self.beams = rows_per_sentence  # K
        self.sentences: list[Sentence] = []  # live, in row-group order
        self.per_sentence = _PerSentence()
        self.state: DecoderState | None = None
        # Per row: the tokens chosen so far, right-aligned like the cache (PADDING in front of
        # rows that joined later) [rows, T]; the token each row feeds next [rows]; and, while
        # a sentence of the batch wants it, the alignment so far, head by head, of the layer
        # its sentence asked for [rows, T, H, S].
        self.sequences = np.zeros((0, 0), dtype=np.int64)
        self.feed = np.zeros(0, dtype=np.int64)
        self.history: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def rows(self) -> int:
        return len(self.sentences) * self.beams

    def reserved_tokens(self) -> int:
        """What the batch may grow to hold: each sentence's source keys/values plus its rows'
        self-attention caches at their length limit (TGI's max-batch-total-tokens idea)."""
        return self.per_sentence.source_tokens + self.beams * self.per_sentence.limit_tokens

    def cost_of(self, sentence: Sentence) -> int:
        """What joining `sentence` adds to reserved_tokens()."""
        return len(sentence.source) + self.beams * sentence_limit(sentence, self.engine)

    # Joining.

    def encode(self, sentences: list[Sentence], ahead: bool = False) -> DecoderState:
        """The joining state of `sentences` (one encoder call; their cross-attention keys and
        values, empty caches, K rows each). Reads only the engine: another thread may call it
        while this batch steps (continuous batching encodes queued sentences ahead: `ahead`,
        on the engine's single-thread encoder)."""
        self._check(sentences)
        source_ids, source_mask = pad_sources([s.source for s in sentences], self.engine.pad_id)
        return self.engine.start(source_ids, source_mask, self.beams, ahead=ahead)

    def encode_each(self, sentences: list[Sentence]) -> list[DecoderState]:
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

    def join(self, sentences: list[Sentence], encoded: list[DecoderState] | None = None) -> None:
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
        # made before the join copies anything: with caches written in place, the buffers
        # are then grown at most once here, and seldom midway.
        limits = [sentence_limit(s, self.engine) for s in sentences]
        longest = max(int(self.per_sentence.limit.max(initial=0)), *limits)
        room = min(longest, RESERVED_POSITIONS)
        if self.state is None or not self.sentences:
            self.state = parts[0]
            self.state.reserve(new_rows, room)
            if len(parts) > 1:
                self.state.extend(*parts[1:])
            self.sequences = np.zeros((new_rows, 0), dtype=np.int64)
            self.feed = np.zeros(0, dtype=np.int64)
            self.history = None
        else:
            self.state.reserve(self.rows + new_rows, room)
            self.state.extend(*parts)  # (concatenating: every cache copied once)
            padding = np.full((new_rows, self.sequences.shape[1]), PADDING, dtype=np.int64)
            self.sequences = np.concatenate([self.sequences, padding])
        self.feed = np.concatenate([self.feed, np.full(new_rows, self.engine.start_id)])
        self.sentences.extend(sentences)
        self.per_sentence.append(self.engine, sentences)
        if self.history is not None or any(s.options.alignment for s in sentences):
            self._grow_history(new_rows)
        self._joined(len(sentences))

    def _grow_history(self, new_rows: int) -> None:
        """Alignment rows for the new rows (zeros: before they joined), wide enough for every
        source; started for every row when the first sentence that wants it joins."""
        # Right-aligned steps, like the sequences, but cut on its own (see _keep): its own width.
        steps = self.sequences.shape[1] if self.history is None else self.history.shape[1]
        shape = (self.rows, steps, self.engine.heads)
        width = self.state.source_mask.shape[1]
        if self.history is None:
            self.history = np.zeros((*shape, width), dtype=np.float32)
            return
        old = self.history
        grown = np.zeros((*shape, width), dtype=np.float32)
        kept = min(width, old.shape[3])  # the sources may have got narrower: padding went
        grown[: len(old), :, :, :kept] = old[..., :kept]
        self.history = grown

    @abstractmethod
    def _joined(self, count: int) -> None:
        """Set up the strategy's own state for the `count` sentences just appended."""

    # Stepping.

    def step(self) -> list[Finished]:
        """One decoder step for every row; returns the sentences that ended (they have left)."""
        if not self.sentences:
            return []
        result = self.engine.step(
            self.state, self.feed, top_k=self._top_k(), want_attention=self._wants_alignment()
        )
        return self._stepped(result)

    def _wants_alignment(self) -> bool:
        return self.per_sentence.any_alignment

    def _stepped(self, result: StepResult) -> list[Finished]:
        """Take in a step's result for this batch's rows (the state has moved on already)."""
        want_alignment = self._wants_alignment()
        if want_alignment:
            # Each row keeps the heads of its own sentence's layer: [rows, 1, H, S].
            layer_of_row = np.repeat(self.per_sentence.layer, self.beams)
            chosen = result.attention[np.arange(self.rows), layer_of_row]  # [rows, H, S]
            step_weights = np.zeros((self.rows, 1, *self.history.shape[2:]), dtype=np.float32)
            # (stepped together with another batch, S may be that batch's: padding here)
            step_weights[:, 0] = chosen[:, :, : step_weights.shape[3]]
            self.history = np.concatenate([self.history, step_weights], axis=1)
        self.per_sentence.steps += 1
        return self._choose(result)

    @abstractmethod
    def _top_k(self) -> int:
        """How many best next tokens a row needs to see this step."""

    @abstractmethod
    def _choose(self, result: StepResult) -> list[Finished]:
        """Pick every row's next token from the step's top-k; finish and remove sentences."""

    def _closers(self) -> np.ndarray:
        """[rows, MAX_REPEAT_NGRAM]: the tokens that would make each row repeat an n-gram
        once too often (-1: none), under its own sentence's max_repeats."""
        first = int(self.per_sentence.repeats[0])
        if (self.per_sentence.repeats == first).all():  # one setting (a server's): every row
            window = MAX_REPEAT_NGRAM * (first + 1)
            return repeat_closers(self.sequences[:, -window:], first)
        closers = np.full((self.rows, MAX_REPEAT_NGRAM), -1, dtype=np.int64)
        repeats_of_row = np.repeat(self.per_sentence.repeats, self.beams)
        for repeats in np.unique(repeats_of_row[repeats_of_row > 0]):
            rows = np.flatnonzero(repeats_of_row == repeats)
            window = MAX_REPEAT_NGRAM * (int(repeats) + 1)
            closers[rows] = repeat_closers(self.sequences[rows, -window:], int(repeats))
        return closers

    # Leaving.

    def drop(self, condition: Callable[[Sentence], bool]) -> list[Finished]:
        """Take out the sentences for which condition(sentence) holds (nobody waits for them
        any more); they come back with no hypothesis."""
        flags = [condition(s) for s in self.sentences]
        if not any(flags):  # most calls (the scheduler asks at every step)
            return []
        gone = np.array(flags, dtype=bool)
        dropped = [
            Finished(self.sentences[j], [], int(self.per_sentence.steps[j]))
            for j in np.flatnonzero(gone)
        ]
        kept = np.flatnonzero(~gone)
        rows = (kept[:, None] * self.beams + np.arange(self.beams)[None, :]).reshape(-1)
        self._keep(kept, rows, self.feed[rows])
        return dropped

    def _keep(self, kept: np.ndarray, rows: np.ndarray, feed: np.ndarray) -> None:
        """Keep sentences `kept` (ascending positions) with rows `rows` (row j continues old
        row rows[j], so beams may be reordered) that feed `feed` next. The sentences after
        the last kept place fill the places of those that left, so that the caches of the
        others do not move (DecoderState copies only what moves)."""
        everyone = len(kept) == len(self.sentences)  # most steps: nobody left, none moves
        if not everyone:
            order = _filling_holes(kept)
            kept = kept[order]
            rows = rows.reshape(len(order), self.beams)[order].reshape(-1)
            feed = feed.reshape(len(order), self.beams)[order].reshape(-1)
            self._kept(kept)
            self.sentences = [self.sentences[i] for i in kept]
            self.per_sentence.keep(kept)
        if not self.sentences:
            self.state, self.history = None, None
            self.sequences = np.zeros((0, 0), dtype=np.int64)
            self.feed = np.zeros(0, dtype=np.int64)
            return
        self.state.select_rows(rows)
        if len(kept) < self.state.sources:  # fewer: some left (else nothing moved)
            self.state.select_sources(kept)
        # A row's tokens (and alignment) are at most its sentence's last `steps` columns
        # (right-aligned): the columns in front of the longest are nobody's any more.
        needed = int(self.per_sentence.steps.max())
        cut = max(0, self.sequences.shape[1] - needed)
        self.sequences = self.sequences[rows, cut:]
        self.feed = feed
        if self.history is not None:
            if self.per_sentence.alignment.any():
                width = self.state.source_mask.shape[1]
                cut = max(0, self.history.shape[1] - needed)
                self.history = np.ascontiguousarray(self.history[rows, cut:, :, :width])
            else:
                self.history = None

    @abstractmethod
    def _kept(self, kept: np.ndarray) -> None:
        """Keep the strategy's own per-sentence state for sentences `kept` (positions)."""

    def _own(self, array: np.ndarray, row: int, sentence: int, count: int) -> np.ndarray:
        """The first `count` of a row's own columns (from the step its sentence joined) in a
        right-aligned per-row array whose last column is this step's."""
        start = array.shape[1] - int(self.per_sentence.steps[sentence])
        return array[row, start : start + count]

    def _alignment_of(self, row: int, sentence: int, count: int) -> dict:
        """A row's alignment over its first `count` steps, if its sentence wants it: the
        Hypothesis fields alignment [count, source length] (head mean) and head_alignment
        [count, H, source length] (when asked for)."""
        if not self.per_sentence.alignment[sentence]:
            return {}
        source_length = int(self.per_sentence.source_length[sentence])
        heads = self._own(self.history, row, sentence, count)[:, :, :source_length]
        found = {"alignment": heads.mean(axis=1)}
        if self.per_sentence.heads[sentence]:
            found["head_alignment"] = heads.copy()
        return found


class GreedyBatch(RunningBatch):
    """Each row takes its single most likely next token; a sentence leaves when it ends."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, 1)
        self.log_probs = np.zeros(0)  # [sentences] sum of the chosen tokens' log-probs

    def _joined(self, count: int) -> None:
        self.log_probs = np.concatenate([self.log_probs, np.zeros(count)])

    def _kept(self, kept: np.ndarray) -> None:
        self.log_probs = self.log_probs[kept]

    def _top_k(self) -> int:
        # With the repetition guard on, each row also gets its second choice, taken when the
        # first would repeat an n-gram once too often (the model then usually leaves the loop).
        return 2 if self.per_sentence.any_repeats else 1

    def _choose(self, result: StepResult) -> list[Finished]:
        eos = self.engine.eos_id
        best, best_log_prob = result.top_ids[:, 0], result.top_log_probs[:, 0]  # [rows]
        # Rows whose both choices would loop end before them (only with the guard: else None,
        # which spares a few array operations a step).
        stuck = None
        if self.per_sentence.any_repeats:
            closers = self._closers()

            def loops(tokens: np.ndarray) -> np.ndarray:
                return (closers == tokens[:, None]).any(axis=1) & (tokens != eos)

            first_loops, second = loops(best), result.top_ids[:, 1]
            use_second = first_loops & ~loops(second)
            best = np.where(use_second, second, best)
            best_log_prob = np.where(use_second, result.top_log_probs[:, 1], best_log_prob)
            stuck = first_loops & ~use_second
        steps = self.per_sentence.steps
        at_limit = steps >= self.per_sentence.limit
        if self.engine.force_eos_at_limit:  # </s> as the last token, scored 0 (as in HF)
            best = np.where(at_limit, eos, best)
            best_log_prob = np.where(at_limit, 0.0, best_log_prob)
            if stuck is not None:
                stuck &= ~at_limit
        ended = (best == eos) | at_limit
        if stuck is not None:
            best_log_prob = np.where(stuck, 0.0, best_log_prob)
            ended |= stuck
        self.log_probs += best_log_prob
        self.sequences = np.concatenate([self.sequences, best[:, None]], axis=1)

        finished = []
        for row in np.flatnonzero(ended):
            # tokens, </s> included (a stuck row took none this step)
            produced = int(steps[row]) - int(stuck is not None and stuck[row])
            tokens = self._own(self.sequences, row, row, produced).tolist()
            if tokens and tokens[-1] == eos:
                tokens.pop()
            penalty = self.per_sentence.penalty[row]
            score = float(self.log_probs[row] / max(produced, 1) ** penalty)
            alignment = self._alignment_of(row, row, produced)
            hypothesis = Hypothesis(tokens, score, float(self.log_probs[row]), **alignment)
            finished.append(Finished(self.sentences[row], [hypothesis], int(steps[row])))
        if finished:
            kept = np.flatnonzero(~ended)
            self._keep(kept, kept, best[kept])
        else:
            self.feed = best
        return finished


class BeamBatch(RunningBatch):
    """K open hypotheses (beams) per sentence. Each step ranks the 2K best continuations of a
    sentence's K open beams. A candidate ending in </s> among the first K is finished; the
    best K others stay open. A sentence is done when it has K finished hypotheses and its best
    open beam, scored at the current length, cannot beat the worst of them, or at its length
    limit; it then leaves the batch.

    The bookkeeping is vectorized over sentences; only finished hypotheses are handled one by
    one (a few per sentence in all).
    """

    def __init__(self, engine: Engine, beam_size: int) -> None:
        super().__init__(engine, beam_size)
        self.scores = np.zeros((0, beam_size))  # [sentences, K]: sum of log-probs so far
        self.finished: list[list[Hypothesis]] = []  # per sentence
        self.kth_best = np.zeros(0)  # score of the K-th best finished hypothesis, if K exist

    def _joined(self, count: int) -> None:
        # Beam 0 starts at 0; the other K-1 copies at -inf, so that the first step ranks only
        # beam 0's continuations: the K best first tokens make the K beams.
        start = np.full((count, self.beams), -np.inf)
        start[:, 0] = 0.0
        self.scores = np.concatenate([self.scores, start])
        self.finished.extend([] for _ in range(count))
        self.kth_best = np.concatenate([self.kth_best, np.full(count, -np.inf)])

    def _kept(self, kept: np.ndarray) -> None:
        self.scores = self.scores[kept]
        self.finished = [self.finished[i] for i in kept]
        self.kth_best = self.kth_best[kept]

    def _top_k(self) -> int:
        # Each beam's K+1 best next tokens are enough: ranking a sentence's continuations stops
        # once K are kept open, so no beam gets more than K open ones and one </s> in.
        return self.beams + 1

    def _choose(self, result: StepResult) -> list[Finished]:
        eos, width = self.engine.eos_id, self.beams
        live, per_beam = len(self.sentences), width + 1
        length = self.per_sentence.steps  # [live]: tokens in each open beam after this step
        penalty = self.per_sentence.penalty
        # candidates [live, K * (K+1)]: a beam's score plus the log-prob of one of its tokens
        candidates = self.scores[:, :, None] + result.top_log_probs.reshape(live, width, per_beam)
        if self.per_sentence.any_repeats and self.sequences.shape[1]:
            # A token that would repeat an n-gram once too often is no candidate at all.
            closers = self._closers().reshape(live, width, 1, -1)
            tokens = result.top_ids.reshape(live, width, per_beam)
            closes = (closers == tokens[..., None]).any(axis=3) & (tokens != eos)
            candidates = np.where(closes, -np.inf, candidates)
        at_limit = length >= self.per_sentence.limit  # [live]
        top_ids = result.top_ids.reshape(live, width, per_beam)
        if self.engine.force_eos_at_limit and at_limit.any():
            # At its limit a beam's one continuation is </s>, scored 0 (as in HF).
            top_ids = top_ids.copy()
            top_ids[at_limit, :, 0] = eos
            candidates[at_limit, :, 0] = self.scores[at_limit]
            candidates[at_limit, :, 1:] = -np.inf
        candidates = candidates.reshape(live, -1)
        line = np.arange(live)[:, None]  # (indexes each sentence's own line of a [live, n])
        # The 2K best candidates of each sentence, best first (ties: the lower index first).
        top = np.argsort(-candidates, axis=1, kind="stable")[:, : 2 * width]  # [live, 2K]
        top_scores = candidates[line, top]
        first_row = line * width
        top_row = first_row + top // per_beam  # the beam (row) each candidate continues
        top_token = top_ids.reshape(live, -1)[line, top]
        valid = top_scores > -np.inf
        ends = valid & ((top_token == eos) | at_limit[:, None])

        # Candidates that end among the first K are finished hypotheses.
        for j, rank in zip(*np.nonzero(ends[:, :width]), strict=True):
            row, token = top_row[j, rank], top_token[j, rank]
            # (sequences lack this step's column until the beams are reordered below)
            own = self.sequences[row, self.sequences.shape[1] - (length[j] - 1) :]
            body = own.tolist() + ([] if token == eos else [int(token)])
            score = float(top_scores[j, rank])
            alignment = self._alignment_of(row, j, int(length[j]))
            normalized = score / length[j] ** penalty[j]
            self.finished[j].append(Hypothesis(body, normalized, score, **alignment))
            if len(self.finished[j]) >= width:
                self.kth_best[j] = sorted(h.score for h in self.finished[j])[-width]

        # The K best of the others stay open (fewer only when the sentence is done anyway).
        open_ = valid & ~ends
        if open_[:, :width].all():  # most steps: the K best are all open, in rank order
            next_scores, next_rows = top_scores[:, :width], top_row[:, :width]
            next_tokens = top_token[:, :width]
            done = at_limit.copy()
        else:
            pick = np.argsort(~open_, axis=1, kind="stable")[:, :width]  # open first, by rank
            picked = open_[line, pick]  # [live, K]
            next_scores = np.where(picked, top_scores[line, pick], -np.inf)
            next_rows = np.where(picked, top_row[line, pick], first_row)
            next_tokens = np.where(picked, top_token[line, pick], self.engine.pad_id)
            done = at_limit | ~picked.any(axis=1)
        complete = np.isfinite(self.kth_best)  # K hypotheses finished
        if complete.any():  # done, too, if no open beam can beat the K-th best any more
            done |= complete & (next_scores.max(axis=1) / length**penalty <= self.kth_best)
        ended = np.flatnonzero(done)
        # Done with nothing finished: every way on would have repeated an n-gram once too
        # often. Its best beam, as it stands, is its translation.
        for j in ended:
            if self.finished[j]:
                continue
            beam = int(np.argmax(self.scores[j]))
            row, produced = j * width + beam, max(int(length[j]) - 1, 1)
            score = float(self.scores[j, beam])
            own = self.sequences[row, self.sequences.shape[1] - (int(length[j]) - 1) :]
            alignment = self._alignment_of(row, j, int(length[j]) - 1)
            normalized = score / produced ** penalty[j]
            hypothesis = Hypothesis(own.tolist(), normalized, score, **alignment)
            self.finished[j].append(hypothesis)

        leaving = [Finished(self.sentences[j], self._n_best(j), int(length[j])) for j in ended]
        # Reorder everything that belongs to a beam by the beam it came from; drop the done.
        if len(ended):
            kept = np.flatnonzero(~done)
            rows, tokens = next_rows[kept].reshape(-1), next_tokens[kept].reshape(-1)
        else:  # nobody left: all stay in place
            kept = np.arange(live)
            rows, tokens = next_rows.reshape(-1), next_tokens.reshape(-1)
        self.scores = next_scores
        self._keep(kept, rows, tokens)
        if self.sentences:  # feed: the tokens, in the rows' new order
            self.sequences = np.concatenate([self.sequences, self.feed[:, None]], axis=1)
        return leaving

    def _n_best(self, sentence: int) -> list[Hypothesis]:
        ranked = sorted(self.finished[sentence], key=lambda h: -h.score)
        return ranked[: self.sentences[sentence].options.n_best]


def step_together(batches: list[RunningBatch]) -> list[list[Finished]]:
    """One decoder step for the rows of several running batches (of different beam sizes) in
    one engine call; returns each batch's sentences that ended, as its step() would.

    Why: at a few rows a step costs about what reading the decoder's weights costs (fp32, one
    thread: 2.6 ms at 1 row, 4.3 ms at 8), so a greedy and a beam batch stepped apart pay for
    the weights twice. Together their rows are one batch to the graph: each row gets its own
    copy of its source's cross-attention keys/values (rows per source 1; a beam sentence's K
    rows repeat its source), and the caches are stacked, left-padded to the longest. That copy,
    made for every step, is what it costs; it is small next to the weights at a few rows, not
    at many, so the caller decides when to use it. Each batch then keeps its rows of the new
    caches (views, no copy) and chooses its tokens as it would alone.
    """
    live = [batch for batch in batches if batch.sentences]
    engine = live[0].engine if live else None
    if len(live) < 2 or engine.shortlist is not None or not engine.options.use_cache:
        # (a shortlist's candidates are per batch; the no-cache decoder is for benchmarks)
        return [batch.step() for batch in batches]
    states = [batch.state for batch in live]
    layout = type(states[0])  # DecoderState, or InPlaceState (caches written in place)
    together = layout.went_on_together(states) or layout.rows_together(states)
    top_k = max(batch._top_k() for batch in live)
    want_attention = any(batch._wants_alignment() for batch in live)
    feed = np.concatenate([batch.feed for batch in live])
    result = engine.step(together, feed, top_k=top_k, want_attention=want_attention)
    ended: dict[int, list[Finished]] = {}
    start = 0
    for batch in live:
        stop = start + batch.rows
        batch.state.take_rows_of(together, start, stop)
        ended[id(batch)] = batch._stepped(_rows_of(result, start, stop, batch._top_k()))
        start = stop
    return [ended.get(id(batch), []) for batch in batches]


def _rows_of(result: StepResult, start: int, stop: int, top_k: int) -> StepResult:
    def rows(array: np.ndarray | None) -> np.ndarray | None:
        return None if array is None else array[start:stop]

    return StepResult(
        top_log_probs=result.top_log_probs[start:stop, :top_k],
        top_ids=result.top_ids[start:stop, :top_k],
        alignment=rows(result.alignment),
        attention=rows(result.attention),
    )


def _filling_holes(kept: np.ndarray) -> np.ndarray:
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
