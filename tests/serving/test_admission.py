"""Deadline-aware admission: the measured join rate and service time, and what the decoding
loop does with them (refuse a request the backlog would make late, drop a queued one that can
no longer finish), on a fake clock and the fake running batch of tests/serving/test_loop.py."""

from __future__ import annotations

import asyncio
import math

import pytest

from service.serving.admission import ADMIT_WITHIN, DeadlineAdmission, retry_after
from service.serving.errors import Backlogged, DeadlineExceeded
from tests.serving.test_loop import Harness, run, sentence


def test_the_join_rate_counts_only_intervals_in_which_sentences_waited():
    admission = DeadlineAdmission()
    admission.joined(now=0.0, count=4, still_queued=0)  # nobody left waiting
    admission.joined(now=10.0, count=4, still_queued=6)  # 10 idle seconds: not a sample
    assert admission.rate is None
    admission.joined(now=10.5, count=2, still_queued=4)  # 2 sentences in 0.5 s while 6 waited
    admission.joined(now=11.0, count=3, still_queued=0)
    assert admission.rate == pytest.approx(5 / 1.0)
    admission.joined(now=20.0, count=8, still_queued=1)  # the queue had emptied: not a sample
    assert admission.rate == pytest.approx(5.0)


def test_a_queue_emptied_by_cancellation_does_not_count_as_a_slow_worker():
    admission = DeadlineAdmission()
    admission.joined(now=0.0, count=1, still_queued=3)
    admission.queue_emptied()  # its three waiting sentences were cancelled
    admission.joined(now=30.0, count=1, still_queued=0)
    assert admission.rate is None


def test_the_forecast_is_the_wait_behind_the_queue_plus_the_longest_sentences_service():
    admission = DeadlineAdmission()
    assert admission.forecast(now=0.0, ahead=100, count=1, key=1, longest=10) is None
    admission.joined(now=0.0, count=1, still_queued=10)
    admission.joined(now=1.0, count=10, still_queued=10)  # 10 sentences/s
    admission.finished(key=1, seconds=0.5, tokens=10)  # greedy: 50 ms a source token
    admission.finished(key=4, seconds=2.0, tokens=10)  # beam 4: 200 ms a source token
    greedy = admission.forecast(now=100.0, ahead=20, count=5, key=1, longest=20)
    assert greedy is not None
    assert greedy.wait == pytest.approx(2.5)
    assert greedy.service == pytest.approx(1.0)  # its longest sentence, 20 tokens
    assert greedy.finish == pytest.approx(100.0 + 2.5 + 1.0)
    beam = admission.forecast(now=100.0, ahead=20, count=5, key=4, longest=5)
    assert beam is not None and beam.finish == pytest.approx(100.0 + 2.5 + 1.0)
    # Admitted with a margin: the forecast (3.5 s) within ADMIT_WITHIN of the time left.
    assert greedy.fits(now=100.0, deadline=100.0 + 3.5 / ADMIT_WITHIN + 0.01)
    assert not greedy.fits(now=100.0, deadline=104.0)
    # Retry-After: the seconds by which the forecast passes what would be admitted, at least 1.
    assert retry_after(greedy, now=100.0, deadline=101.0) == math.ceil(3.5 - ADMIT_WITHIN)
    assert retry_after(greedy, now=100.0, deadline=104.3) == 1


def test_service_time_is_a_running_mean_per_key_and_source_token():
    admission = DeadlineAdmission()
    admission.finished(key=1, seconds=1.0, tokens=10)
    for _ in range(200):
        admission.finished(key=1, seconds=3.0, tokens=10)
    assert admission.service_time(1, tokens=10) == pytest.approx(3.0, rel=0.01)
    assert admission.service_time(1, tokens=20) == pytest.approx(6.0, rel=0.01)
    assert admission.service_time(2, tokens=10) == 0.0
    assert admission.hopeless(now=0.0, deadline=2.0, key=1, tokens=10)
    assert not admission.hopeless(now=0.0, deadline=4.0, key=1, tokens=10)
    assert admission.hopeless(now=0.0, deadline=4.0, key=1, tokens=20)


def busy(h: Harness, requests: int) -> None:
    """Queue `requests` one-sentence requests of 3 steps and run the loop until they end, one
    turn per 0.01 s of the fake clock: the loop measures its rate and service time."""
    for n in range(requests):
        h.submit(f"warm{n}", [sentence(10 + n)])
    while h.loop.queued or h.loop.running:
        h.loop.work_once()
        h.clock.now += 0.01


def test_a_request_the_backlog_would_keep_past_its_deadline_is_refused_at_once():
    async def scenario():
        h = Harness(max_sentences=2)
        busy(h, 8)
        assert h.metric("nmt_capacity_sentences_per_second") > 0  # a rate was measured
        # Fill the queue (nothing runs while no turn is taken) until a request with a short
        # deadline no longer fits behind it.
        for n in range(40):
            h.submit(f"ahead{n}", [sentence(50 + n)])
        with pytest.raises(Backlogged) as refused:
            h.submit("late", [sentence(99)], timeout=0.5)
        assert refused.value.status == 429
        assert int(refused.value.headers()["Retry-After"]) >= 1
        assert "NMT_REQUEST_TIMEOUT_SECONDS" in str(refused.value)
        # The same request with time enough is admitted, behind the others.
        patient = h.submit("patient", [sentence(99)], timeout=1000.0)
        await asyncio.sleep(0)
        assert not patient.future.done()

    run(scenario)


def test_a_request_that_finds_the_queue_empty_is_admitted_whatever_its_forecast():
    async def scenario():
        h = Harness(max_sentences=2)
        busy(h, 8)
        sources = [sentence(n) for n in range(30, 60)]
        h.submit("alone", sources, timeout=0.001)  # not refused: nothing else can be done
        with pytest.raises(Backlogged):  # the same, behind it, is refused
            h.submit("behind", sources, timeout=0.001)

    run(scenario)


def test_a_queued_request_that_can_no_longer_finish_is_dropped_before_it_joins():
    async def scenario():
        h = Harness(max_sentences=1)
        busy(h, 6)  # each sentence: 3 turns of 0.01 s in the batch
        service = h.admission.service_time(1, tokens=3)
        assert service > 0
        h.submit("running", [sentence(70, steps=50)], timeout=1000.0)
        h.loop.work_once()  # it joins and holds the only place
        # Admitted (the queue is empty), with less time left than a sentence takes.
        doomed = h.submit("doomed", [sentence(71)], timeout=service / 2)
        h.loop.work_once()
        await asyncio.sleep(0)
        assert isinstance(doomed.future.exception(), DeadlineExceeded)
        assert h.metric("nmt_dropped_sentences_total", reason="deadline_unreachable") == 1

    run(scenario)
