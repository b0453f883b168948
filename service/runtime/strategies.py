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

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

from nmt_contract import Hypothesis
from service.runtime.engine import StepResult
from service.runtime.search import Finished

if TYPE_CHECKING:
    from service.runtime.running_batch import RunningBatch

MAX_REPEAT_NGRAM = 4


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


class SearchStrategy(ABC):
    """What a running batch asks of its search; `rows_per_sentence` rows per sentence (K)."""

    def __init__(self, rows_per_sentence: int) -> None:
        self.beams = rows_per_sentence

    @abstractmethod
    def joined(self, count: int) -> None:
        """Set up the strategy's own state for the `count` sentences just appended."""

    @abstractmethod
    def kept(self, kept: np.ndarray) -> None:
        """Keep the strategy's own per-sentence state for sentences `kept` (positions)."""

    @abstractmethod
    def top_k(self, batch: RunningBatch) -> int:
        """How many best next tokens a row needs to see this step."""

    @abstractmethod
    def choose(self, batch: RunningBatch, result: StepResult) -> list[Finished]:
        """Pick every row's next token from the step's top-k; finish and remove sentences."""


def strategy_for(beam_size: int) -> SearchStrategy:
    return GreedySearch() if beam_size == 1 else BeamSearch(beam_size)


class GreedySearch(SearchStrategy):
    """Each row takes its single most likely next token; a sentence leaves when it ends."""

    def __init__(self) -> None:
        super().__init__(1)
        self.log_probs = np.zeros(0)  # [sentences] sum of the chosen tokens' log-probs

    def joined(self, count: int) -> None:
        self.log_probs = np.concatenate([self.log_probs, np.zeros(count)])

    def kept(self, kept: np.ndarray) -> None:
        self.log_probs = self.log_probs[kept]

    def top_k(self, batch: RunningBatch) -> int:
        # With the repetition guard on, each row also gets its second choice, taken when the
        # first would repeat an n-gram once too often (the model then usually leaves the loop).
        return 2 if batch.per_sentence.any_repeats else 1

    def choose(self, batch: RunningBatch, result: StepResult) -> list[Finished]:
        eos = batch.engine.eos_id
        best, best_log_prob = result.top_ids[:, 0], result.top_log_probs[:, 0]  # [rows]
        # Rows whose both choices would loop end before them (only with the guard: else None,
        # which spares a few array operations a step).
        stuck = None
        if batch.per_sentence.any_repeats:
            closers = batch.closers()

            def loops(tokens: np.ndarray) -> np.ndarray:
                return (closers == tokens[:, None]).any(axis=1) & (tokens != eos)

            first_loops, second = loops(best), result.top_ids[:, 1]
            use_second = first_loops & ~loops(second)
            best = np.where(use_second, second, best)
            best_log_prob = np.where(use_second, result.top_log_probs[:, 1], best_log_prob)
            stuck = first_loops & ~use_second
        steps = batch.per_sentence.steps
        at_limit = steps >= batch.per_sentence.limit
        if batch.engine.force_eos_at_limit:  # </s> as the last token, scored 0 (as in HF)
            best = np.where(at_limit, eos, best)
            best_log_prob = np.where(at_limit, 0.0, best_log_prob)
            if stuck is not None:
                stuck &= ~at_limit
        ended = (best == eos) | at_limit
        if stuck is not None:
            best_log_prob = np.where(stuck, 0.0, best_log_prob)
            ended |= stuck
        self.log_probs += best_log_prob
        batch.sequences = np.concatenate([batch.sequences, best[:, None]], axis=1)

        finished = []
        for row in np.flatnonzero(ended):
            # tokens, </s> included (a stuck row took none this step)
            produced = int(steps[row]) - int(stuck is not None and stuck[row])
            tokens = batch.own(batch.sequences, row, row, produced).tolist()
            if tokens and tokens[-1] == eos:
                tokens.pop()
            penalty = batch.per_sentence.penalty[row]
            score = float(self.log_probs[row] / max(produced, 1) ** penalty)
            alignment = batch.alignment_of(row, row, produced)
            hypothesis = Hypothesis(tokens, score, float(self.log_probs[row]), **alignment)
            finished.append(Finished(batch.sentences[row], [hypothesis], int(steps[row])))
        if finished:
            kept = np.flatnonzero(~ended)
            batch.keep(kept, kept, best[kept])
        else:
            batch.feed = best
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

    def joined(self, count: int) -> None:
        # Beam 0 starts at 0; the other K-1 copies at -inf, so that the first step ranks only
        # beam 0's continuations: the K best first tokens make the K beams.
        start = np.full((count, self.beams), -np.inf)
        start[:, 0] = 0.0
        self.scores = np.concatenate([self.scores, start])
        self.finished.extend([] for _ in range(count))
        self.kth_best = np.concatenate([self.kth_best, np.full(count, -np.inf)])

    def kept(self, kept: np.ndarray) -> None:
        self.scores = self.scores[kept]
        self.finished = [self.finished[i] for i in kept]
        self.kth_best = self.kth_best[kept]

    def top_k(self, batch: RunningBatch) -> int:
        # Each beam's K+1 best next tokens are enough: ranking a sentence's continuations stops
        # once K are kept open, so no beam gets more than K open ones and one </s> in.
        return self.beams + 1

    def choose(self, batch: RunningBatch, result: StepResult) -> list[Finished]:
        eos, width = batch.engine.eos_id, self.beams
        live, per_beam = len(batch.sentences), width + 1
        length = batch.per_sentence.steps  # [live]: tokens in each open beam after this step
        penalty = batch.per_sentence.penalty
        # candidates [live, K * (K+1)]: a beam's score plus the log-prob of one of its tokens
        candidates = self.scores[:, :, None] + result.top_log_probs.reshape(live, width, per_beam)
        if batch.per_sentence.any_repeats and batch.sequences.shape[1]:
            # A token that would repeat an n-gram once too often is no candidate at all.
            closers = batch.closers().reshape(live, width, 1, -1)
            tokens = result.top_ids.reshape(live, width, per_beam)
            closes = (closers == tokens[..., None]).any(axis=3) & (tokens != eos)
            candidates = np.where(closes, -np.inf, candidates)
        at_limit = length >= batch.per_sentence.limit  # [live]
        top_ids = result.top_ids.reshape(live, width, per_beam)
        if batch.engine.force_eos_at_limit and at_limit.any():
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
            own = batch.sequences[row, batch.sequences.shape[1] - (length[j] - 1) :]
            body = own.tolist() + ([] if token == eos else [int(token)])
            score = float(top_scores[j, rank])
            alignment = batch.alignment_of(row, j, int(length[j]))
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
            next_tokens = np.where(picked, top_token[line, pick], batch.engine.pad_id)
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
            own = batch.sequences[row, batch.sequences.shape[1] - (int(length[j]) - 1) :]
            alignment = batch.alignment_of(row, j, int(length[j]) - 1)
            normalized = score / produced ** penalty[j]
            hypothesis = Hypothesis(own.tolist(), normalized, score, **alignment)
            self.finished[j].append(hypothesis)

        leaving = [
            Finished(batch.sentences[j], self._n_best(batch, j), int(length[j])) for j in ended
        ]
        # Reorder everything that belongs to a beam by the beam it came from; drop the done.
        if len(ended):
            kept = np.flatnonzero(~done)
            rows, tokens = next_rows[kept].reshape(-1), next_tokens[kept].reshape(-1)
        else:  # nobody left: all stay in place
            kept = np.arange(live)
            rows, tokens = next_rows.reshape(-1), next_tokens.reshape(-1)
        self.scores = next_scores
        batch.keep(kept, rows, tokens)
        if batch.sentences:  # feed: the tokens, in the rows' new order
            batch.sequences = np.concatenate([batch.sequences, batch.feed[:, None]], axis=1)
        return leaving

    def _n_best(self, batch: RunningBatch, sentence: int) -> list[Hypothesis]:
        ranked = sorted(self.finished[sentence], key=lambda h: -h.score)
        return ranked[: batch.sentences[sentence].options.n_best]
