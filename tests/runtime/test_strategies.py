"""The repetition guard (issue 9, defect 10): a hypothesis stops before it repeats an n-gram more
than `max_repeats` times in a row. Checked against a brute-force definition, and on a fake
engine that loops for ever, so that no model is needed."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from service.runtime.engine import StepResult
from service.runtime.kv_cache import KVCache
from service.runtime.running_batch import PADDING, running_batch
from service.runtime.search import Finished, SearchOptions, Sentence
from service.runtime.strategies import MAX_REPEAT_NGRAM, repeat_closers
from service.runtime.translator import search

EOS, START, PAD = 2, 1, 0


def longest_run(tokens: list[int], n: int) -> int:
    """The most times one n-gram occurs back to back anywhere in tokens (brute force)."""
    best = 0
    for start in range(len(tokens) - n + 1):
        gram, count = tokens[start : start + n], 1
        while tokens[start + count * n : start + (count + 1) * n] == gram:
            count += 1
        best = max(best, count)
    return best


def ends_with_too_many(tokens: list[int], max_repeats: int) -> bool:
    """Do the tokens end in more than max_repeats copies of one n-gram (n <= 4)?"""
    for n in range(1, MAX_REPEAT_NGRAM + 1):
        span = n * (max_repeats + 1)
        tail = tokens[-span:]
        if len(tail) == span and all(tail[i] == tail[i % n] for i in range(span)):
            return True
    return False


@pytest.mark.parametrize("max_repeats", [1, 2, 3])
def test_repeat_closers_name_exactly_the_tokens_that_complete_a_repeat(max_repeats: int):
    rng = random.Random(max_repeats)
    rows = [[rng.choice([5, 6, 7]) for _ in range(rng.randint(0, 14))] for _ in range(400)]
    rows += [[5, 6] * 6, [5] * 9, [5, 6, 7] * 4, [5, 6, 7, 8] * 4]
    for row in rows:
        found = repeat_closers(np.array([row], dtype=np.int64).reshape(1, -1), max_repeats)
        closers = [] if found is None else found[0]  # None: no token closes a repeat
        for token in (5, 6, 7, 8):
            expected = ends_with_too_many([*row, token], max_repeats) and not ends_with_too_many(
                row, max_repeats
            )
            if ends_with_too_many(row, max_repeats):
                continue  # a row the guard would already have stopped
            assert (token in closers) == expected, (row, token)


@pytest.mark.parametrize("max_repeats", [1, 2, 3])
def test_repeat_closers_of_rows_together_are_each_rows_own(max_repeats: int):
    # Rows of one width, as a running batch holds them (PADDING in front of a row that joined
    # later): each row's closers are what the brute-force rule says of its own tokens.
    rng = random.Random(10 + max_repeats)
    for _ in range(1000):
        width, count = rng.randint(0, 20), rng.randint(1, 6)
        rows = [periodic_or_not(rng, width) for _ in range(count)]
        joined_late = rng.randint(0, width)
        rows[0][:joined_late] = [PADDING] * joined_late
        found = repeat_closers(np.array(rows, dtype=np.int64).reshape(count, width), max_repeats)
        for i, row in enumerate(rows):
            own = [token for token in row if token != PADDING]
            if ends_with_too_many(own, max_repeats):
                continue  # a row the guard would already have stopped
            closers = [] if found is None else found[i].tolist()
            for token in (5, 6, 7, 8):
                expected = ends_with_too_many([*own, token], max_repeats)
                assert (token in closers) == expected, (rows, i, token)


def periodic_or_not(rng: random.Random, width: int) -> list[int]:
    """`width` tokens: random, or (half the time) ending in copies of a random n-gram."""
    tokens = [rng.choice([5, 6, 7, 8]) for _ in range(width)]
    if rng.random() < 0.5:
        gram = rng.sample([5, 6, 7, 8], rng.randint(1, MAX_REPEAT_NGRAM))
        tail = (gram * width)[: rng.randint(0, width)]
        tokens[width - len(tail) :] = tail
    return tokens


class LoopingEngine:
    """A fake engine whose best continuation loops for ever: start -> 5 -> 6 -> 5 -> 6 ...
    Its second choice is always 7 (or `second`), and every token outside the loop leads to
    </s>. Only the interface that search uses."""

    def __init__(self, second: int = 7) -> None:
        self.second = second

    eos_id, pad_id, start_id, max_positions = EOS, PAD, START, 512
    layers, heads, force_eos_at_limit = 1, 1, False
    vocab = 10

    def start(
        self,
        source_ids: np.ndarray,
        source_mask: np.ndarray,
        rows_per_source: int = 1,
        ahead: bool = False,  # Engine.start's: which encoder session (none here)
    ) -> KVCache:
        rows = len(source_ids) * rows_per_source  # no attention: empty keys and values
        empty = np.zeros((rows, 1, 0, 1), dtype=np.float32)
        positions = np.zeros(rows, dtype=np.int64)
        return KVCache(cross=[], source_mask=source_mask, past=[empty, empty], positions=positions)

    def keep_spare(self, cache: KVCache) -> None:  # (Engine's: nothing to reuse here)
        pass

    def reuse_spare(self, cache: KVCache) -> None:
        pass

    def step(self, state, tokens: np.ndarray, top_k: int, **_: bool):
        # What every step does to the cache: one more position per row.
        state.positions = state.positions + 1
        ranked = []
        for fed in tokens.tolist():
            best = {START: 5, 5: 6, 6: 5}.get(fed, EOS)
            others = [t for t in (self.second, EOS, 7, 8, 9, 3, 4) if t != best]
            others = list(dict.fromkeys(others))
            ranked.append([best, *others][:top_k])
        ids = np.array(ranked, dtype=np.int64)
        log_probs = np.tile(-np.arange(1, top_k + 1, dtype=np.float32) * 0.5, (len(tokens), 1))
        log_probs[:, 0] = -0.01
        return StepResult(log_probs, ids)


def cycle(length: int) -> list[int]:
    return list(itertools.islice(itertools.cycle([5, 6]), length))


@pytest.mark.parametrize("max_repeats", [2, 3])
def test_greedy_takes_its_second_choice_instead_of_repeating_once_too_often(max_repeats: int):
    found = search(LoopingEngine(), [[4] * 40 + [EOS]], SearchOptions(max_repeats=max_repeats))
    tokens = found[0][0].tokens
    assert tokens[-1] == 7  # left the loop by its second choice, then ended
    loop = tokens[:-1]
    assert loop == cycle(len(loop))  # the model's own tokens up to there ...
    assert ends_with_too_many(cycle(len(loop) + 1), max_repeats)  # ... just before one too many


def test_greedy_ends_before_the_loop_when_its_second_choice_loops_too():
    engine = LoopingEngine(second=6)  # after 5 the second choice (6) is the loop's token too
    found = search(engine, [[4] * 40 + [EOS]], SearchOptions(max_repeats=2))
    tokens = found[0][0].tokens
    for n in range(1, MAX_REPEAT_NGRAM + 1):
        assert longest_run(tokens, n) <= 2, tokens


@pytest.mark.parametrize("beam_size", [2, 3])
@pytest.mark.parametrize("max_repeats", [2, 3])
def test_no_beam_hypothesis_repeats_an_ngram_once_too_often(beam_size: int, max_repeats: int):
    sources = [[4] * 40 + [EOS], [4] * 30 + [EOS]]  # long sources: a length limit far away
    options = SearchOptions(beam_size=beam_size, n_best=beam_size, max_repeats=max_repeats)
    for hypotheses in search(LoopingEngine(), sources, options):
        assert len(hypotheses) == beam_size
        for hypothesis in hypotheses:
            for n in range(1, MAX_REPEAT_NGRAM + 1):
                assert longest_run(hypothesis.tokens, n) <= max_repeats, hypothesis.tokens


def test_without_the_guard_the_loop_runs_to_the_length_limit():
    found = search(LoopingEngine(), [[4] * 20 + [EOS]], SearchOptions(max_length=40))
    assert len(found[0][0].tokens) == 40


class RandomEngine(LoopingEngine):
    """Random top-k over a vocabulary of four tokens: loops everywhere, the corner cases of
    the guard (every way on repeats something) come often."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def step(self, state, tokens: np.ndarray, top_k: int, **_: bool):
        vocab = np.array([3, 4, 5, EOS])
        ids = np.stack([self.rng.permutation(vocab)[:top_k] for _ in tokens])
        log_probs = np.sort(self.rng.uniform(-6, -0.01, (len(tokens), top_k)), axis=1)[:, ::-1]
        log_probs[ids == EOS] -= 4.0  # </s> rarely wins: long outputs, many repeats
        order = np.argsort(-log_probs, axis=1, kind="stable")
        return StepResult(
            np.take_along_axis(log_probs, order, 1).astype(np.float32),
            np.take_along_axis(ids, order, 1),
        )


