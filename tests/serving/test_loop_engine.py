"""The decoding loop on the real engine: whatever step the others are at when a sentence
joins, and whatever settings they were asked with, every sentence comes out as it does when
decoded alone (fp32: int8's dynamic quantization scales activations per batch, so its outputs
depend on the batch at any batching)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import pytest

from service.runtime.bundle import load_bundle
from service.runtime.running_batch import running_batch, step_together
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from service.serving.loop import BatchLimits, DecodingLoop, SentenceFailed
from tests.conftest import FRENCH_SENTENCES
from tests.runtime.test_running_batch import MIXED, alone, same


@pytest.fixture(scope="module")
def translator(fr_en_bundle: Path) -> Translator:
    return Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))


def scheduler_for(
    translator: Translator, together: bool = True, workers: int = 1, observer=None, **limits
) -> DecodingLoop:
    """As the service makes it; `together`: small batches of different beam sizes step
    together (the service's way), else always apart."""
    return DecodingLoop(
        ("fr-en", ""),
        lambda beams: running_batch(translator.engine, beams),
        BatchLimits(**limits),
        observer=observer,
        encode_ahead=False,
        step_together=step_together if together else None,
        workers=workers,
    )


class StepThreads:
    """A BatchObserver that notes which threads took decoder steps, and how many sentences
    each step held."""

    def __init__(self) -> None:
        self.steps: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def observe_step(self, model, sentences, rows, output_tokens, seconds):
        with self._lock:
            self.steps.setdefault(threading.current_thread().name, []).append(sentences)

    def __getattr__(self, name: str):  # every other report: nothing to note
        return lambda *args, **kwargs: None


def test_two_workers_share_the_queue_and_every_sentence_decodes_as_alone(translator: Translator):
    """Two decoding threads on one engine: requests of 1 to 3 sentences with mixed settings,
    sent a few at a time, are taken by both workers (each from the one queue), and every
    sentence comes out as it does alone."""
    sources = translator.tokenizer.encode(FRENCH_SENTENCES)
    rng = random.Random(2)
    requests = [
        ([rng.randrange(len(sources)) for _ in range(rng.randint(1, 3))], rng.choice(MIXED))
        for _ in range(24)
    ]
    observer = StepThreads()
    scheduler = scheduler_for(translator, workers=2, observer=observer, max_sentences=4)

    async def main() -> list:
        scheduler.start()
        later = time.monotonic() + 600
        try:
            jobs = []
            for indices, options in requests:
                jobs.append(scheduler.submit([sources[i] for i in indices], options, later))
                await asyncio.sleep(rng.expovariate(1 / 0.002))
            return await asyncio.gather(*(job.future for job in jobs))
        finally:
            await asyncio.to_thread(scheduler.close, 60)

    results = asyncio.run(main())
    assert not scheduler.alive
    for (indices, options), found in zip(requests, results, strict=True):
        for index, hypotheses in zip(indices, found, strict=True):
            assert same(hypotheses, alone(translator, sources[index], options))
    assert set(observer.steps) == {"nmt-batch-fr-en", "nmt-batch-fr-en-1"}


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


def test_a_request_larger_than_a_batch_is_shared_by_idle_workers(translator: Translator):
    """One request of 8 sentences, batches of at most 4: the worker that takes the first four
    wakes the idle one for the rest, and both decode at once."""
    sources = translator.tokenizer.encode(FRENCH_SENTENCES[:8])
    options = SearchOptions()
    observer = StepThreads()
    scheduler = scheduler_for(translator, workers=2, observer=observer, max_sentences=4)

    async def main() -> list:
        scheduler.start()
        try:
            job = scheduler.submit(sources, options, time.monotonic() + 600)
            return await job.future
        finally:
            await asyncio.to_thread(scheduler.close, 60)

    found = asyncio.run(main())
    for source, hypotheses in zip(sources, found, strict=True):
        assert same(hypotheses, alone(translator, source, options))
    assert set(observer.steps) == {"nmt-batch-fr-en", "nmt-batch-fr-en-1"}
    assert max(max(sizes) for sizes in observer.steps.values()) == 4
