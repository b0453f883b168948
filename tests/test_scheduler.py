"""The waiting queue (`BatchQueue`) with no model and made-up times: admission by length and
what expired. Who joins the running batch, and the loop itself, are tested in
tests/test_continuous.py (a fake running batch and a fake clock) and
tests/test_continuous_engine.py (the real engine).
"""

from __future__ import annotations

import asyncio

import pytest

from service.runtime.search import SearchOptions
from service.serving.errors import QueueFull
from service.serving.scheduler import BatchLimits, BatchQueue, Job

GREEDY = SearchOptions(beam_size=1, max_length=12)
FAR = 1e9  # a deadline that never comes
LOOP = asyncio.new_event_loop()  # jobs need a loop for their futures; none runs here


def sentence(n: int, length: int = 3) -> list[int]:
    """A made-up source: `length` tokens, all equal to n, then </s> (2)."""
    return [n] * length + [2]


def queued_job(queue: BatchQueue, sources: list[list[int]], now: float, **kw) -> Job:
    job = Job(sources, kw.get("options", GREEDY), kw.get("deadline", FAR), LOOP, now)
    queue.add(job, now)
    return job


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
