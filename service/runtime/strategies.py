"""How a row's next token is chosen: one class per search strategy, behind one interface.

A `RunningBatch` (running_batch.py) owns the rows, their caches and the tokens so far; it asks
its strategy, at every step, how many best next tokens each row must see (`top_k`), and hands
it the step's result to choose from (`choose`). The strategy keeps its own per-sentence state
(scores, finished hypotheses), appends the chosen tokens, finishes sentences and tells the
batch which rows go on, from which rows (`RunningBatch.keep`). `joined` and `kept` keep that
state in step when sentences join and leave.

Greedy and beam search are the two strategies today; a constrained beam search (terms that
must appear) is a third one behind the same interface.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nmt_contract import Hypothesis
from service.runtime.engine import StepResult
from service.runtime.search import Finished, Sentence

if TYPE_CHECKING:
    from service.runtime.running_batch import RunningBatch

MAX_REPEAT_NGRAM = 4
# Right after a term, how many best next words each row of a constrained search sees (at
# least): the words banned there (a word's continuation, the word the model still wants for
# the term's source) can be all of a beam's K+1 best, and a beam left with no word dies with
# its term. (8 and 16 kept the same terms on bench.terminology; 5 lost 4 more.)
AFTER_TERM_CANDIDATES = 16


def repeat_closers(sequences: np.ndarray, max_repeats: int) -> np.ndarray | None:
    """sequences [rows, L] (tokens so far) -> [rows, MAX_REPEAT_NGRAM] token ids, -1 for none:
    for each n, the token that would make the row end in max_repeats + 1 copies of one n-gram.
    The last n*(max_repeats+1) - 1 tokens must already repeat with period n; the closing token
    is then the one n positions back. (PADDING never matches a real token.)

    None when no row can close a repeat this step, as at most steps. From two repeats on, the
    span to check is longer than n, so a row with period n has its last token n positions back
    as well: a row whose last token is none of the MAX_REPEAT_NGRAM before it has no period at
    all. That costs two array operations, where the periods cost a dozen."""
    rows, length = sequences.shape
    if max_repeats <= 0:
        return None
    if max_repeats >= 2:
        before = sequences[:, -1 - MAX_REPEAT_NGRAM : -1]  # [rows, <= MAX_REPEAT_NGRAM]
        if not (before == sequences[:, -1:]).any():
            return None
    closers = np.full((rows, MAX_REPEAT_NGRAM), -1, dtype=np.int64)
    for n in range(1, MAX_REPEAT_NGRAM + 1):
        span = n * (max_repeats + 1) - 1
        if length < span:
            break
        tail = sequences[:, length - span :]  # [rows, span]
        periodic = np.all(tail[:, n:] == tail[:, :-n], axis=1)
        closers[periodic, n - 1] = tail[periodic, span - n]
    return closers


@functools.cache
def _lines(live: int, beams: int) -> tuple[np.ndarray, np.ndarray]:
    """[live, 1]: each sentence's index (which indexes its own line of a [live, n]), and its
    first row with `beams` rows a sentence; made once per count (read-only: shared)."""
    line = np.arange(live)[:, None]
    first_row = line * beams
    line.flags.writeable = first_row.flags.writeable = False
    return line, first_row


class SearchStrategy(ABC):
    """What a running batch asks of its search; `rows_per_sentence` rows per sentence (K)."""

    def __init__(self, rows_per_sentence: int) -> None:
        self.beams = rows_per_sentence

    @abstractmethod
    def joined(self, sentences: list[Sentence]) -> None:
        """Set up the strategy's own state for the sentences just appended."""

    @abstractmethod
    def kept(self, kept: np.ndarray) -> None:
        """Keep the strategy's own per-sentence state for sentences `kept` (positions)."""

    @abstractmethod
    def top_k(self, batch: RunningBatch) -> int:
        """How many best next tokens a row needs to see this step."""

    def forced(self, batch: RunningBatch) -> np.ndarray | None:
        """Words [rows, F] whose log-probs each row needs besides its top k (a constrained
        search's terms), or None."""
        return None

    def needs_focus(self) -> bool:
        """Whether this step needs each row's alignment (where in the source its attention
        is: a constrained search places its terms by it)."""
        return False

    @abstractmethod
    def choose(self, batch: RunningBatch, result: StepResult) -> list[Finished]:
        """Pick every row's next token from the step's top-k; finish and remove sentences."""


@dataclass(frozen=True)
class TermWords:
    """What a constrained search reads of the target vocabulary: each id's piece, without
    SentencePiece's word-start mark, and whether it goes on with the word before it (no
    mark) rather than starting one."""

    pieces: tuple[str, ...]
    continues_word: np.ndarray  # [V] bool

    @classmethod
    def from_pieces(cls, pieces: list[str], special: set[int]) -> TermWords:
        marked = [piece.startswith("\u2581") for piece in pieces]
        continues = np.array(
            [not mark and i not in special and piece.isalnum() for i, (piece, mark) in
             enumerate(zip(pieces, marked, strict=True))]
        )  # fmt: skip
        return cls(tuple(piece.lstrip("\u2581") for piece in pieces), continues)


