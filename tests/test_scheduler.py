"""The dynamic batching scheduler, on the real engine: batches form across requests, results
go back to the right request in order, limits hold, and failures and cancellations stay local."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.runtime.bundle import load_bundle
from service.runtime.engine import EngineOptions
from service.runtime.search import Hypothesis, SearchOptions
from service.runtime.translator import Translator
from service.serving.errors import DeadlineExceeded, QueueFull, ShuttingDown
from service.serving.metrics import Metrics
from service.serving.scheduler import BatchLimits, BatchScheduler, SentenceFailed
from tests.conftest import FRENCH_SENTENCES

SENTENCES = FRENCH_SENTENCES[:8]
FAST = SearchOptions(beam_size=1, max_length=12)


@pytest.fixture(scope="module")
def translator(fr_en_bundle: Path) -> Translator:
    return Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))


class RecordingRunner:
    """The real batch function, remembering the shape of every batch it was given."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        self.batches: list[tuple[int, int, SearchOptions]] = []  # sentences, tokens, options

    def __call__(self, sources: list[list[int]], options: SearchOptions) -> list[list[Hypothesis]]:
        self.batches.append((len(sources), sum(len(s) for s in sources), options))
        return self.translator.translate_ids(sources, options, batch_size=len(sources))


@pytest.fixture
def make_scheduler(
    translator: Translator,
) -> Iterator[Callable[..., tuple[BatchScheduler, RecordingRunner, Metrics]]]:
    made: list[BatchScheduler] = []

    def make(**limits: float) -> tuple[BatchScheduler, RecordingRunner, Metrics]:
        runner, metrics = RecordingRunner(translator), Metrics()
        scheduler = BatchScheduler("fr-en", runner, BatchLimits(**limits), metrics)
        scheduler.start()
        made.append(scheduler)
        return scheduler, runner, metrics

    yield make
    for scheduler in made:
        scheduler.close(timeout=30)


def alone(translator: Translator, sources: list[list[int]], options: SearchOptions) -> list:
    """The reference: every sentence translated on its own, one after the other."""
    return [translator.translate_ids([s], options, batch_size=1)[0] for s in sources]


def tokens_of(hypotheses: list[list[Hypothesis]]) -> list[list[int]]:
    return [h[0].tokens for h in hypotheses]


def later(seconds: float = 60) -> float:
    return time.monotonic() + seconds


def test_concurrent_jobs_share_batches_and_each_gets_its_own_results_in_order(
    translator: Translator, make_scheduler
):
    scheduler, runner, metrics = make_scheduler(max_wait=0.2)
    sources = translator.tokenizer.encode(SENTENCES)
    jobs_sources = [sources[0:1], sources[1:4], sources[4:5], sources[5:8]]

    async def main() -> list[list[list[Hypothesis]]]:
        jobs = [scheduler.submit(s, FAST, later()) for s in jobs_sources]
        return await asyncio.gather(*(job.future for job in jobs))

    results = asyncio.run(main())
    for job_sources, job_results in zip(jobs_sources, results, strict=True):
        assert tokens_of(job_results) == tokens_of(alone(translator, job_sources, FAST))
    assert max(size for size, _, _ in runner.batches) > 1  # requests really shared a batch
    assert sum(size for size, _, _ in runner.batches) == len(SENTENCES)
    batches = metrics.registry.get_sample_value("nmt_batch_sentences_count", {"model": "fr-en"})
    assert batches == len(runner.batches)


def test_the_wait_for_companions_is_skipped_while_traffic_is_sequential(
    translator: Translator, make_scheduler
):
    scheduler, runner, _ = make_scheduler(max_wait=0.5)
    sources = translator.tokenizer.encode(SENTENCES)

    def seconds_for(job_sources: list[list[int]]) -> float:
        async def main() -> None:
            await scheduler.submit(job_sources, FAST, later()).future

        started = time.monotonic()
        asyncio.run(main())
        return time.monotonic() - started

    assert seconds_for(sources[:1]) >= 0.5  # nothing known yet: the first sentence waits
    assert seconds_for(sources[1:2]) < 0.4  # after a lone batch: decoded at once
    assert seconds_for(sources[2:3]) < 0.4
    seconds_for(sources[3:6])  # a shared batch (three sentences arrived together) ...
    assert seconds_for(sources[6:7]) >= 0.5  # ... and the next sentence waits for companions
    assert [size for size, _, _ in runner.batches] == [1, 1, 1, 3, 1]


def test_batches_respect_the_limits_and_never_mix_decoding_settings(
    translator: Translator, make_scheduler
):
    scheduler, runner, _ = make_scheduler(max_sentences=3, max_tokens=30, max_wait=0.2)
    sources = translator.tokenizer.encode(SENTENCES)
    beam = SearchOptions(beam_size=2, max_length=12)

    async def main() -> tuple[list, list]:
        greedy_jobs = [scheduler.submit([s], FAST, later()) for s in sources]
        beam_jobs = [scheduler.submit([s], beam, later()) for s in sources[:4]]
        greedy = await asyncio.gather(*(j.future for j in greedy_jobs))
        beamed = await asyncio.gather(*(j.future for j in beam_jobs))
        return greedy, beamed

    greedy, beamed = asyncio.run(main())
    assert [r[0] for r in greedy] == alone(translator, sources, FAST)
    assert [r[0] for r in beamed] == alone(translator, sources[:4], beam)
    for size, tokens, _ in runner.batches:
        assert size <= 3
        assert tokens <= 30 or size == 1
    assert {options for _, _, options in runner.batches} == {FAST, beam}
    assert sum(size for size, _, o in runner.batches if o == beam) == 4


