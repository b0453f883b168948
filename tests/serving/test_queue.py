"""The waiting queue (`WaitingQueue`) with no model, made-up costs, rooms and times: admission
by length and by time, what expired, and who joins the running batches. The loop itself is
tested in tests/serving/test_loop.py (a fake running batch and a fake clock) and
tests/runtime/test_running_batch.py (the real engine).
"""

from __future__ import annotations

import asyncio

import pytest

from service.runtime.search import SearchOptions
from service.serving.admission import DeadlineAdmission
from service.serving.errors import Backlogged, QueueFull
from service.serving.queue import Job, Room, WaitingQueue

GREEDY = SearchOptions(beam_size=1, max_length=12)
BEAM = SearchOptions(beam_size=2)
FAR = 1e9  # a deadline that never comes
LOOP = asyncio.new_event_loop()  # jobs need a loop for their futures; none runs here


def sentence(n: int, length: int = 3) -> list[int]:
    """A made-up source: `length` tokens, all equal to n, then </s> (2)."""
    return [n] * length + [2]


def queued(
    queue: WaitingQueue,
    sources: list[list[int]],
    now: float = 0.0,
    options: SearchOptions = GREEDY,
    deadline: float = FAR,
    costs: list[int] | None = None,
) -> Job:
    """Queue a job whose sentences cost their length, unless `costs` says otherwise."""
    job = Job(sources, options, deadline, LOOP, now)
    queue.add(job, now, costs if costs is not None else [len(s) for s in sources])
    return job


def taken(queue: WaitingQueue, rooms: dict[int, Room]) -> list[tuple[Job, int]]:
    return [(item.job, item.index) for item in queue.take_joiners(rooms).taken]


def new_queue(max_queued: int = 1024, admission: DeadlineAdmission | None = None) -> WaitingQueue:
    return WaitingQueue("m", max_queued=max_queued, retry_after=7, admission=admission)


# Admission.


def test_a_full_queue_refuses_a_job_and_a_job_larger_than_the_queue_needs_it_empty():
    queue = new_queue(max_queued=3)
    queued(queue, [sentence(1), sentence(2)])
    with pytest.raises(QueueFull, match="limit 3") as refused:
        queued(queue, [sentence(3), sentence(4)])
    assert refused.value.retry_after == 7
    queued(queue, [sentence(3)])  # exactly fills the queue
    assert len(queue) == 3
    empty = new_queue(max_queued=2)
    queued(empty, [sentence(n) for n in range(5)])
    assert len(empty) == 5


def test_a_job_the_backlog_would_make_late_is_refused_unless_the_queue_is_empty():
    admission = DeadlineAdmission()
    admission.joined(now=0.0, count=1, still_queued=1)
    admission.joined(now=1.0, count=2, still_queued=1)  # 2 sentences/s
    queue = new_queue(admission=admission)
    # Alone, it is admitted whatever its forecast (4 sentences: 2 s, with 1 s left).
    queued(queue, [sentence(n) for n in range(4)], now=10.0, deadline=11.0)
    with pytest.raises(Backlogged) as refused:  # behind those 4: 2.5 s, over 0.8 x 3 s
        queued(queue, [sentence(9)], now=10.0, deadline=13.0)
    assert refused.value.retry_after >= 1
    queued(queue, [sentence(9)], now=10.0, deadline=20.0)  # time enough
    assert len(queue) == 5


# Expiry.


def test_expired_jobs_are_found_and_removed_whole():
    admission = DeadlineAdmission()
    queue = new_queue(admission=admission)
    late = queued(queue, [sentence(1), sentence(2)], deadline=5.0)
    on_time = queued(queue, [sentence(3)], deadline=50.0)
    assert queue.expired_jobs(now=4.9) == []
    assert queue.expired_jobs(now=5.0) == [(late, False)]
    # Once sentences are known to take 2 s (0.5 s a source token, 4 tokens), a job with less
    # time left than that is found before its deadline.
    admission.finished(key=1, seconds=2.0, tokens=4)
    assert queue.expired_jobs(now=4.0) == [(late, True)]
    assert queue.remove(late) == 2
    assert [item.job for item in queue] == [on_time]


def test_a_queue_emptied_by_a_removal_is_not_taken_for_a_slow_worker():
    admission = DeadlineAdmission()
    queue = new_queue(admission=admission)
    job = queued(queue, [sentence(1), sentence(2)])
    admission.joined(now=0.0, count=1, still_queued=2)
    queue.remove(job)  # cancelled: the time until the next join is not the worker's
    admission.joined(now=30.0, count=1, still_queued=0)
    assert admission.rate is None