def strategy_for(beam_size: int, words: TermWords | None = None) -> SearchStrategy:
    """Greedy for one row a sentence; otherwise beam search, which also takes sentences with
    terms to write (so that a batch mixes them with free ones)."""
    return GreedySearch() if beam_size == 1 else ConstrainedBeamSearch(beam_size, words)


class GreedySearch(SearchStrategy):
    """Each row takes its single most likely next token; a sentence leaves when it ends."""

    def __init__(self) -> None:
        super().__init__(1)
        self.log_probs = np.zeros(0)  # [sentences] sum of the chosen tokens' log-probs

    def joined(self, sentences: list[Sentence]) -> None:
        self.log_probs = np.concatenate([self.log_probs, np.zeros(len(sentences))])

    def kept(self, kept: np.ndarray) -> None:
        self.log_probs = self.log_probs[kept]

    def top_k(self, batch: RunningBatch) -> int:
        # With the repetition guard on, each row also gets its second choice, taken when the
        # first would repeat an n-gram once too often (the model then usually leaves the loop).
        return 2 if batch.per_sentence.any_repeats else 1

    def choose(self, batch: RunningBatch, result: StepResult) -> list[Finished]:
        # Most steps: every row takes its best token and nobody ends. What that costs is a
        # handful of array operations; the rest is only done at the steps that need it.
        eos = batch.engine.eos_id
        best, best_log_prob = result.top_ids[:, 0], result.top_log_probs[:, 0]  # [rows]
        # Rows whose both choices would loop end before them (None unless a row can close a
        # repeat this step, which spares a few array operations at most steps).
        stuck = None
        closers = batch.closers() if batch.per_sentence.any_repeats else None
        if closers is not None:

            def loops(tokens: np.ndarray) -> np.ndarray:
                return (closers == tokens[:, None]).any(axis=1) & (tokens != eos)

            first_loops, second = loops(best), result.top_ids[:, 1]
            use_second = first_loops & ~loops(second)
            best = np.where(use_second, second, best)
            best_log_prob = np.where(use_second, result.top_log_probs[:, 1], best_log_prob)
            stuck = first_loops & ~use_second
        ended = best == eos
        if batch.any_at_limit():
            at_limit = batch.steps >= batch.per_sentence.limit
            if batch.engine.force_eos_at_limit:  # </s> as the last token, scored 0 (as in HF)
                best = np.where(at_limit, eos, best)
                best_log_prob = np.where(at_limit, 0.0, best_log_prob)
                if stuck is not None:
                    stuck &= ~at_limit
            ended |= at_limit
        if stuck is not None:
            best_log_prob = np.where(stuck, 0.0, best_log_prob)
            ended |= stuck
        self.log_probs += best_log_prob
        batch.sequences = np.concatenate([batch.sequences, best[:, None]], axis=1)
        if not ended.any():
            batch.feed = best
            return []

        finished = []
        steps = batch.steps
        for row in np.flatnonzero(ended):
            # tokens, </s> included (a stuck row took none this step)
            produced = int(steps[row]) - int(stuck is not None and stuck[row])
            tokens = batch.own(batch.sequences, row, row, produced).tolist()
            details = batch.details_of(row, row, tokens)
            if tokens and tokens[-1] == eos:
                tokens.pop()
            penalty = batch.per_sentence.penalty[row]
            score = float(self.log_probs[row] / max(produced, 1) ** penalty)
            hypothesis = Hypothesis(tokens, score, float(self.log_probs[row]), **details)
            finished.append(Finished(batch.sentences[row], [hypothesis], int(steps[row])))
        kept = np.flatnonzero(~ended)
        batch.keep(kept, kept, best[kept])
        return finished


