"""The dynamic batching scheduler with no model at all: a fake batch runner and made-up times.

`BatchQueue` (the policy) is driven with explicit times; `BatchScheduler` (the worker thread)
with a fake runner whose batches the test controls with gates, and a fake clock. No torch, no
sleeps, no timing thresholds. tests/test_scheduler_engine.py keeps a few on the real engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from nmt_contract import Hypothesis
from service.runtime.search import SearchOptions
from service.serving.errors import DeadlineExceeded, QueueFull, ShuttingDown
from service.serving.metrics import Metrics
from service.serving.scheduler import (
    BatchLimits,
    BatchQueue,
    BatchScheduler,
    Job,
    SentenceFailed,
)

GREEDY = SearchOptions(beam_size=1, max_length=12)
BEAM = SearchOptions(beam_size=2, max_length=12)
POISON = -1  # a token the fake runner fails on, as an engine fails on a bad input
FAR = 1e9  # a deadline that never comes


def sentence(n: int, length: int = 3) -> list[int]:
    """A made-up source: `length` tokens, all equal to n, then </s> (2)."""
    return [n] * length + [2]


def answer(source: list[int]) -> list[Hypothesis]:
    """What the fake model translates a source to: its tokens reversed, without </s>."""
    return [Hypothesis(tokens=source[-2::-1], score=-float(len(source)), log_prob=-1.0)]


class FakeRunner:
    """Translates by `answer`, records every batch, fails a batch holding POISON, and can hold
    the worker inside a batch until the test opens its gate. After the gate it asks
    `abandoned()` once, as the engine does between steps, and gives [] for those sources."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[list[int]], SearchOptions]] = []
        self.entered = threading.Semaphore(0)  # released each time a batch starts
        self.gate = threading.Event()
        self.gate.set()

    def __call__(
        self, sources: list[list[int]], options: SearchOptions, abandoned: Callable[[], list]
    ) -> list[list[Hypothesis]]:
        self.batches.append((sources, options))
        self.entered.release()
        assert self.gate.wait(30), "the test never opened the gate"
        if any(POISON in source for source in sources):
            raise RuntimeError("the engine failed on this input")
        gone = abandoned()
        return [[] if gone[i] else answer(source) for i, source in enumerate(sources)]

    @property
    def sizes(self) -> list[int]:
        return [len(sources) for sources, _ in self.batches]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_scheduler() -> Iterator[Callable[..., tuple[BatchScheduler, FakeRunner, Metrics]]]:
    made: list[tuple[BatchScheduler, FakeRunner]] = []

    def make(clock: Callable[[], float] | None = None, **limits: float):
        runner, metrics = FakeRunner(), Metrics()
        extra = {"clock": clock} if clock else {}
        scheduler = BatchScheduler("fr-en", runner, BatchLimits(**limits), metrics, **extra)
        scheduler.start()
        made.append((scheduler, runner))
        return scheduler, runner, metrics

    yield make
    for scheduler, runner in made:
        runner.gate.set()
        scheduler.close(timeout=30)


# The policy: BatchQueue with explicit times.


def queued_job(queue: BatchQueue, sources: list[list[int]], now: float, **kw) -> Job:
    job = Job(sources, kw.get("options", GREEDY), kw.get("deadline", FAR), LOOP, now)
    queue.add(job, now)
    return job


LOOP = asyncio.new_event_loop()  # jobs need a loop for their futures; none runs here


def test_a_batch_takes_the_oldest_sentences_within_the_sentence_and_token_limits():
    queue = BatchQueue("m", BatchLimits(max_sentences=3, max_tokens=12, max_wait=0.0))
    first = queued_job(queue, [sentence(1), sentence(2)], now=0.0)
    second = queued_job(queue, [sentence(3), sentence(4, length=9)], now=0.0)
    batch, _ = queue.next_batch(now=0.0)
    # 3 sentences of 4 tokens = 12: the limit; the fourth would pass it.
    assert [(item.job, item.index) for item in batch] == [(first, 0), (first, 1), (second, 0)]
    batch, _ = queue.next_batch(now=0.0)
    assert [(item.job, item.index) for item in batch] == [(second, 1)]  # alone: 10 tokens