# Who joins the running batches.


def test_joiners_are_the_oldest_that_fit_in_sentences_and_tokens():
    queue = new_queue()
    job = queued(queue, [sentence(1), sentence(2), sentence(3), sentence(4)], costs=[4, 4, 4, 2])
    # 4 + 4 = 8 tokens; the third (4 more) would pass 10, and the fourth, which would fit,
    # must not overtake it.
    assert taken(queue, {1: Room(sentences=3, tokens=10, empty=False)}) == [(job, 0), (job, 1)]
    assert len(queue) == 2
    # No more than the places left, whatever the tokens.
    assert taken(queue, {1: Room(sentences=1, tokens=100, empty=False)}) == [(job, 2)]


def test_an_empty_batch_takes_a_sentence_above_the_token_budget_so_it_can_be_served():
    queue = new_queue()
    job = queued(queue, [sentence(1), sentence(2)], costs=[50, 3])
    assert taken(queue, {1: Room(4, 10, empty=True)}) == [(job, 0)]  # alone; the next waits
    assert taken(queue, {1: Room(4, 10, empty=False)}) == [(job, 1)]


def test_each_beam_size_has_its_own_room_and_a_full_one_does_not_block_the_other():
    queue = new_queue()
    beam = queued(queue, [sentence(1)], options=BEAM)
    greedy = queued(queue, [sentence(2), sentence(3)])
    rooms = {1: Room(1, 100, False), 2: Room(0, 100, False)}
    assert taken(queue, rooms) == [(greedy, 0)]
    assert [item.job for item in queue] == [beam, greedy]
    assert taken(queue, {1: Room(4, 100, False)}) == [(greedy, 1)]  # 2 not given: it waits
    assert [item.job for item in queue] == [beam]


def test_a_running_batch_may_hold_its_join_back_for_a_sentence_still_being_encoded():
    queue = new_queue()
    greedy = queued(queue, [sentence(1), sentence(2)])
    beam = queued(queue, [sentence(3)], options=BEAM)
    list(queue)[1].encoding = True  # the second greedy sentence is being encoded ahead
    rooms = {1: Room(4, 100, empty=False, hold_for_encoding=True), 2: Room(4, 100, False, True)}
    found = queue.take_joiners(rooms)
    # Neither greedy sentence joins (they join together later); the beam one does.
    assert [item.job for item in found.taken] == [beam] and found.held_back == {1}
    assert [(item.job, item.index) for item in queue] == [(greedy, 0), (greedy, 1)]
    # A batch that may not hold back (it did last turn, or it is empty) takes them anyway.
    found = queue.take_joiners({1: Room(4, 100, empty=False, hold_for_encoding=False)})
    assert [(item.job, item.index) for item in found.taken] == [(greedy, 0), (greedy, 1)]
    assert found.held_back == set() and len(queue) == 0


# Background work (a document's chunks).


def background(queue: WaitingQueue, sources: list[list[int]], now: float = 0.0) -> Job:
    job = Job(sources, GREEDY, FAR, LOOP, now, background=True)
    queue.add(job, now, [len(s) for s in sources])
    return job


def test_interactive_sentences_join_before_background_ones_queued_earlier():
    queue = new_queue()
    document = background(queue, [sentence(n) for n in range(4)])
    request = queued(queue, [sentence(9)], now=1.0)
    joined = taken(queue, {GREEDY.beam_size: Room(sentences=2, tokens=100, empty=False)})
    assert joined == [(request, 0), (document, 0)]  # the request first, then what room is left


def test_background_work_never_counts_against_an_interactive_jobs_admission():
    queue = new_queue(max_queued=2)
    background(queue, [sentence(n) for n in range(50)])
    queued(queue, [sentence(1), sentence(2)])  # the queue's 2 places are the interactive ones
    with pytest.raises(QueueFull):
        queued(queue, [sentence(3)])
    assert len(queue) == 52


def test_an_interactive_sentence_that_does_not_fit_holds_background_ones_back_too():
    queue = new_queue()
    queued(queue, [sentence(1, length=50)])
    background(queue, [sentence(2)])
    assert taken(queue, {GREEDY.beam_size: Room(sentences=4, tokens=10, empty=False)}) == []


def test_removing_a_background_job_leaves_the_interactive_ones():
    queue = new_queue()
    document = background(queue, [sentence(1), sentence(2)])
    request = queued(queue, [sentence(3)])
    assert queue.remove(document) == 2
    assert [item.job for item in queue] == [request]