@pytest.mark.parametrize("seed", range(30))
def test_every_sentence_gets_its_hypotheses_whatever_the_model_does(seed: int):
    rng = random.Random(seed)
    beam = rng.choice([1, 2, 3])
    options = SearchOptions(
        beam_size=beam, n_best=beam, max_repeats=rng.choice([1, 2, 3]), max_length=30
    )
    sources = [[4] * rng.randint(3, 20) + [EOS] for _ in range(rng.randint(1, 6))]
    found = search(RandomEngine(seed), sources, options)
    assert len(found) == len(sources)
    for hypotheses in found:
        assert hypotheses, "a sentence without a hypothesis"
        for hypothesis in hypotheses:
            for n in range(1, MAX_REPEAT_NGRAM + 1):
                assert longest_run(hypothesis.tokens, n) <= options.max_repeats


@pytest.mark.parametrize("beam", [1, 3])
def test_a_sentence_that_joins_later_stops_at_its_own_length_limit(beam: int):
    """The batch counts its steps once for every sentence (its clock); a sentence's own count
    starts at the step it joined, so each stops at its own limit, not the batch's."""
    batch = running_batch(LoopingEngine(), beam)
    source = [4] * 20 + [EOS]
    ended: dict[str, Finished] = {}

    def step() -> None:
        for finished in batch.step():
            ended[finished.sentence.ticket] = finished

    batch.join([Sentence(source, SearchOptions(beam_size=beam, max_length=9), ticket="first")])
    for _ in range(3):
        step()
    batch.join([Sentence(source, SearchOptions(beam_size=beam, max_length=4), ticket="later")])
    while len(batch):
        step()
    steps = {ticket: finished.steps for ticket, finished in ended.items()}
    tokens = {ticket: f.hypotheses[0].tokens for ticket, f in ended.items()}
    if beam == 1:  # greedy never takes the </s> the loop avoids: each runs to its limit
        assert steps == {"first": 9, "later": 4}
        assert tokens == {"first": cycle(9), "later": cycle(4)}
    else:  # a beam may finish a hypothesis earlier, never run past its limit
        assert steps["first"] <= 9 and steps["later"] <= 4
        assert len(tokens["first"]) <= 9 and len(tokens["later"]) <= 4
        assert PADDING not in tokens["later"]  # only its own steps' tokens