def test_a_sentence_longer_than_the_token_limit_still_gets_a_batch_of_its_own():
    queue = BatchQueue("m", BatchLimits(max_tokens=4, max_wait=0.0))
    job = queued_job(queue, [sentence(1, length=20)], now=0.0)
    batch, _ = queue.next_batch(now=0.0)
    assert [item.job for item in batch] == [job]


def test_a_batch_never_mixes_decoding_settings():
    queue = BatchQueue("m", BatchLimits(max_wait=0.0))
    greedy = queued_job(queue, [sentence(1)], now=0.0)
    beam = queued_job(queue, [sentence(2)], now=0.0, options=BEAM)
    greedy_too = queued_job(queue, [sentence(3)], now=0.0)
    batch, _ = queue.next_batch(now=0.0)
    assert [item.job for item in batch] == [greedy, greedy_too]
    batch, _ = queue.next_batch(now=0.0)
    assert [item.job for item in batch] == [beam]


def test_the_oldest_sentence_waits_at_most_max_wait_for_companions():
    queue = BatchQueue("m", BatchLimits(max_sentences=4, max_wait=0.5))
    queued_job(queue, [sentence(1), sentence(2)], now=10.0)
    assert queue.next_batch(now=10.0) == ([], 0.5)
    assert queue.next_batch(now=10.2)[1] == pytest.approx(0.3)
    queued_job(queue, [sentence(3)], now=10.3)
    batch, _ = queue.next_batch(now=10.5)  # the oldest one's wait is over
    assert len(batch) == 3


def test_a_full_batch_goes_at_once_without_waiting():
    queue = BatchQueue("m", BatchLimits(max_sentences=2, max_wait=60.0))
    queued_job(queue, [sentence(1), sentence(2), sentence(3)], now=0.0)
    batch, _ = queue.next_batch(now=0.0)
    assert len(batch) == 2
    assert queue.next_batch(now=0.0) == ([], 60.0)  # the third still waits for companions


def test_the_wait_is_skipped_while_traffic_is_sequential_and_resumes_after_a_shared_batch():
    queue = BatchQueue("m", BatchLimits(max_wait=0.5))
    queued_job(queue, [sentence(1)], now=0.0)
    assert queue.next_batch(now=0.0) == ([], 0.5)  # nothing known yet: the first one waits
    assert len(queue.next_batch(now=0.5)[0]) == 1  # a lone batch ...
    queued_job(queue, [sentence(2)], now=1.0)
    assert len(queue.next_batch(now=1.0)[0]) == 1  # ... so the next one goes at once
    queued_job(queue, [sentence(3), sentence(4)], now=2.0)
    assert len(queue.next_batch(now=2.0)[0]) == 2  # still no wait; a shared batch ...
    queued_job(queue, [sentence(5)], now=3.0)
    assert queue.next_batch(now=3.0) == ([], 0.5)  # ... and the next one waits again


def test_a_closing_queue_hands_out_batches_without_waiting():
    queue = BatchQueue("m", BatchLimits(max_wait=60.0))
    queued_job(queue, [sentence(1)], now=0.0)
    assert len(queue.next_batch(now=0.0, closing=True)[0]) == 1


def test_a_full_queue_refuses_a_job_and_a_job_larger_than_the_queue_needs_it_empty():
    queue = BatchQueue("m", BatchLimits(max_queued=3, retry_after=7))
    queued_job(queue, [sentence(1), sentence(2)], now=0.0)
    with pytest.raises(QueueFull, match="limit 3") as refused:
        queued_job(queue, [sentence(3), sentence(4)], now=0.0)
    assert refused.value.retry_after == 7
    queued_job(queue, [sentence(3)], now=0.0)  # exactly fills the queue
    assert len(queue) == 3
    empty = BatchQueue("m", BatchLimits(max_queued=2))
    queued_job(empty, [sentence(n) for n in range(5)], now=0.0)
    assert len(empty) == 5


