"""Continuous batching on the real engine, with both cache layouts: whatever step the others
are at when a sentence joins, and whatever settings they were asked with, every sentence comes
out as it does when decoded alone (fp32: int8's dynamic quantization scales activations per
batch, so its outputs depend on the batch at any batching)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import numpy as np
import pytest

from service.runtime.bundle import load_bundle
from service.runtime.engine import Engine, EngineOptions
from service.runtime.running_batch import Sentence, pad_sources, running_batch, step_together
from service.runtime.search import SearchOptions, search
from service.runtime.translator import Translator
from service.serving.continuous import ContinuousScheduler
from service.serving.scheduler import BatchLimits, SentenceFailed
from tests.conftest import FRENCH_SENTENCES

MIXED = [
    SearchOptions(),
    SearchOptions(max_length=6),
    SearchOptions(length_penalty=0.6, max_repeats=3),
    SearchOptions(beam_size=3),
    SearchOptions(beam_size=3, n_best=2, length_penalty=1.3),
    SearchOptions(beam_size=3, max_length=5, alignment=True),
]


@pytest.fixture(scope="module", params=[True, False], ids=["in-place", "concatenating"])
def translator(fr_en_bundle: Path, request: pytest.FixtureRequest) -> Translator:
    """Both cache layouts: written in place (the bundle's decoder_in_place graph, the
    default) and concatenated at every step (the shortlist's and older bundles' decoder)."""
    options = EngineOptions(intra_op_threads=1, in_place=request.param)
    translator = Translator(load_bundle(fr_en_bundle), options)
    assert translator.engine.in_place == request.param
    return translator


def scheduler_for(translator: Translator, together: bool = True, **limits) -> ContinuousScheduler:
    """As the service makes it; `together`: small batches of different beam sizes step
    together (the service's way), else always apart."""
    return ContinuousScheduler(
        "fr-en",
        lambda beams: running_batch(translator.engine, beams),
        BatchLimits(**limits),
        step_together=step_together if together else None,
    )


def alone(translator: Translator, source: list[int], options: SearchOptions) -> list:
    return search(translator.engine, [source], options)[0]


def same(found: list, expected: list) -> bool:
    """Same n-best tokens; scores and alignments equal up to float rounding."""
    if [h.tokens for h in found] != [h.tokens for h in expected]:
        return False
    for a, b in zip(found, expected, strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-4)
        if b.alignment is not None:
            assert a.alignment.shape == b.alignment.shape
            assert abs(a.alignment - b.alignment).max() < 1e-4
    return True


@pytest.mark.parametrize("together", [True, False], ids=["beam-sizes-together", "apart"])
@pytest.mark.parametrize("ahead", [False, True], ids=["encoded-at-join", "one-encoded-ahead"])
def test_sentences_joining_at_steps_5_10_and_20_decode_as_they_do_alone(
    translator: Translator, ahead: bool, together: bool
):
    """With `ahead`, one sentence of each arriving pair is encoded ahead (alone, as the
    encoder thread does), the other when it joins: both are merged into one join. With
    `together`, the greedy and the beam batch (at most 16 rows in all) take their steps in
    one engine call."""
    sources = translator.tokenizer.encode(FRENCH_SENTENCES)
    # turn -> sentences. Apart, a turn steps one batch; together, all of them: sooner done.
    steps = [0, 4, 8, 12] if together else [0, 5, 10, 20]
    arrivals = dict(zip(steps, ([0, 1], [2, 3], [4, 5], [6, 7]), strict=True))

    running_when_joined = []

    async def main() -> dict:
        scheduler = scheduler_for(translator, together)
        jobs = {}
        later = time.monotonic() + 600
        for turn in range(200):
            if turn in arrivals:
                running_when_joined.append(scheduler.running)
            for index in arrivals.get(turn, []):
                options = MIXED[index % len(MIXED)]
                jobs[index] = scheduler.submit([sources[index]], options, later)
            if ahead:
                scheduler.encode_once()
            if not scheduler.work_once() and turn > max(arrivals):
                break
        await asyncio.sleep(0)
        return {index: job.future.result()[0] for index, job in jobs.items()}

    found = asyncio.run(main())
    assert running_when_joined[0] == 0 and min(running_when_joined[1:]) > 0
    for index, hypotheses in found.items():
        assert same(hypotheses, alone(translator, sources[index], MIXED[index % len(MIXED)]))


@pytest.mark.parametrize("beam_size", [1, 2])
def test_a_join_after_the_oldest_sentence_left_keeps_alignments_and_tokens(
    translator: Translator, beam_size: int
):
    """The first sentence (short) leaves while one that joined later (long) runs on: the
    tokens and alignments nobody needs any more are cut; then another sentence joins. All
    three, alignment asked for, come out as alone."""
    texts = [
        "Un chat.",
        "Un homme en chemise bleue marche dans la rue avec son chien noir.",
        "Le chien court.",
    ]
    short, long, late = translator.tokenizer.encode(texts)
    options = SearchOptions(beam_size=beam_size, alignment=True)
    batch = running_batch(translator.engine, beam_size)
    found = {}
    batch.join([Sentence(short, options, ticket="short")])
    batch.step()
    batch.step()
    batch.join([Sentence(long, options, ticket="long")])
    while "short" not in found:
        found |= {f.sentence.ticket: f.hypotheses for f in batch.step()}
    assert len(batch) == 1  # the long one runs on, alone
    batch.step()
    batch.join([Sentence(late, options, ticket="late")])
    while len(batch):
        found |= {f.sentence.ticket: f.hypotheses for f in batch.step()}
    for ticket, source in (("short", short), ("long", long), ("late", late)):
        assert same(found[ticket], alone(translator, source, options)), ticket


def test_batches_of_two_beam_sizes_stepped_together_decode_as_they_do_alone(
    translator: Translator,
):
    """step_together: a greedy and a beam-3 batch take every step in one engine call while
    sentences join either at different steps (caches of different lengths, sources of
    different widths) and leave; every sentence comes out as it does alone, scores and
    alignments included."""
    sources = translator.tokenizer.encode(FRENCH_SENTENCES)
    engine = translator.engine
    greedy, beam = running_batch(engine, 1), running_batch(engine, 3)
    greedy_options = [SearchOptions(), SearchOptions(length_penalty=0.6, alignment=True)]
    beam_options = [SearchOptions(beam_size=3, n_best=2), SearchOptions(beam_size=3)]
    # step -> (batch, sentence indices)
    joins = {0: [(greedy, [0, 1])], 2: [(beam, [2])], 4: [(greedy, [3]), (beam, [4, 5])]}
    joins |= {7: [(greedy, [6, 7])], 9: [(beam, [8])]}
    options_of = {}
    found, steps_together = {}, 0
    for step in range(200):
        for batch, indices in joins.get(step, []):
            choices = greedy_options if batch is greedy else beam_options
            sentences = []
            for i in indices:
                options_of[i] = choices[i % 2]
                sentences.append(Sentence(sources[i], options_of[i], ticket=i))
            batch.join(sentences)
        if not (len(greedy) or len(beam)) and step > max(joins):
            break
        steps_together += bool(len(greedy) and len(beam))
        for ended in step_together([greedy, beam]):
            for finished in ended:
                found[finished.sentence.ticket] = finished.hypotheses
    assert steps_together >= 10 and sorted(found) == sorted(options_of)
    for index, hypotheses in found.items():
        assert same(hypotheses, alone(translator, sources[index], options_of[index]))


@pytest.mark.parametrize("ahead", [False, True], ids=["encoded-at-join", "encoded-ahead"])
def test_a_sentence_the_engine_fails_on_fails_only_its_own_request(
    translator: Translator, ahead: bool
):
    """A source longer than the model's positions makes ONNX Runtime fail when it is encoded:
    when it joins, or ahead (the failure is kept until its join)."""
    good = translator.tokenizer.encode(FRENCH_SENTENCES[:3])
    positions = translator.bundle.dims["max_positions"]
    too_long = translator.tokenizer.encode(["un chien noir " * positions])[0][: positions + 50]
    options = SearchOptions()

    async def main() -> tuple:
        scheduler = scheduler_for(translator)
        later = time.monotonic() + 600
        first = scheduler.submit(good[:1], options, later)
        scheduler.work_once()  # first is running when the culprit joins
        culprit = scheduler.submit([good[1], too_long], options, later)
        last = scheduler.submit(good[2:3], options, later)
        while ahead and scheduler.encode_once():
            pass
        while scheduler.work_once():
            pass
        await asyncio.sleep(0)
        return first.future.result(), culprit.future.exception(), last.future.result()

    first, culprit, last = asyncio.run(main())
    assert same(first[0], alone(translator, good[0], options))
    assert same(last[0], alone(translator, good[2], options))
    assert isinstance(culprit, SentenceFailed) and culprit.index == 1


@pytest.mark.slow
def test_test_2016_as_concurrent_requests_with_random_arrivals_and_mixed_options(
    translator: Translator, multi30k: Path
):
    """All of test_2016_flickr, one request of 1 to 3 sentences every few milliseconds with
    random settings, through the scheduler's own worker thread: each sentence as alone."""
    lines = (multi30k / "test_2016_flickr.fr").read_text(encoding="utf-8").splitlines()
    sources = translator.tokenizer.encode(lines)
    rng = random.Random(2016)
    requests, start = [], 0
    while start < len(sources):
        count = rng.randint(1, 3)
        requests.append((list(range(start, start + count)), rng.choice(MIXED)))
        start += count
    requests = [(indices, options) for indices, options in requests if indices[0] < len(sources)]

    async def main() -> list:
        scheduler = scheduler_for(translator, max_sentences=32)
        scheduler.start()
        later = time.monotonic() + 3600
        jobs = []
        try:
            for indices, options in requests:
                batch = [sources[i] for i in indices if i < len(sources)]
                jobs.append(scheduler.submit(batch, options, later))
                await asyncio.sleep(rng.expovariate(1 / 0.004))
            return await asyncio.gather(*(job.future for job in jobs))
        finally:
            await asyncio.to_thread(scheduler.close, 60)

    results = asyncio.run(main())
    differ = []
    for (indices, options), found in zip(requests, results, strict=True):
        for index, hypotheses in zip(indices, found, strict=False):
            if not same(hypotheses, alone(translator, sources[index], options)):
                differ.append(index)
    assert differ == []


@pytest.mark.parametrize("threads", [1, 2])
def test_encoding_ahead_runs_on_one_thread_and_encodes_the_same(
    translator: Translator, fr_en_bundle: Path, threads: int
):
    """The encoder thread's session has one intra-op thread (the encoder's own when the
    engine has one; a second session otherwise), and its keys/values are the same."""
    engine = Engine(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=threads))
    ids, mask = pad_sources(translator.tokenizer.encode(FRENCH_SENTENCES[:3]), engine.pad_id)
    here, ahead = engine.start(ids, mask), engine.start(ids, mask, ahead=True)
    session = engine._ahead_session()
    assert session.get_session_options().intra_op_num_threads == 1
    assert (session is engine.encoder) == (threads == 1)
    for a, b in zip(here.cross, ahead.cross, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