def test_a_full_queue_refuses_new_work_at_once(translator: Translator, make_scheduler):
    scheduler, _, _ = make_scheduler(max_queued=3, max_wait=1.0, retry_after=7)
    sources = translator.tokenizer.encode(SENTENCES)

    async def main() -> None:
        first = scheduler.submit(sources[:2], FAST, later())
        with pytest.raises(QueueFull, match="limit 3") as refused:
            scheduler.submit(sources[2:4], FAST, later())
        assert refused.value.retry_after == 7
        last = scheduler.submit(sources[2:3], FAST, later())  # exactly fills the queue
        assert scheduler.queued == 3
        await asyncio.gather(first.future, last.future)

    asyncio.run(main())


def test_a_request_larger_than_the_queue_is_admitted_when_the_queue_is_empty(
    translator: Translator, make_scheduler
):
    scheduler, _, _ = make_scheduler(max_queued=2, max_wait=0.0)
    sources = translator.tokenizer.encode(SENTENCES[:5])

    async def main() -> list:
        return await scheduler.submit(sources, FAST, later()).future

    assert tokens_of(asyncio.run(main())) == tokens_of(alone(translator, sources, FAST))


def test_a_cancelled_job_leaves_the_queue(translator: Translator, make_scheduler):
    scheduler, runner, metrics = make_scheduler(max_wait=0.5)
    sources = translator.tokenizer.encode(SENTENCES)

    async def main() -> list:
        gone = scheduler.submit(sources[:3], FAST, later())
        kept = scheduler.submit(sources[3:4], FAST, later())
        scheduler.cancel(gone, "client_gone")
        assert scheduler.queued == 1
        assert gone.future.cancelled()
        return await kept.future

    assert tokens_of(asyncio.run(main())) == tokens_of(alone(translator, sources[3:4], FAST))
    assert sum(size for size, _, _ in runner.batches) == 1  # the cancelled work never ran
    dropped = {"model": "fr-en", "reason": "client_gone"}
    assert metrics.registry.get_sample_value("nmt_dropped_sentences_total", dropped) == 3


def test_a_job_past_its_deadline_is_dropped_before_it_runs(translator: Translator, make_scheduler):
    scheduler, runner, metrics = make_scheduler(max_wait=0.3)
    sources = translator.tokenizer.encode(SENTENCES[:2])

    async def main() -> None:
        job = scheduler.submit(sources, FAST, time.monotonic() + 0.01)
        with pytest.raises(DeadlineExceeded):
            await job.future

    asyncio.run(main())
    assert runner.batches == []
    dropped = {"model": "fr-en", "reason": "deadline"}
    assert metrics.registry.get_sample_value("nmt_dropped_sentences_total", dropped) == 2


def test_an_engine_failure_fails_only_the_job_that_caused_it(
    translator: Translator, make_scheduler
):
    """A source longer than the model's positions makes ONNX Runtime fail. Batched with good
    sentences from other requests, it must not take them down."""
    scheduler, runner, metrics = make_scheduler(max_wait=0.3)
    good = translator.tokenizer.encode(SENTENCES[:3])
    positions = translator.bundle.dims["max_positions"]
    too_long = translator.tokenizer.encode(["un chien noir " * positions])[0][: positions + 50]

    async def main() -> tuple:
        first = scheduler.submit(good[:1], FAST, later())
        culprit = scheduler.submit([good[1], too_long], FAST, later())
        last = scheduler.submit(good[2:3], FAST, later())
        return await asyncio.gather(
            first.future, culprit.future, last.future, return_exceptions=True
        )

    first, culprit, last = asyncio.run(main())
    assert tokens_of(first) == tokens_of(alone(translator, good[:1], FAST))
    assert tokens_of(last) == tokens_of(alone(translator, good[2:3], FAST))
    assert isinstance(culprit, SentenceFailed)
    assert culprit.index == 1
    assert runner.batches[0][0] == 4  # they really were in one batch
    assert metrics.registry.get_sample_value("nmt_batch_failures_total", {"model": "fr-en"}) >= 1


def test_close_finishes_admitted_work_and_then_refuses_more(translator: Translator, make_scheduler):
    scheduler, _, _ = make_scheduler(max_wait=0.5)
    sources = translator.tokenizer.encode(SENTENCES[:4])

    async def main() -> list:
        job = scheduler.submit(sources, FAST, later())
        await asyncio.to_thread(scheduler.close, 30)
        with pytest.raises(ShuttingDown):
            scheduler.submit(sources, FAST, later())
        return await job.future

    assert tokens_of(asyncio.run(main())) == tokens_of(alone(translator, sources, FAST))