def test_expired_jobs_are_found_and_removed_whole():
    queue = BatchQueue("m", BatchLimits())
    late = queued_job(queue, [sentence(1), sentence(2)], now=0.0, deadline=5.0)
    on_time = queued_job(queue, [sentence(3)], now=0.0, deadline=50.0)
    assert queue.expired_jobs(now=4.9) == []
    assert queue.expired_jobs(now=5.0) == [(late, False)]
    # A job that cannot finish in the time it has left is found before its deadline.
    too_short = queue.expired_jobs(now=4.0, hopeless=lambda item: item.job.deadline - 4.0 < 2)
    assert too_short == [(late, True)]
    assert queue.remove(late) == 2
    assert [item.job for item in queue.items] == [on_time]


# The worker: BatchScheduler on a thread with the fake runner.


def test_concurrent_jobs_share_a_batch_and_each_gets_its_own_results_in_order(make_scheduler):
    scheduler, runner, metrics = make_scheduler(max_sentences=8, max_wait=60.0)
    jobs_sources = [[sentence(1)], [sentence(2), sentence(3), sentence(4)], [sentence(5)]]
    jobs_sources.append([sentence(n) for n in (6, 7, 8)])

    async def main() -> list:
        jobs = [scheduler.submit(sources, GREEDY, FAR) for sources in jobs_sources]
        return await asyncio.gather(*(job.future for job in jobs))

    results = asyncio.run(main())
    for sources, result in zip(jobs_sources, results, strict=True):
        assert result == [answer(source) for source in sources]
    assert runner.sizes == [8]  # the batch filled up, and went without waiting 60 s
    batches = metrics.registry.get_sample_value("nmt_batch_sentences_count", {"model": "fr-en"})
    assert batches == 1


def test_a_failing_sentence_fails_only_its_own_job(make_scheduler):
    """Batched with sentences of other requests, a sentence the engine fails on is found by
    retrying the batch one by one: the others are answered, its job fails with its index."""
    scheduler, runner, metrics = make_scheduler(max_sentences=4, max_wait=60.0)

    async def main() -> tuple:
        first = scheduler.submit([sentence(1)], GREEDY, FAR)
        culprit = scheduler.submit([sentence(2), [POISON, 2]], GREEDY, FAR)
        last = scheduler.submit([sentence(3)], GREEDY, FAR)
        return await asyncio.gather(
            first.future, culprit.future, last.future, return_exceptions=True
        )

    first, culprit, last = asyncio.run(main())
    assert first == [answer(sentence(1))] and last == [answer(sentence(3))]
    assert isinstance(culprit, SentenceFailed) and culprit.index == 1
    assert runner.sizes[0] == 4  # they really were in one batch
    assert metrics.registry.get_sample_value("nmt_batch_failures_total", {"model": "fr-en"}) == 1


def test_a_cancelled_job_leaves_the_queue_and_never_runs(make_scheduler):
    scheduler, runner, metrics = make_scheduler(max_wait=0.0)
    runner.gate.clear()  # the worker will be held inside the first batch

    async def main() -> list:
        busy = scheduler.submit([sentence(1)], GREEDY, FAR)
        assert await asyncio.to_thread(runner.entered.acquire, True, 30)
        gone = scheduler.submit([sentence(2), sentence(3), sentence(4)], GREEDY, FAR)
        kept = scheduler.submit([sentence(5)], GREEDY, FAR)
        scheduler.cancel(gone, "client_gone")
        assert scheduler.queued == 1 and gone.future.cancelled()
        runner.gate.set()
        await busy.future
        return await kept.future

    assert asyncio.run(main()) == [answer(sentence(5))]
    assert [s for sources, _ in runner.batches for s in sources] == [sentence(1), sentence(5)]
    dropped = {"model": "fr-en", "reason": "client_gone"}
    assert metrics.registry.get_sample_value("nmt_dropped_sentences_total", dropped) == 3