class BeamSearch(SearchStrategy):
    """K open hypotheses (beams) per sentence. Each step ranks the 2K best continuations of a
    sentence's K open beams. A candidate ending in </s> among the first K is finished; the
    best K others stay open. A sentence is done when it has K finished hypotheses and its best
    open beam, scored at the current length, cannot beat the worst of them, or at its length
    limit; it then leaves the batch.

    The bookkeeping is vectorized over sentences; only finished hypotheses are handled one by
    one (a few per sentence in all).
    """

    def __init__(self, beam_size: int) -> None:
        super().__init__(beam_size)
        self.scores = np.zeros((0, beam_size))  # [sentences, K]: sum of log-probs so far
        self.finished: list[list[Hypothesis]] = []  # per sentence
        self.kth_best = np.zeros(0)  # score of the K-th best finished hypothesis, if K exist
        self.any_complete = False  # whether a sentence has K finished hypotheses

    def joined(self, sentences: list[Sentence]) -> None:
        # Beam 0 starts at 0; the other K-1 copies at -inf, so that the first step ranks only
        # beam 0's continuations: the K best first tokens make the K beams.
        count = len(sentences)
        start = np.full((count, self.beams), -np.inf)
        start[:, 0] = 0.0
        self.scores = np.concatenate([self.scores, start])
        self.finished.extend([] for _ in range(count))
        self.kth_best = np.concatenate([self.kth_best, np.full(count, -np.inf)])

    def kept(self, kept: np.ndarray) -> None:
        self.scores = self.scores[kept]
        self.finished = [self.finished[i] for i in kept]
        self.kth_best = self.kth_best[kept]
        self.any_complete = bool(np.isfinite(self.kth_best).any())

    def top_k(self, batch: RunningBatch) -> int:
        # Each beam's K+1 best next tokens are enough: ranking a sentence's continuations stops
        # once K are kept open, so no beam gets more than K open ones and one </s> in.
        return self.beams + 1

    # What a constrained search changes (ConstrainedBeamSearch); plain beam search:

    def _continuations(
        self, batch: RunningBatch, result: StepResult
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each beam's next words and their log-probs, [live, K, P] each."""
        shape = (len(batch.sentences), self.beams, -1)
        return result.top_log_probs.reshape(shape), result.top_ids.reshape(shape)

    def _allowed(
        self,
        batch: RunningBatch,
        candidates: np.ndarray,
        words: np.ndarray,
        at_limit: np.ndarray | None,
    ) -> np.ndarray:
        """candidates [live, K, P], -inf where a word may not follow its beam (`at_limit`
        [live]: the sentences at their length limit; None: none is)."""
        return candidates

    def _ranked(self, candidates: np.ndarray, words: np.ndarray) -> np.ndarray:
        """Each sentence's candidates [live, K*P] in the order they are kept: best first
        (ties: the lower index first)."""
        return np.argsort(-candidates, axis=1, kind="stable")

    def _advanced(self, rows: np.ndarray, words: np.ndarray) -> None:
        """The new beams [live, K]: each continues the beam of batch row rows[j, b] (beam
        rows[j, b] - j*K of its sentence) with words[j, b]."""

    def _finished_one(self, j: int, beam: int, word: int | None) -> None:
        """Sentence j's hypothesis just finished: beam `beam` (before this step's move) with
        `word` last (None: the beam as it stood)."""

    def _done(
        self, done: np.ndarray | None, scores: np.ndarray, batch: RunningBatch
    ) -> np.ndarray | None:
        """Which sentences are done [live] (None: none), given those done already (None:
        none) and the open beams' scores [live, K] after this step: also those with K
        hypotheses finished that no open beam can beat any more."""
        if not self.any_complete:
            return done
        complete = np.isfinite(self.kth_best)  # K hypotheses finished
        length, penalty = batch.steps, batch.per_sentence.penalty
        beaten = complete & (scores.max(axis=1) / length**penalty <= self.kth_best)
        return beaten if done is None else done | beaten

    def choose(self, batch: RunningBatch, result: StepResult) -> list[Finished]:
        eos, width = batch.engine.eos_id, self.beams
        live = len(batch.sentences)
        # Each beam's continuations [live, K, P]: its top-k words (P = K+1), and in a
        # constrained search the words its terms go on with; candidates [live, K, P]: the
        # beam's score plus the log-prob of one of them.
        log_probs, top_ids = self._continuations(batch, result)
        per_beam = top_ids.shape[2]
        candidates = self.scores[:, :, None] + log_probs
        closers = batch.closers() if batch.per_sentence.any_repeats else None
        if closers is not None:
            # A token that would repeat an n-gram once too often is no candidate at all.
            closers = closers.reshape(live, width, 1, -1)
            closes = (closers == top_ids[..., None]).any(axis=3) & (top_ids != eos)
            candidates = np.where(closes, -np.inf, candidates)
        # [live]: the sentences at their length limit (None before any sentence can be)
        at_limit = batch.steps >= batch.per_sentence.limit if batch.any_at_limit() else None
        if at_limit is not None and not at_limit.any():
            at_limit = None
        if at_limit is not None and batch.engine.force_eos_at_limit:
            # At its limit a beam's one continuation is </s>, scored 0 (as in HF).
            top_ids = top_ids.copy()
            top_ids[at_limit, :, 0] = eos
            candidates[at_limit, :, 0] = self.scores[at_limit]
            candidates[at_limit, :, 1:] = -np.inf
        candidates = self._allowed(batch, candidates, top_ids, at_limit).reshape(live, -1)
        line, first_row = _lines(live, self.beams)
        top = self._ranked(candidates, top_ids)[:, : 2 * width]  # [live, 2K]
        top_scores = candidates[line, top]
        top_row = first_row + top // per_beam  # the beam (row) each candidate continues
        top_token = top_ids.reshape(live, -1)[line, top]

        # Most steps: each sentence's K best candidates are all real (not -inf) and none ends:
        # they are its K beams, in rank order, and nobody is done but by the finished ones.
        if (
            at_limit is None
            and not (top_token[:, :width] == eos).any()
            and top_scores[:, width - 1].min() > -np.inf
        ):
            next_scores, next_rows = top_scores[:, :width], top_row[:, :width]
            next_tokens = top_token[:, :width]
            done = None
        else:
            next_scores, next_rows, next_tokens, done = self._finish(
                batch, at_limit, top_scores, top_row, top_token
            )
        self._advanced(next_rows, next_tokens)
        done = self._done(done, next_scores, batch)
        ended = np.flatnonzero(done) if done is not None and done.any() else ()
        steps = batch.steps if len(ended) else None
        # Done with nothing finished: every way on would have repeated an n-gram once too
        # often. Its best beam, as it stands, is its translation.
        for j in ended:
            if self.finished[j]:
                continue
            length, penalty = int(steps[j]), batch.per_sentence.penalty[j]
            beam = int(np.argmax(self.scores[j]))
            row, produced = j * width + beam, max(length - 1, 1)
            score = float(self.scores[j, beam])
            own = batch.sequences[row, batch.sequences.shape[1] - (length - 1) :]
            details = batch.details_of(row, j, own.tolist())
            normalized = score / produced**penalty
            hypothesis = Hypothesis(own.tolist(), normalized, score, **details)
            self.finished[j].append(hypothesis)
            self._finished_one(j, beam, None)

        leaving = [
            Finished(batch.sentences[j], self._n_best(batch, j), int(steps[j])) for j in ended
        ]
        # Reorder everything that belongs to a beam by the beam it came from; drop the done.
        if len(ended):
            kept = np.flatnonzero(~done)
            rows, tokens = next_rows[kept].reshape(-1), next_tokens[kept].reshape(-1)
        else:  # nobody left: all stay in place
            kept = None
            rows, tokens = next_rows.reshape(-1), next_tokens.reshape(-1)
        self.scores = next_scores
        batch.keep(kept, rows, tokens)
        if batch.sentences:  # feed: the tokens, in the rows' new order
            batch.sequences = np.concatenate([batch.sequences, batch.feed[:, None]], axis=1)
            self._substitute(batch)
        return leaving

    def _substitute(self, batch: RunningBatch) -> None:
        """Where the decoder is to read another token than the one its row wrote: batch.feed
        [rows], in place. Beam search reads what it writes."""

    def _finish(
        self,
        batch: RunningBatch,
        at_limit: np.ndarray | None,
        top_scores: np.ndarray,
        top_row: np.ndarray,
        top_token: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A step at which some sentence's K best candidates hold one that ends (</s>, or
        the length limit) or one that cannot be taken (-inf): those that end among the K
        best are finished hypotheses, and the K best of the others stay open (fewer only
        when the sentence is done anyway). The ranked candidates [live, 2K]: their scores,
        rows and tokens. Returns the new beams' scores, rows and tokens [live, K], and which
        sentences are done [live]."""
        eos, width = batch.engine.eos_id, self.beams
        line, first_row = _lines(len(batch.sentences), self.beams)
        length, penalty = batch.steps, batch.per_sentence.penalty  # [live]
        valid = top_scores > -np.inf
        ends = valid & (top_token == eos)
        if at_limit is not None:
            ends |= valid & at_limit[:, None]
        for j, rank in zip(*np.nonzero(ends[:, :width]), strict=True):
            row, token = top_row[j, rank], top_token[j, rank]
            # (sequences lack this step's column until the beams are reordered)
            own = batch.sequences[row, batch.sequences.shape[1] - (length[j] - 1) :]
            body = own.tolist() + ([] if token == eos else [int(token)])
            score = float(top_scores[j, rank])
            details = batch.details_of(row, j, body + ([int(eos)] if token == eos else []))
            normalized = score / length[j] ** penalty[j]
            self.finished[j].append(Hypothesis(body, normalized, score, **details))
            self._finished_one(j, int(row - first_row[j, 0]), int(token))
            if len(self.finished[j]) >= width:
                self.kth_best[j] = sorted(h.score for h in self.finished[j])[-width]
                self.any_complete = True

        open_ = valid & ~ends
        done = np.zeros(len(line), dtype=bool) if at_limit is None else at_limit.copy()
        if open_[:, :width].all():  # the K best are all open, in rank order
            return top_scores[:, :width], top_row[:, :width], top_token[:, :width], done
        pick = np.argsort(~open_, axis=1, kind="stable")[:, :width]  # open first, by rank
        picked = open_[line, pick]  # [live, K]
        if picked.all():  # K open ones for every sentence
            return top_scores[line, pick], top_row[line, pick], top_token[line, pick], done
        next_scores = np.where(picked, top_scores[line, pick], -np.inf)
        next_rows = np.where(picked, top_row[line, pick], first_row)
        next_tokens = np.where(picked, top_token[line, pick], batch.engine.pad_id)
        return next_scores, next_rows, next_tokens, done | ~picked.any(axis=1)

    def _n_best(self, batch: RunningBatch, sentence: int) -> list[Hypothesis]:
        ranked = sorted(self.finished[sentence], key=lambda h: -h.score)
        return ranked[: batch.sentences[sentence].options.n_best]


class ConstrainedBeamSearch(BeamSearch):
    """Beam search in which a sentence's terms (Sentence.constraints: token sequences) must
    appear in its translation: lexically constrained decoding with dynamic beam allocation
    (Post & Vilar, 2018; the vectorized form is Hu et al., 2019, fairseq's
    `LexicallyConstrainedBeamSearch`), placed by the cross-attention.

    Each beam tracks its terms: which are written (a bit each), and the one it is in the
    middle of (which, and how many of its tokens so far). Its candidates are its top-k words
    plus the words that go on with its terms, scored by the decoder like any word
    (`forced_log_probs`): the next token of the term it is in, and the first token of a term
    not written yet, but only while the beam's attention (the step's alignment: where the
    query of this position looks in the source) is on that term's source words. So a term is
    written where its source is being translated, not pasted where the model happens to
    stop. A candidate's bank is how many term tokens its beam has written once it takes the
    word; the K beams kept are picked across banks in turn, the best of each bank first, so
    that beams that wrote their terms survive next to beams the model prefers. </s> is a
    candidate only once every term is written (or at the length limit), except where the
    model wants to end a beam that has not written them: that beam ends there, a translation
    without its terms, ranked after every one with them. It does not go on past its sentence
    to fit the term in ("A jockey on his horse. A steed jockey."). A sentence is done when a
    hypothesis with every term has finished and no open beam with every term written can
    beat it. A beam that started a term writes the rest of it next.

    Sentences without terms in the same batch are searched exactly as BeamSearch does.
    """

    def __init__(self, beam_size: int, words: TermWords | None = None) -> None:
        super().__init__(beam_size)
        self.words = words  # (None: no word-level rules, only the terms' tokens)
        self._families: dict[int, np.ndarray] = {}  # displaced word -> the words it starts
        self.terms: list[tuple[tuple[int, ...], ...]] = []  # per sentence
        # Per sentence and term: the source positions [start, end) it translates (None: any)
        self.spans: list[tuple[tuple[int, int], ...] | None] = []
        # Per sentence and beam [sentences, K]: the terms written (bit i: term i), the term
        # it is in the middle of (-1: none) and how many of its tokens it has written.
        # `written` holds Python integers (an object array): a sentence may match more terms
        # than an int64 has bits (64 digits, or a term that is a comma).
        self.written = np.zeros((0, beam_size), dtype=object)
        self.current = np.zeros((0, beam_size), dtype=np.int64)
        self.matched = np.zeros((0, beam_size), dtype=np.int64)
        # The term each beam's last word ended (-1: none)
        self.just_written = np.zeros((0, beam_size), dtype=np.int64)
        # Per sentence [K, terms]: the word each beam's model would have written where the
        # beam started a term (-1: not started): not written again while the beam's
        # attention stays on that term's source words ("a hound dog" for "un chien").
        self.displaced: list[np.ndarray] = []
        self.kept_terms: list[list[bool]] = []  # per sentence: per finished hypothesis
        self.any_terms = False
        # This step's forced words [rows, F] (what forced() asked the engine for), the term
        # each starts (-1: it goes on with the term its beam is in), and which are real (the
        # others pad the rows to one width)
        self._forced_ids: np.ndarray | None = None
        self._forced_term: np.ndarray | None = None
        self._forced_valid: np.ndarray | None = None
        # This step's: each row's source position of most attention, and its model's best word
        self._focus: np.ndarray | None = None
        self._best: np.ndarray | None = None

    def joined(self, sentences: list[Sentence]) -> None:
        super().joined(sentences)
        count = len(sentences)
        self.terms += [tuple(tuple(term) for term in s.constraints) for s in sentences]
        self.spans += [s.constraint_spans or None for s in sentences]
        zeros = np.zeros((count, self.beams), dtype=np.int64)
        self.written = np.concatenate([self.written, np.zeros_like(zeros, dtype=object)])
        self.current = np.concatenate([self.current, zeros - 1])
        self.matched = np.concatenate([self.matched, zeros])
        self.just_written = np.concatenate([self.just_written, zeros - 1])
        self.kept_terms += [[] for _ in range(count)]
        self.displaced += [
            np.full((self.beams, len(s.constraints)), -1, dtype=np.int64) for s in sentences
        ]
        self.any_terms = any(self.terms)

    def kept(self, kept: np.ndarray) -> None:
        super().kept(kept)
        self.terms = [self.terms[i] for i in kept]
        self.spans = [self.spans[i] for i in kept]
        self.written, self.current = self.written[kept], self.current[kept]
        self.matched, self.just_written = self.matched[kept], self.just_written[kept]
        self.kept_terms = [self.kept_terms[i] for i in kept]
        self.displaced = [self.displaced[i] for i in kept]
        self.any_terms = any(self.terms)

    def needs_focus(self) -> bool:
        return self.any_terms

    def top_k(self, batch: RunningBatch) -> int:
        k = super().top_k(batch)
        if self.any_terms and (self.just_written >= 0).any():
            return max(k, AFTER_TERM_CANDIDATES)
        return k

    def forced(self, batch: RunningBatch) -> np.ndarray | None:
        if not self.any_terms:
            self._forced_ids = self._forced_term = self._forced_valid = None
            return None
        per_row: list[list[tuple[int, int]]] = []  # (word, term it starts or -1)
        for j, terms in enumerate(self.terms):
            for beam in range(self.beams):
                words: dict[int, int] = {}
                if terms:
                    current, matched = int(self.current[j, beam]), int(self.matched[j, beam])
                    if current >= 0:
                        words[terms[current][matched]] = -1
                    written = int(self.written[j, beam])
                    for i, term in enumerate(terms):
                        if not written >> i & 1:
                            words.setdefault(term[0], i)
                per_row.append(list(words.items()))
        width = max(1, max(len(words) for words in per_row))
        shape = (len(per_row), width)
        forced, term = np.zeros(shape, dtype=np.int64), np.full(shape, -1, dtype=np.int64)
        valid = np.zeros(shape, dtype=bool)
        for row, words in enumerate(per_row):
            for slot, (word, starts) in enumerate(words):
                forced[row, slot], term[row, slot], valid[row, slot] = word, starts, True
        self._forced_ids, self._forced_term, self._forced_valid = forced, term, valid
        return forced

    def _continuations(
        self, batch: RunningBatch, result: StepResult
    ) -> tuple[np.ndarray, np.ndarray]:
        log_probs, words = super()._continuations(batch, result)
        if self._forced_valid is None:
            return log_probs, words
        allowed = self._forced_valid.copy()
        self._best = result.top_ids[:, 0]
        self._focus = None
        if result.alignment is not None:  # a term starts where its source is looked at
            self._focus = focus = np.argmax(result.alignment, axis=1)  # [rows]
            for row, slot in zip(*np.nonzero(allowed & (self._forced_term >= 0)), strict=True):
                spans = self.spans[row // self.beams]
                if spans is not None:
                    start, end = spans[self._forced_term[row, slot]]
                    allowed[row, slot] = start <= focus[row] < end
        shape = (len(batch.sentences), self.beams, -1)
        forced_ids = self._forced_ids.reshape(shape)
        forced = np.where(allowed, result.forced_log_probs, -np.inf).reshape(shape)
        # A beam in the middle of a term goes on with it: its next token is its only word.
        inside = np.stack([self.current[j] >= 0 for j in range(len(self.terms))])  # [live, K]
        log_probs = np.where(inside[..., None], -np.inf, log_probs)
        starts = self._forced_term.reshape(shape) >= 0
        forced = np.where(inside[..., None] & starts, -np.inf, forced)
        # A forced word already among the beam's top k is that candidate, not a second one.
        same = forced_ids[..., :, None] == words[..., None, :]  # [live, K, F, k]
        again = (same & np.isfinite(log_probs)[..., None, :]).any(axis=-1)
        forced = np.where(again, -np.inf, forced)
        return np.concatenate([log_probs, forced], axis=2), np.concatenate([words, forced_ids], 2)

    def _after(self, j: int, beam: int, word: int) -> tuple[int, int, int]:
        """Beam `beam` of sentence j after writing `word`: (terms written, the term it is in,
        its tokens written so far)."""
        terms, written = self.terms[j], int(self.written[j, beam])
        current, matched = int(self.current[j, beam]), int(self.matched[j, beam])
        if current >= 0 and terms[current][matched] == word:
            matched += 1
            if matched == len(terms[current]):
                return written | 1 << current, -1, 0
            return written, current, matched
        for i, term in enumerate(terms):  # a term started where its source is looked at
            if not written >> i & 1 and term[0] == word and self._looks_at(j, beam, i):
                return (written | 1 << i, -1, 0) if len(term) == 1 else (written, i, 1)
        return written, -1, 0

    def _bank(self, j: int, state: tuple[int, int, int]) -> int:
        """How many term tokens a beam in `state` has written."""
        written, _, matched = state
        terms = self.terms[j]
        return sum(len(term) for i, term in enumerate(terms) if written >> i & 1) + matched

    def _all_written(self, j: int, written: np.ndarray, current: np.ndarray) -> np.ndarray:
        return (written == (1 << len(self.terms[j])) - 1) & (current < 0)

    def _allowed(
        self,
        batch: RunningBatch,
        candidates: np.ndarray,
        words: np.ndarray,
        at_limit: np.ndarray | None,
    ) -> np.ndarray:
        if not self.any_terms:
            return candidates
        eos = batch.engine.eos_id
        for j, terms in enumerate(self.terms):
            if not terms:
                continue
            if at_limit is None or not at_limit[j]:
                unfinished = ~self._all_written(j, self.written[j], self.current[j])  # [K]
                # A beam whose model wants to end, its terms not all written (and not in the
                # middle of one), ends: what it would write after its sentence to fit a term
                # in is not a translation. Elsewhere </s> waits for the terms.
                best = self._best[j * self.beams : (j + 1) * self.beams]
                ending = unfinished & (best == eos) & (self.current[j] < 0)  # [K]
                no_end = (unfinished & ~ending)[:, None] & (words[j] == eos)
                only_end = ending[:, None] & (words[j] != eos)
                candidates[j] = np.where(no_end | only_end, -np.inf, candidates[j])
            if self.words is None:
                continue
            # A term ends a word: what follows it starts one ("a noveler" for "un livre").
            ended = (self.just_written[j] >= 0)[:, None] & self.words.continues_word[words[j]]
            candidates[j] = np.where(ended, -np.inf, candidates[j])
            spans = self.spans[j]
            if spans is None or self._focus is None:
                continue
            # The term translates its source words: the word the model wanted there instead,
            # or one it starts, is not written while the beam still looks at them.
            for beam, term in zip(*np.nonzero(self.displaced[j] >= 0), strict=True):
                if self.current[j, beam] >= 0:
                    continue  # (in a term, its next token, which may be that very word)
                start, end = spans[term]
                if start <= self._focus[j * self.beams + beam] < end:
                    family = self._family(int(self.displaced[j][beam, term]))
                    again = np.isin(words[j, beam], family)
                    candidates[j, beam] = np.where(again, -np.inf, candidates[j, beam])
            # Right after a term, a beam still looking at its source words wants to translate
            # them again ("a youngster boy"): its model's best word then is not written.
            for beam in np.flatnonzero(self.just_written[j] >= 0):
                row = j * self.beams + beam
                start, end = spans[int(self.just_written[j, beam])]
                if start <= self._focus[row] < end and not self._is_punctuation(self._best[row]):
                    again = np.isin(words[j, beam], self._family(int(self._best[row])))
                    candidates[j, beam] = np.where(again, -np.inf, candidates[j, beam])
        return candidates

    def _substitute(self, batch: RunningBatch) -> None:
        # A beam that has just written a one-word term reads, as its last token, the word the
        # model wanted where the term started: the decoder then goes on as after its own word
        # ("A dog" -> "is running") while the output holds the term ("A hound is running").
        # Read as written, the term left the model wanting to translate its source again: that
        # word banned (above), it skipped what came next instead ("A hound." for "Un chien
        # court."). A term of several words is read as written: its last word is not the
        # displaced one's place ("crimson hat" for "chapeau rouge": "red" would come back).
        # Only a word (not </s>, punctuation or the middle of a word) stands in for a term.
        if not self.any_terms or self.words is None:
            return
        eos = batch.engine.eos_id
        for j, terms in enumerate(self.terms):
            for beam in np.flatnonzero(self.just_written[j] >= 0):
                term = int(self.just_written[j, beam])
                displaced = int(self.displaced[j][beam, term])
                words = sum(1 for token in terms[term] if not self.words.continues_word[token])
                if (
                    words == 1
                    and displaced >= 0
                    and displaced != eos
                    and not self.words.continues_word[displaced]
                    and not self._is_punctuation(displaced)
                ):
                    batch.feed[j * self.beams + beam] = displaced

    def _is_punctuation(self, word: int) -> bool:
        piece = self.words.pieces[int(word)]
        return not any(character.isalnum() for character in piece)

    def _looks_at(self, j: int, beam: int, term: int) -> bool:
        """Whether this step's attention of beam `beam` of sentence j is on the term's source
        words (always, without spans or alignment)."""
        spans = self.spans[j]
        if spans is None or self._focus is None:
            return True
        start, end = spans[term]
        return bool(start <= self._focus[j * self.beams + beam] < end)

    def _family(self, word: int) -> np.ndarray:
        """The ids whose piece starts with `word`'s piece ("dog": "dog", "dogs"), word-start
        marks aside; made once per word."""
        if word not in self._families:
            piece = self.words.pieces[word]
            family = [i for i, other in enumerate(self.words.pieces) if other.startswith(piece)]
            self._families[word] = np.array(family if piece else [word], dtype=np.int64)
        return self._families[word]

    def _ranked(self, candidates: np.ndarray, words: np.ndarray) -> np.ndarray:
        order = super()._ranked(candidates, words)
        if not self.any_terms:
            return order
        per_beam = words.shape[2]
        flat = words.reshape(len(words), -1)
        for j, terms in enumerate(self.terms):
            if not terms:
                continue
            # Dynamic beam allocation: the best candidate of each bank (most term tokens
            # first), then the second best of each, and so on; those that cannot be taken
            # (-inf) last.
            counts: dict[int, int] = {}
            keys = []
            for place, index in enumerate(order[j]):
                if candidates[j, index] == -np.inf:
                    keys.append((1, 0, 0, place))
                    continue
                beam = int(index) // per_beam
                bank = self._bank(j, self._after(j, beam, int(flat[j, index])))
                rank = counts.get(bank, 0)
                counts[bank] = rank + 1
                keys.append((0, rank, -bank, place))
            order[j] = order[j][[key[3] for key in sorted(keys)]]
        return order

    def _advanced(self, rows: np.ndarray, words: np.ndarray) -> None:
        if not self.any_terms:
            return
        beams = rows - _lines(len(rows), self.beams)[1]  # [live, K]: each one's old beam
        written, current, matched = self.written.copy(), self.current.copy(), self.matched.copy()
        just_written = np.full_like(self.just_written, -1)
        for j, terms in enumerate(self.terms):
            if not terms:
                continue
            displaced = self.displaced[j][beams[j]]  # [K, terms]: each new beam's origin's
            for new in range(self.beams):
                old, word = int(beams[j, new]), int(words[j, new])
                state = self._after(j, old, word)
                written[j, new], current[j, new], matched[j, new] = state
                newly = state[0] & ~int(self.written[j, old])
                just_written[j, new] = newly.bit_length() - 1 if newly else -1
                started = self._started(j, old, state)
                best = int(self._best[j * self.beams + old])
                if started >= 0 and best != word:
                    displaced[new, started] = best
            self.displaced[j] = displaced
        self.written, self.current, self.matched = written, current, matched
        self.just_written = just_written

    def _started(self, j: int, beam: int, state: tuple[int, int, int]) -> int:
        """The term that beam `beam` of sentence j started with the word that led to `state`
        (its first token: one-token terms are written at once), or -1."""
        written, current, matched = state
        if current >= 0 and matched == 1:
            return current
        newly = written & ~int(self.written[j, beam])
        if newly and len(self.terms[j][newly.bit_length() - 1]) == 1:
            return newly.bit_length() - 1
        return -1

    def _finished_one(self, j: int, beam: int, word: int | None) -> None:
        # (called before _advanced: written/current are still the beams before this step)
        if not self.terms[j]:
            self.kept_terms[j].append(True)
            return
        state = (int(self.written[j, beam]), int(self.current[j, beam]), 0)
        if word is not None:
            state = self._after(j, beam, word)
        kept = state[0] == (1 << len(self.terms[j])) - 1 and state[1] < 0
        self.kept_terms[j].append(kept)

    def _done(
        self, done: np.ndarray | None, scores: np.ndarray, batch: RunningBatch
    ) -> np.ndarray | None:
        if not self.any_terms:
            return super()._done(done, scores, batch)
        done = np.zeros(len(scores), dtype=bool) if done is None else done.copy()
        plain = super()._done(None, scores, batch)  # (what decides for a sentence without terms)
        if plain is not None:
            done |= np.array([not terms for terms in self.terms]) & plain
        length, penalty = batch.steps, batch.per_sentence.penalty
        for j, terms in enumerate(self.terms):
            found = zip(self.finished[j], self.kept_terms[j], strict=True)
            best = [h.score for h, kept in found if kept]
            if not terms or not best:
                continue
            # Done once a hypothesis with every term has finished and no open beam that has
            # written them all can beat it (self.written is the new beams' now: _advanced ran).
            ready = self._all_written(j, self.written[j], self.current[j])
            open_best = scores[j][ready].max(initial=-np.inf) / length[j] ** penalty[j]
            done[j] |= open_best <= max(best)
        return done

    def _n_best(self, batch: RunningBatch, sentence: int) -> list[Hypothesis]:
        """Hypotheses with every term first, each group best first."""
        found = zip(self.finished[sentence], self.kept_terms[sentence], strict=True)
        ranked = [h for h, _ in sorted(found, key=lambda pair: (not pair[1], -pair[0].score))]
        return ranked[: batch.sentences[sentence].options.n_best]
