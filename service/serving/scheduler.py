"""Dynamic batching: sentences of concurrent requests share the engine.

`Scheduler` is the event-loop side of the one decoding loop (service/serving/continuous.py):
a queue per model, admission, deadlines, cancellation, draining on shutdown. Each request is a
`Job`: its results come back in its own order whatever batches its sentences ran in. A job
that is cancelled (client gone) or past its deadline leaves the queue at once, and its rows
leave a running batch between two steps. If the engine fails, the sentences concerned are
decoded again one by one so that only the culprit's job fails.

`BatchQueue` is the waiting queue (what is queued, who joins the running batches, what
expired), a plain object with no thread and no clock of its own, so it is tested with
made-up times; the loop runs it on a worker thread with a clock (injectable too).

Admission is bounded twice: by the queue's length (`QueueFull`), and by time
(service/serving/admission.py): a request the backlog would keep past its deadline is refused
at once (`Backlogged`), and a queued sentence that can no longer finish in time is dropped
before it costs a step.

Knows nothing of HTTP: it raises `QueueFull`, `Backlogged`, `ShuttingDown` and
`DeadlineExceeded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from service.runtime.running_batch import batch_key
from service.runtime.search import Hypothesis, SearchOptions
from service.serving.admission import DeadlineAdmission, retry_after
from service.serving.errors import Backlogged, DeadlineExceeded, QueueFull, ShuttingDown

log = logging.getLogger("nmt.scheduler")


class BatchObserver(Protocol):
    """What the scheduler reports (implemented by metrics.Metrics)."""

    def observe_queue_depth(self, model: str, depth: int) -> None: ...

    def observe_batch_failure(self, model: str) -> None: ...

    def observe_step(
        self,
        model: str,
        sentences: int,
        rows: int,
        reserved_tokens: int,
        output_tokens: int,
        seconds: float,
    ) -> None: ...

    def observe_join(
        self, model: str, waits: list[float], input_tokens: int, seconds: float
    ) -> None: ...

    def observe_left(self, model: str, reason: str, count: int) -> None: ...

    def observe_job(
        self, model: str, queued: float, inference: float, output_tokens: int
    ) -> None: ...

    def observe_dropped(self, model: str, reason: str, count: int) -> None: ...

    def observe_capacity(self, model: str, sentences_per_second: float) -> None: ...


@dataclass
class Room:
    """What a running batch may still take: sentences, reserved tokens (source plus the
    self-attention cache its rows may grow to), and whether it is empty."""

    sentences: int
    tokens: int
    empty: bool


@dataclass(frozen=True)
class BatchLimits:
    max_sentences: int = 32  # in a running batch
    # The running batch's reserved tokens, summed over its sentences: source + beams * length
    # limit (TGI's max-batch-total-tokens).
    max_total_tokens: int = 16384
    # Joining costs a copy of the batch's caches, so sentences join a running batch together,
    # when as many can join (waiting, at most the free places) as join_ratio x those running,
    # or once join_max_steps steps have passed since the last join (TGI's waiting_served_ratio
    # and max_waiting_tokens). An empty batch takes them at once. 0.6 and 12 rather than 0.3
    # and 6: fewer joins cut the p99 at 70% load and cost nothing at 8 or 32 clients
    # (docs/service.md).
    join_ratio: float = 0.6
    join_max_steps: int = 12
    max_queued: int = 1024  # sentences waiting (not counting the batch being decoded)
    retry_after: int = 1  # seconds, told to clients refused with QueueFull


class SentenceFailed(Exception):
    """The engine failed on one sentence of a job, even alone in its batch."""

    def __init__(self, index: int, reason: str) -> None:
        self.index, self.reason = index, reason
        super().__init__(f"sentence {index}: {reason}")


Clock = Callable[[], float]  # seconds, monotonic


class Job:
    """One request's sentences. `future` resolves on the submitting event loop with one
    hypothesis list per sentence, in order, or with the exception that ended the job."""

    def __init__(
        self,
        sources: list[list[int]],
        options: SearchOptions,
        deadline: float,
        loop: asyncio.AbstractEventLoop,
        now: float,
    ) -> None:
        self.sources = sources
        self.options = options
        self.deadline = deadline  # on the scheduler's clock
        self.timeout = deadline - now
        self.created = now
        self.started: float | None = None  # when its first sentence reached the engine
        self.output_tokens = 0
        self.results: list[list[Hypothesis] | None] = [None] * len(sources)
        self.remaining = len(sources)
        self.closed = False  # finished, failed or cancelled: no more work (under the lock)
        self.future: asyncio.Future[list[list[Hypothesis]]] = loop.create_future()
        self._loop = loop

    def settle(self, outcome: list[list[Hypothesis]] | BaseException) -> None:
        """Resolve the future from any thread; a future already cancelled is left alone."""

        def resolve() -> None:
            if self.future.done():
                return
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            self._loop.call_soon_threadsafe(resolve)


@dataclass
class QueuedSentence:
    """Sentence `index` of `job`, queued at time `enqueued`."""

    job: Job
    index: int
    enqueued: float
    tokens: int = field(init=False)
    # Continuous batching encodes queued sentences ahead, on a thread of its own: while that
    # runs `encoding` is True, then `encoded` holds the joining state (or the exception).
    encoding: bool = field(default=False, init=False)
    encoded: object = field(default=None, init=False)
    joined: float | None = field(default=None, init=False)  # when it reached the engine

    def __post_init__(self) -> None:
        self.tokens = len(self.job.sources[self.index])


class BatchQueue:
    """The batching policy over queued sentences. Not thread-safe: the scheduler holds its
    lock around every call. Times are passed in, so tests need no clock and no sleep."""

    def __init__(self, model: str, limits: BatchLimits) -> None:
        self.model = model
        self.limits = limits
        self.items: deque[QueuedSentence] = deque()

    def __len__(self) -> int:
        return len(self.items)

    def add(self, job: Job, now: float) -> None:
        """Queue every sentence of a job, or raise QueueFull. A job larger than the whole
        queue is still admitted when the queue is empty, so that it can be served at all."""
        queued = len(self.items)
        if queued and queued + len(job.sources) > self.limits.max_queued:
            raise QueueFull(self.model, queued, self.limits.max_queued, self.limits.retry_after)
        self.items.extend(QueuedSentence(job, index, now) for index in range(len(job.sources)))

    def remove(self, job: Job) -> int:
        """Drop a job's queued sentences; returns how many there were."""
        before = len(self.items)
        self.items = deque(item for item in self.items if item.job is not job)
        return before - len(self.items)

    def expired_jobs(
        self, now: float, hopeless: Callable[[QueuedSentence], bool] = lambda item: False
    ) -> list[tuple[Job, bool]]:
        """The distinct jobs with queued sentences whose deadline has passed (False) or which
        can no longer finish before it (`hopeless`: True), oldest first."""
        found: dict[int, tuple[Job, bool]] = {}
        for item in self.items:
            if id(item.job) in found:
                continue
            if item.job.deadline <= now:
                found[id(item.job)] = (item.job, False)
            elif hopeless(item):
                found[id(item.job)] = (item.job, True)
        return list(found.values())

    def take_joiners(
        self,
        rooms: dict[Hashable, Room],
        key_of: Callable[[QueuedSentence], Hashable],
        cost_of: Callable[[QueuedSentence], int],
        ready: Callable[[QueuedSentence], bool] = lambda item: True,
    ) -> list[QueuedSentence]:
        """Continuous batching: the queued sentences that join the running batches now, taken
        off the queue. Oldest first; for each batch key (`rooms`: what its running batch may
        still take), until one does not fit. Later sentences of that key then wait too, so
        that a long sentence is never overtaken for ever by shorter ones. A sentence joining
        an empty batch is taken whatever its cost, so that it can be served at all.

        A running batch takes none this turn if one of those it would take is not `ready`
        (being encoded ahead): the worker then steps instead of waiting for the encoder, and
        they join together at a later turn (the scheduler's `ready` holds a join back once at
        most). An empty batch has nothing to step: it takes them, ready or not."""
        taken: list[QueuedSentence] = []
        blocked: set[Hashable] = set()
        running = {key for key, room in rooms.items() if not room.empty}
        not_yet: set[Hashable] = set()
        for item in self.items:
            key = key_of(item)
            room = rooms.get(key)
            if key in blocked or room is None:
                continue
            cost = cost_of(item)
            if room.sentences < 1 or (cost > room.tokens and not room.empty):
                blocked.add(key)
                continue
            if key in running and not ready(item):
                blocked.add(key)
                not_yet.add(key)
                continue
            taken.append(item)
            room.sentences, room.tokens, room.empty = room.sentences - 1, room.tokens - cost, False
        taken = [item for item in taken if key_of(item) not in not_yet]
        if taken:
            chosen = {id(item) for item in taken}
            self.items = deque(item for item in self.items if id(item) not in chosen)
        return taken