def test_a_job_past_its_deadline_is_dropped_before_it_runs(make_scheduler):
    clock = FakeClock()
    scheduler, runner, metrics = make_scheduler(clock=clock, max_wait=0.0)
    runner.gate.clear()

    async def main() -> None:
        busy = scheduler.submit([sentence(1)], GREEDY, FAR)
        assert await asyncio.to_thread(runner.entered.acquire, True, 30)
        late = scheduler.submit([sentence(2), sentence(3)], GREEDY, clock.now + 1.0)
        clock.now += 2.0  # the batch in progress outlasts the late job's deadline
        runner.gate.set()
        await busy.future
        with pytest.raises(DeadlineExceeded):
            await late.future

    asyncio.run(main())
    assert runner.sizes == [1]  # the late job never reached the engine
    dropped = {"model": "fr-en", "reason": "deadline"}
    assert metrics.registry.get_sample_value("nmt_dropped_sentences_total", dropped) == 2


def test_close_finishes_admitted_work_and_then_refuses_more(make_scheduler):
    scheduler, _, _ = make_scheduler(max_wait=60.0)
    sources = [sentence(n) for n in range(4)]

    async def main() -> list:
        job = scheduler.submit(sources, GREEDY, FAR)
        await asyncio.to_thread(scheduler.close, 30)
        with pytest.raises(ShuttingDown):
            scheduler.submit(sources, GREEDY, FAR)
        return await job.future

    assert asyncio.run(main()) == [answer(source) for source in sources]


def test_an_empty_job_is_answered_at_once_without_the_worker(make_scheduler):
    scheduler, runner, _ = make_scheduler()

    async def main() -> list:
        return await scheduler.submit([], GREEDY, FAR).future

    assert asyncio.run(main()) == []
    assert runner.batches == []


def test_rows_of_a_cancelled_job_leave_the_running_batch(make_scheduler):
    scheduler, runner, metrics = make_scheduler(max_sentences=3, max_wait=60.0)
    runner.gate.clear()

    async def main() -> list:
        kept = scheduler.submit([sentence(1)], GREEDY, FAR)
        gone = scheduler.submit([sentence(2), sentence(3)], GREEDY, FAR)
        assert await asyncio.to_thread(runner.entered.acquire, True, 30)
        scheduler.cancel(gone, "client_gone")  # while its sentences are being decoded
        runner.gate.set()
        return await kept.future

    assert asyncio.run(main()) == [answer(sentence(1))]
    assert runner.sizes == [3]
    dropped = {"model": "fr-en", "reason": "abandoned_in_batch"}
    assert metrics.registry.get_sample_value("nmt_dropped_sentences_total", dropped) == 2


def test_a_deadline_that_passes_during_the_batch_stops_its_rows_and_answers_504(make_scheduler):
    clock = FakeClock()
    scheduler, runner, _ = make_scheduler(clock=clock, max_sentences=2, max_wait=60.0)
    runner.gate.clear()

    async def main() -> tuple:
        late = scheduler.submit([sentence(1)], GREEDY, clock.now + 1.0)
        on_time = scheduler.submit([sentence(2)], GREEDY, FAR)
        assert await asyncio.to_thread(runner.entered.acquire, True, 30)
        clock.now += 2.0
        runner.gate.set()
        return await asyncio.gather(late.future, on_time.future, return_exceptions=True)

    late, on_time = asyncio.run(main())
    assert isinstance(late, DeadlineExceeded)
    assert on_time == [answer(sentence(2))]