class Scheduler:
    """The event-loop side (submit, cancel, close), which never waits for the model, and the
    bookkeeping of jobs under the lock. The decoding loop (continuous.py) provides the worker
    (`_work`)."""

    def __init__(
        self,
        model: str,
        limits: BatchLimits,
        observer: BatchObserver | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.model = model
        self.limits = limits
        self.clock = clock
        self._observer = observer
        self._queue = BatchQueue(model, limits)
        self._admission = DeadlineAdmission()  # under the lock
        # The worker waits on `_lock`; a subclass may make other conditions on `_mutex`, so
        # that a submit wakes only the threads it gives work to.
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        self._closing = False
        # Jobs closed before their end (cancelled, failed, expired): a worker that read the
        # count without the lock looks for their sentences when it changes.
        self._jobs_closed = 0
        self._thread = threading.Thread(target=self._work, name=f"nmt-batch-{model}", daemon=True)

    # Event-loop side: quick, never waits for the model.

    def start(self) -> None:
        self._thread.start()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def submit(self, sources: list[list[int]], options: SearchOptions, deadline: float) -> Job:
        """Queue a request's sentences (see BatchQueue.add); `deadline` is on self.clock."""
        now = self.clock()
        job = Job(sources, options, deadline, asyncio.get_running_loop(), now)
        if not sources:
            job.closed = True
            job.settle([])
            return job
        with self._lock:
            if self._closing:
                raise ShuttingDown("the server is shutting down: no new work is accepted")
            self._check_deadline(job, now)
            self._queue.add(job, now)
            self._report_depth()
            self._lock.notify_all()  # the worker
            self._queued()
        return job

    def cancel(self, job: Job, reason: str) -> None:
        """Drop a job's queued sentences (client gone, deadline passed); its future is cancelled."""
        with self._lock:
            dropped = self._close_job(job) if not job.closed else 0
        job.future.cancel()
        self._report_dropped(reason, dropped)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new work, finish what is queued, then stop the worker."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
            self._queued()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _work(self) -> None:
        raise NotImplementedError

    def _check_deadline(self, job: Job, now: float) -> None:
        """Under the lock: refuse a job the backlog would keep past its deadline. A job that
        finds the queue empty is taken whatever its forecast: nothing else can be done for
        it, and it may be shorter than the mean."""
        ahead = len(self._queue)
        key = batch_key(job.options)
        longest = max(len(source) for source in job.sources)
        forecast = self._admission.forecast(now, ahead, len(job.sources), key, longest)
        if ahead and forecast is not None and not forecast.fits(now, job.deadline):
            raise Backlogged(
                self.model, ahead, forecast, job.timeout, retry_after(forecast, now, job.deadline)
            )

    def _joined(self, items: list[QueuedSentence], now: float) -> None:
        """Under the lock: sentences reached the engine (for the admission's join rate)."""
        for item in items:
            item.joined = now
        self._admission.joined(now, len(items), len(self._queue))
        if self._observer and (rate := self._admission.rate) is not None:
            self._observer.observe_capacity(self.model, rate)

    def _finished(self, item: QueuedSentence, now: float) -> None:
        """Under the lock: a sentence ended (for the admission's service time)."""
        if item.joined is not None:
            self._admission.finished(batch_key(item.job.options), now - item.joined, item.tokens)

    def _queued(self) -> None:
        """Under the lock, after work was queued (or closing began): wake whoever else but
        the worker it concerns."""

    def _fail(self, item: QueuedSentence, error: Exception) -> None:
        log.warning("engine failed on one sentence (%d tokens): %s", item.tokens, error)
        with self._lock:
            if item.job.closed:
                return
            dropped = self._close_job(item.job)
        self._report_dropped("failed_job", dropped)
        item.job.settle(SentenceFailed(item.index, _short(error)))

    def _record(self, item: QueuedSentence, hypotheses: list[Hypothesis]) -> bool:
        """Under the lock: store a sentence's result; True when that completes its job."""
        job = item.job
        job.results[item.index] = hypotheses
        job.output_tokens += len(hypotheses[0].tokens)
        job.remaining -= 1
        if job.remaining:
            return False
        job.closed = True
        return True

    def _answer(self, finished: list[Job], expired: list[Job]) -> None:
        """Outside the lock: resolve the jobs that are complete or ran out of time."""
        now = self.clock()
        for job in finished:
            job.settle(job.results)  # type: ignore[arg-type]  # every slot is filled now
            if self._observer:
                started = job.created if job.started is None else job.started
                self._observer.observe_job(
                    self.model, started - job.created, now - started, job.output_tokens
                )
        for job in expired:
            job.settle(DeadlineExceeded(job.timeout))

    # Under the lock.

    def _close_job(self, job: Job) -> int:
        """Mark a job closed and drop its queued sentences; returns how many were dropped."""
        job.closed = True
        self._jobs_closed += 1  # after `closed`: a worker that sees the count sees the flag
        dropped = self._queue.remove(job)
        if not self._queue:
            self._admission.queue_emptied()
        self._report_depth()
        return dropped

    def _drop_expired(self) -> None:
        """Drop queued jobs past their deadline, and those that can no longer meet it (their
        time left is shorter than a sentence's service time): 504 now, no step spent."""
        now = self.clock()

        def hopeless(item: QueuedSentence) -> bool:
            key = batch_key(item.job.options)
            return self._admission.hopeless(now, item.job.deadline, key, item.tokens)

        for job, early in self._queue.expired_jobs(now, hopeless):
            dropped = self._close_job(job)
            self._report_dropped("deadline_unreachable" if early else "deadline", dropped)
            job.settle(DeadlineExceeded(job.timeout))

    def _report_depth(self) -> None:
        if self._observer:
            self._observer.observe_queue_depth(self.model, len(self._queue))

    def _report_dropped(self, reason: str, count: int) -> None:
        if self._observer:
            self._observer.observe_dropped(self.model, reason, count)


def _short(error: Exception, limit: int = 300) -> str:
    """Engine errors can be long (ONNX Runtime stack details): keep the first line, bounded."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
