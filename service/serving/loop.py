"""The one decoding loop of a model (continuous, iteration-level batching): sentences join and
leave the running batches between two decoder steps, and a request is answered as soon as its
last sentence ends.

Three sides, three kinds of thread:
* the event loop's (`submit`, `cancel`, `close`): quick, never waits for the model;
* the workers' (`Worker.work_once`, over and over): each worker's running batches belong to
  it alone. One worker by default; with `workers` > 1 (NMT_DECODING_WORKERS), as many threads
  each decode batches of their own from the one queue, on one engine: ONNX Runtime lets go of
  the GIL while a graph runs, so one worker's graph runs while another does its Python, and
  on a machine of N cores the model's decoding takes up to N of them (docs/scaling.md);
* the encoder's (`encode_once`, with `encode_ahead`): encodes queued sentences ahead.
What waits (the queue, service/serving/queue.py) and the jobs' state are shared, under one
lock: a worker with room takes the oldest queued sentences, so an idle worker takes what
arrives while another decodes, and a request's sentences may be decoded by several.

One turn of a worker (`work_once`):

1. queued sentences whose request expired are answered 504 and dropped, and so are running
   sentences nobody waits for any more (client gone, deadline passed): they leave the batch;
2. queued sentences join the running batch of their beam size, oldest first, while it has
   room: at most `max_sentences` sentences and `max_total_tokens` reserved tokens (each
   sentence reserves its source plus the self-attention cache its rows may grow to);
   joining encodes them (one encoder call) and merges their keys/values into the batch.
   A join costs every running sentence some work (the step's IO binding made again, at
   times the sources' keys/values stacked anew or the buffers grown), so they join
   together: once those that can join (as many as wait, at most the free places) are
   `join_ratio` times the sentences running, or `join_max_steps` steps after the last join,
   or at once into an empty batch;
3. one running batch runs one decoder step: the one holding the oldest sentence (sentences of
   one beam size share steps; across beam sizes, first come first served, so a greedy
   sentence is not slowed by beam steps interleaved with its own, nor the reverse). Except
   when the running batches are small (STEP_TOGETHER_ROWS rows in all, at most): then they
   all take one step together, in one engine call (`step_together`), since at a few rows a
   step costs about what reading the decoder's weights costs, whatever the rows;
4. sentences that ended leave it; their requests are answered when complete.

Encoding ahead (`encode_ahead`; NMT_ENCODE_AHEAD, which the service turns on when the engine
has one thread): a second thread encodes queued sentences, oldest first, a few of one beam
size per encoder call, while the running batch decodes; joining then only merges their
keys/values and empty caches in. The encoder is a quarter of a greedy sentence's cost, and on
a CPU the decoder's steps gain little from a second intra-op thread (small matmuls), so the
encoder is better off on a core of its own. It stays at most `max_sentences` encoded
sentences ahead of the joins (bounded memory); a sentence that joins before it was encoded is
encoded by the worker, as without it. A join that would take a sentence still being encoded
waits for the next turn (once), the worker stepping meanwhile instead of waiting for the
encoder (docs/benchmarks.md, "Measured once"). While nothing runs there is no decoding to
overlap with: the worker joins what arrives at once and encodes it itself, so that a lone
client's request is not handed from thread to thread.

The running batches are `RunningBatch`es (service/runtime/running_batch.py) made by a factory,
so tests drive this loop with a fake that needs no model: the protocol is `DecodingBatch`.

If the engine fails on a step or a join, the batch cannot be trusted any more: its sentences
are decoded again one by one, so that only the culprit's request fails.

Knows nothing of HTTP: it raises `QueueFull`, `Backlogged`, `ShuttingDown` and
`DeadlineExceeded`, and fails a job with `SentenceFailed`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from service.runtime.search import Finished, SearchOptions, Sentence
from service.serving.admission import DeadlineAdmission
from service.serving.errors import DeadlineExceeded, ShuttingDown
from service.serving.observer import BatchObserver, ModelLabels
from service.serving.queue import Job, QueuedSentence, Room, WaitingQueue
from service.serving.terminology import SentenceTerms

if TYPE_CHECKING:
    from service.serving.tracing import JobTrace

log = logging.getLogger("nmt.scheduler")  # the name operators' log filters already know

# Sentences encoded ahead in one encoder call: fewer calls, little padding (measured, fp32, one
# thread: 2.5 ms a sentence in random groups of 2 and of 6, 3.1 in random groups of 32).
ENCODE_GROUP = 4

# Running batches of different beam sizes take their steps together (one engine call) while
# they hold this many rows in all, at most. Measured with `python -m bench.step_together`
# (fp32, one thread; greedy + beam 4, per step, four steps in a row against one each): the
# first step together stacks the rows' caches into one batch (one copy of them all, and a copy
# of the cross keys/values per row); the next ones go on from it while nobody joins or leaves.
# Four steps in a row: 0.78x the time at 5 rows, 0.81x at 10-12, 0.89x-0.93x at 20-32, 1.0x at
# 48, 1.2x at 64. But in a server, sentences join or leave every few steps, and each time the
# next step together stacks again: one step after stacking is 0.83x at 5 rows, 0.95x-0.99x at
# 10-12, 1.05x-1.14x at 20-32. A limit of 32 instead of 16 gave a worse p99 at 70% load on
# the mix of greedy and beam 4 (515 against 437 ms, the same arrivals, side by side). With the
# caches written in place, at 70% load (docs/serving-performance.md, "Tried and dropped"): no limit
# 1.57x the mean latency of 16, never together 1.03x.
STEP_TOGETHER_ROWS = 16


@dataclass(frozen=True)
class BatchLimits:
    max_sentences: int = 32  # in a running batch
    # The running batch's reserved tokens, summed over its sentences: source + beams * length
    # limit (TGI's max-batch-total-tokens).
    max_total_tokens: int = 16384
    # Joining costs every running sentence some work (kv_cache.py), so sentences join a
    # running batch together, when as many can join (waiting, at most the free places) as
    # join_ratio x those running, or once join_max_steps steps have passed since the last
    # join (TGI's waiting_served_ratio and max_waiting_tokens). An empty batch takes them at
    # once. 0.6 and 12 rather than 0.3 and 6: fewer joins cut the p99 at 70% load and cost
    # nothing at 8 or 32 clients (docs/serving-performance.md).
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


class DecodingBatch(Protocol):
    """What the loop needs of a running batch (service.runtime.running_batch)."""

    def __len__(self) -> int: ...

    @property
    def rows(self) -> int: ...

    def reserved_tokens(self) -> int: ...

    def cost_of(self, sentence: Sentence) -> int: ...

    def encode(self, sentences: list[Sentence]) -> object: ...

    def encode_each(self, sentences: list[Sentence]) -> list: ...

    def join(self, sentences: list[Sentence], encoded: list | None = None) -> None: ...

    def step(self) -> list[Finished]: ...

    def drop(self, condition: Callable[[Sentence], bool]) -> list[Finished]: ...


BatchFactory = Callable[[int], DecodingBatch]  # beam size -> an empty running batch
# running batches -> each one's sentences that ended, after one step of them all together
StepTogether = Callable[[list[DecodingBatch]], list[list[Finished]]]


def _sentence(item: QueuedSentence) -> Sentence:
    terms = item.job.terms[item.index]
    if terms is None:
        return Sentence(item.source, item.job.options, ticket=item)
    return Sentence(
        item.source,
        item.job.options,
        ticket=item,
        constraints=terms.constraints,
        constraint_spans=terms.spans,
    )


class DecodingLoop:
    """The one decoding loop of a model: its queue, its workers' running batches (each worker
    one per beam size) and the threads that feed them."""

    def __init__(
        self,
        model: ModelLabels,
        new_batch: BatchFactory,
        limits: BatchLimits,
        observer: BatchObserver | None = None,
        clock: Clock = time.monotonic,
        encode_ahead: bool = True,
        step_together: StepTogether | None = None,
        admission: DeadlineAdmission | None = None,
        workers: int = 1,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a decoding loop needs at least one worker, got {workers}")
        self.model = model
        self.limits = limits
        self.clock = clock
        self._observer = observer
        self._new_batch = new_batch
        self._step_together = step_together  # None: batches always step apart

        # `_lock` guards what the threads share: the queue and the admission, the jobs' state
        # (closed, results), each queued sentence's encoding state, `_pricing`, `_closing`,
        # `_decoding` and the writes of `_jobs_closed`. Each condition on it wakes only the
        # threads it concerns.
        self._lock = threading.Lock()
        self._work_arrived = threading.Condition(self._lock)  # idle workers wait on it
        # The encoder thread waits on a condition of its own: a lone request, which a
        # worker encodes itself, does not wake it (a wake-up costs this machine 35-55 µs,
        # docs/performance.md, and the woken thread takes the GIL).
        self._encoder_wanted = threading.Condition(self._lock)
        self._encodings_ended = threading.Condition(self._lock)  # a join may wait for them

        self._admission = admission if admission is not None else DeadlineAdmission()
        self.name = model[0] + (f"@{model[1]}" if model[1] else "")  # "fr-en@2": model, version
        self._queue = WaitingQueue(
            self.name, limits.max_queued, limits.retry_after, self._admission
        )
        # Empty batches, by beam size, that only price sentences (cost_of) as they are queued:
        # the workers' batches are not the event loop's to touch.
        self._pricing: dict[Hashable, DecodingBatch] = {}
        self._closing = False
        # Jobs closed before their end (cancelled, failed, expired): a worker that read the
        # count without the lock looks for their sentences when it changes.
        self._jobs_closed = 0
        # Whether sentences are running in any worker (each worker sets its own flag). Encoding
        # ahead overlaps encoding with decoding; with nothing running, a worker joins what is
        # queued at once and encodes it itself, and a lone request is not handed between
        # threads (measured: 2-3% of its latency).
        self._decoding = False

        self.workers = [Worker(self, number) for number in range(workers)]
        self._encoders: dict[Hashable, DecodingBatch] = {}  # by beam size; encoder thread's
        self._encoder_thread = (
            threading.Thread(target=self._encode_ahead, name=f"nmt-encode-{self.name}", daemon=True)
            if encode_ahead
            else None
        )

    # Event-loop side: quick, never waits for the model.

    def start(self) -> None:
        for worker in self.workers:
            worker.thread.start()
        if self._encoder_thread is not None:
            self._encoder_thread.start()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        """Sentences in the workers' running batches."""
        return sum(worker.running for worker in self.workers)

    def reserved_tokens(self) -> int:
        """Tokens the workers' running batches have reserved (RunningBatch.reserved_tokens)."""
        return sum(worker.reserved_tokens() for worker in self.workers)

    @property
    def alive(self) -> bool:
        """Whether a worker's thread still runs (none once closed and drained)."""
        return any(worker.thread.is_alive() for worker in self.workers)

    def work_once(self) -> bool:
        """One turn of the first worker (Worker.work_once): for tests, which drive the loop
        without threads."""
        return self.workers[0].work_once()

    def submit(
        self,
        sources: list[list[int]],
        options: SearchOptions,
        deadline: float,
        terms: list[SentenceTerms | None] | None = None,
        background: bool = False,
        trace: JobTrace | None = None,
    ) -> Job:
        """Queue a request's sentences (see WaitingQueue.add); `deadline` is on self.clock;
        `terms`: per sentence, the glossary terms its translation must contain; `background`:
        a document's, which takes only the room interactive requests leave; `trace`: where
        the loop writes down its sentences' times when the request is traced (tracing.py)."""
        now = self.clock()
        job = Job(sources, options, deadline, asyncio.get_running_loop(), now, terms, background)
        if trace is not None:
            trace.start(now)
            job.trace = trace
        if not sources:
            job.closed = True
            job.settle([])
            return job
        with self._lock:
            if self._closing:
                raise ShuttingDown("the server is shutting down: no new work is accepted")
            self._queue.add(job, now, self._costs(job))
            self._report_depth()
            self._work_arrived.notify()  # one idle worker (the busy ones look at each turn)
            if self._decoding:  # while nothing runs, the worker encodes
                self._encoder_wanted.notify()
        return job

    def cancel(self, job: Job, reason: str) -> None:
        """Drop a job's queued sentences (client gone, deadline passed); its future is cancelled."""
        with self._lock:
            dropped = self._close_job(job) if not job.closed else 0
        job.future.cancel()
        self._report_dropped(reason, dropped)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new work, finish what is queued, then stop the threads."""
        with self._lock:
            self._closing = True
            self._work_arrived.notify_all()
            self._encoder_wanted.notify()
        threads = [worker.thread for worker in self.workers] + [self._encoder_thread]
        for thread in threads:
            if thread is not None and thread.is_alive():
                thread.join(timeout)

    def _costs(self, job: Job) -> list[int]:
        """Under the lock: what each of a job's sentences reserves in a running batch of its
        beam size, priced once here so that the queue is given numbers."""
        if job.key not in self._pricing:
            self._pricing[job.key] = self._new_batch(job.key)
        batch = self._pricing[job.key]
        return [batch.cost_of(Sentence(source, job.options)) for source in job.sources]

    # Workers' side, shared.

    def _note_decoding(self) -> None:
        """Under the lock: tell the encoder thread whether sentences run in any worker
        (`_decoding`); wake it when they start to while others wait."""
        decoding = any(worker.decoding for worker in self.workers)
        if decoding != self._decoding:
            self._decoding = decoding
            if decoding and self._queue:
                self._encoder_wanted.notify()

    def _settle_jobs(self, finished: list[Finished], gone: list[Finished]) -> None:
        """Answer the requests that are now complete (`finished` sentences ended), and 504 to
        those whose sentences left because their deadline passed (`gone`)."""
        complete: list[Job] = []
        expired: dict[int, Job] = {}
        now = self.clock()
        with self._lock:
            for done in finished:
                item = done.sentence.ticket
                self._finished(item, now)
                if item.job.trace is not None:
                    tokens = len(done.hypotheses[0].tokens) if done.hypotheses else 0
                    item.job.trace.finished(item.index, now, done.steps, tokens)
                if not item.job.closed and item.job.record(item.index, done.hypotheses):
                    complete.append(item.job)
            for left in gone:
                job = left.sentence.ticket.job
                if not job.closed:  # not cancelled: its deadline passed while it ran
                    self._close_job(job)
                    expired[id(job)] = job
        if self._observer:
            self._observer.observe_left(self.model, "finished", len(finished))
            self._observer.observe_left(self.model, "abandoned", len(gone))
        self._report_dropped("abandoned_in_batch", len(gone))
        self._answer(complete, list(expired.values()))

    def _fail(self, item: QueuedSentence, error: Exception) -> None:
        # A bug or an input the engine cannot take: the traceback is what finds it.
        log.error(
            "engine failed on one sentence (%d tokens): %s", item.tokens, error, exc_info=error
        )
        with self._lock:
            if item.job.closed:
                return
            dropped = self._close_job(item.job)
        self._report_dropped("failed_job", dropped)
        item.job.settle(SentenceFailed(item.index, _short(error)))

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

    # Encoder-thread side.

    def _encode_ahead(self) -> None:
        while True:
            with self._lock:
                while not (items := self.to_encode_ahead()):
                    if self._closing:
                        return
                    self._encoder_wanted.wait()
            self.encode_once(items)

    def to_encode_ahead(self) -> list[QueuedSentence]:
        """What the encoder thread takes now (under the lock): the next sentences to encode
        (`_next_to_encode`) while sentences run, none while the worker is idle."""
        return self._next_to_encode() if self._decoding else []

    def _next_to_encode(self) -> list[QueuedSentence]:
        """The oldest queued sentences not encoded yet, of the beam size of the oldest one, at
        most ENCODE_GROUP and no more than `max_sentences` ahead of the joins (counting
        those encoded and waiting). Under the lock."""
        items: list[QueuedSentence] = []
        ready = 0
        for item in self._queue:
            if ready + len(items) >= self.limits.max_sentences or len(items) >= ENCODE_GROUP:
                break
            if item.encoded is not None or item.encoding:
                ready += 1
            elif not item.job.closed and (not items or item.key == items[0].key):
                items.append(item)
        return items

    def encode_once(self, items: list[QueuedSentence] | None = None) -> bool:
        """Encode queued sentences ahead of their join (`items`, or the next ones; one encoder
        call); False if there were none. Called by the encoder thread, or by tests directly."""
        with self._lock:
            items = items or self._next_to_encode()
            if not items:
                return False
            for item in items:
                item.encoding = True
        key = items[0].key
        started = self.clock()
        try:  # whatever happens, the items leave the `encoding` state: a join may wait for them
            if key not in self._encoders:
                self._encoders[key] = self._new_batch(key)
            encoded: list[object] = self._encoders[key].encode_each(
                [_sentence(item) for item in items]
            )
            _trace_encoding(items, started, self.clock())
        except Exception as error:  # their join fails on it and decodes its sentences alone
            encoded = [error] * len(items)
        with self._lock:
            for item, state in zip(items, encoded, strict=True):
                item.encoding, item.encoded = False, state
            self._encodings_ended.notify_all()
        return True

    # Under the lock.

    def _close_job(self, job: Job) -> int:
        """Mark a job closed and drop its queued sentences; returns how many were dropped."""
        job.closed = True
        self._jobs_closed += 1  # after `closed`: a worker that sees the count sees the flag
        dropped = self._queue.remove(job)
        self._report_depth()
        return dropped

    def _drop_expired(self) -> None:
        """Drop queued jobs past their deadline, and those that can no longer meet it: 504
        now, no step spent."""
        for job, early in self._queue.expired_jobs(self.clock()):
            dropped = self._close_job(job)
            self._report_dropped("deadline_unreachable" if early else "deadline", dropped)
            job.settle(DeadlineExceeded(job.timeout))

    def _joined(self, items: list[QueuedSentence], now: float) -> None:
        """Sentences reached the engine (for the admission's join rate)."""
        for item in items:
            item.joined = now
        self._admission.joined(now, len(items), len(self._queue))
        if self._observer and (rate := self._admission.rate) is not None:
            self._observer.observe_capacity(self.model, rate)

    def _finished(self, item: QueuedSentence, now: float) -> None:
        """A sentence ended (for the admission's service time)."""
        if item.joined is not None:
            self._admission.finished(item.key, now - item.joined, item.tokens)

    def _report_depth(self) -> None:
        if self._observer:
            self._observer.observe_queue_depth(self.model, len(self._queue))

    def _report_dropped(self, reason: str, count: int) -> None:
        if self._observer:
            self._observer.observe_dropped(self.model, reason, count)


class Worker:
    """One decoding thread of a loop: its running batches (one per beam size), what runs in
    them, and its turns (`work_once`). Everything here is this thread's alone; what it shares
    with the other threads it reaches through the loop, under the loop's lock."""

    def __init__(self, loop: DecodingLoop, number: int) -> None:
        self.loop = loop
        # By beam size: the running batches, what runs in each (their sentences' tickets, in
        # joining order: a batch does not list them) and the steps since a join.
        self._batches: dict[Hashable, DecodingBatch] = {}
        self._running: dict[Hashable, dict[QueuedSentence, None]] = {}
        self._steps_since_join: dict[Hashable, int] = {}
        self._held_back: set[Hashable] = set()  # joins held back last turn, for the encoder
        # What _drop_abandoned last saw: the count of jobs closed early, and the earliest
        # deadline of a running sentence (may be earlier than any left: then it looks again).
        self._jobs_closed_seen = 0
        self._next_deadline = math.inf
        self.decoding = False  # whether sentences run here (the loop's _decoding reads it)
        suffix = f"-{number}" if number else ""
        self.thread = threading.Thread(
            target=self._work, name=f"nmt-batch-{loop.name}{suffix}", daemon=True
        )

    @property
    def running(self) -> int:
        """Sentences in this worker's running batches. (Also read by the metrics' scrape,
        from another thread: over a copy of the batches, which this thread may change.)"""
        return sum(len(batch) for batch in list(self._batches.values()))

    def reserved_tokens(self) -> int:
        return sum(batch.reserved_tokens() for batch in list(self._batches.values()))

    def _work(self) -> None:
        while self._wait_for_work():
            try:
                self.work_once()
            except Exception as error:  # a bug in the loop itself: fail what runs, go on
                log.exception("batch worker error")
                self._fail_running(error)

    def _wait_for_work(self) -> bool:
        """Sleep until there is something queued or running here; False once closed and
        drained."""
        if self.running:  # the running batches are this thread's: no lock to ask that
            return True
        loop = self.loop
        with loop._lock:
            while not (loop._queue or self.running):
                if loop._closing:
                    return False
                loop._work_arrived.wait()
            return True

    def work_once(self) -> bool:
        """One turn of the loop (see the module's docstring); False if there was nothing to
        step. Called by the worker's thread, or by tests directly (no thread, no sleep)."""
        loop = self.loop
        # Most turns of a busy batch find the queue empty: then the lock is not taken. (The
        # queue's length is read without it; a sentence queued meanwhile joins next turn.)
        queued = bool(loop._queue)
        if queued:
            with loop._lock:
                loop._drop_expired()
        self._drop_abandoned()
        joiners: list[QueuedSentence] = []
        if queued:
            with loop._lock:
                found = loop._queue.take_joiners(self._rooms())
                self._held_back, joiners = found.held_back, found.taken
                if joiners:
                    loop._joined(joiners, loop.clock())
                    loop._report_depth()
                    if loop._queue and len(loop.workers) > 1:
                        # What this worker had no room for: another idle worker's to take.
                        loop._work_arrived.notify()
        by_key: dict[Hashable, list[QueuedSentence]] = {}
        for item in joiners:
            by_key.setdefault(item.key, []).append(item)
        for key, items in by_key.items():
            self._join(key, items)
            self._steps_since_join[key] = 0
        if joiners:  # sentences may have started to run: those still queued can be encoded
            self._note_decoding()
        live = [key for key, batch in self._batches.items() if len(batch)]
        if not live:
            self._note_decoding()
            return False
        if (
            loop._step_together
            and len(live) > 1
            and sum(self._batches[key].rows for key in live) <= STEP_TOGETHER_ROWS
        ):
            left = self._step(live)
        else:
            left = self._step([self._oldest(live)])
        if left:
            self._note_decoding()
        return True

    def _note_decoding(self) -> None:
        """Whether sentences run here; the loop tells the encoder thread when that changes."""
        decoding = self.running > 0
        if decoding != self.decoding:
            with self.loop._lock:
                self.decoding = decoding
                self.loop._note_decoding()

    def _rooms(self) -> dict[Hashable, Room]:
        """Under the lock: room left in this worker's running batch of every beam size that is
        queued for; none in a batch that should run on a little longer before the next join
        (see BatchLimits). A running batch may hold its join back for the encoder, but not
        two turns in a row: where sentences keep arriving, another would be in the encoder at
        every turn, and the join would wait for ever."""
        loop, limits = self.loop, self.loop.limits
        rooms: dict[Hashable, Room] = {}
        interactive = loop._queue.interactive_waiting()
        for key, count in loop._queue.waiting().items():
            batch = self._batch(key)
            running = len(batch)
            free = limits.max_sentences - running
            # What counts is how many can join now, not how many wait: with a full queue and
            # one free place, a join per leaver would copy the caches (and call the encoder
            # for one sentence) at nearly every step.
            # ... but a person waiting never waits for a document's rows to make a join
            # worth its cost: they are background work (queue.py).
            due = (
                not running
                or min(count, free) >= limits.join_ratio * running
                or self._steps_since_join.get(key, 0) >= limits.join_max_steps
                or (key in interactive and self._runs_background(key))
            )
            rooms[key] = Room(
                sentences=free if due else 0,
                tokens=limits.max_total_tokens - batch.reserved_tokens(),
                empty=not running,
                hold_for_encoding=bool(running) and key not in self._held_back,
            )
        return rooms

    def _runs_background(self, key: Hashable) -> bool:
        return any(item.job.background for item in self._running.get(key, {}))

    def _batch(self, key: Hashable) -> DecodingBatch:
        if key not in self._batches:
            self._batches[key] = self.loop._new_batch(key)
        return self._batches[key]

    def _oldest(self, live: list[Hashable]) -> Hashable:
        """Of the beam sizes `live` (their batches not empty), the one whose running batch
        holds the sentence queued first."""
        if len(live) == 1:
            return live[0]
        oldest = {key: min(item.enqueued for item in self._running[key]) for key in live}
        return min(oldest, key=oldest.__getitem__)

    def _join(self, key: Hashable, items: list[QueuedSentence]) -> None:
        loop = self.loop
        items = [item for item in items if not item.job.closed]
        if not items:
            return
        started = loop.clock()
        try:
            # Only a join into an empty batch takes sentences still being encoded ahead (a
            # running batch steps meanwhile: Room.hold_for_encoding): that is nearly done.
            with loop._lock:
                while any(item.encoding for item in items):
                    loop._encodings_ended.wait()
            ready = [item for item in items if item.encoded is not None]
            for item in ready:
                if isinstance(item.encoded, Exception):
                    raise item.encoded
            rest = [item for item in items if item.encoded is None]
            items = ready + rest  # the order of rows in the batch does not matter
            batch = self._batch(key)
            sentences = [_sentence(item) for item in items]
            encoded = [item.encoded for item in ready]
            if rest:
                encoding = loop.clock()
                encoded.append(batch.encode(sentences[len(ready) :]))
                _trace_encoding(rest, encoding, loop.clock())
            for item in ready:
                item.encoded = None  # its arrays are copied into the batch's
            batch.join(sentences, encoded)
            decoding = loop.clock()
        except Exception as error:
            log.warning("joining %d sentences failed (%s); decoding them alone", len(items), error)
            self._isolate(key, items)
            return
        running = self._running.setdefault(key, {})
        for item in items:
            running[item] = None
            if item.job.started is None:
                item.job.started = started
            self._next_deadline = min(self._next_deadline, item.job.deadline)
            if item.job.trace is not None:
                item.job.trace.joined(item.index, started, decoding, item.tokens)
        if loop._observer:
            loop._observer.observe_join(
                loop.model,
                waits=[started - item.enqueued for item in items],
                input_tokens=sum(item.tokens for item in items),
                seconds=loop.clock() - started,
            )

    def _step(self, keys: list[Hashable]) -> bool:
        """One decoder step of the running batches of `keys` (one, or several together);
        True if sentences left them."""
        loop = self.loop
        batches = [self._batches[key] for key in keys]
        for key in keys:
            self._steps_since_join[key] = self._steps_since_join.get(key, 0) + 1
        sentences = sum(len(batch) for batch in batches)
        rows = sum(batch.rows for batch in batches)
        started = loop.clock()
        try:
            if len(batches) == 1:
                finished = batches[0].step()
            else:
                finished = [f for ended in loop._step_together(batches) for f in ended]
        except Exception as error:
            log.warning("a step of %d sentences failed (%s); decoding them alone", sentences, error)
            for key in keys:
                self._isolate(key, [])
            return True
        if loop._observer:
            loop._observer.observe_step(
                loop.model,
                sentences=sentences,
                rows=rows,
                output_tokens=sum(len(f.hypotheses[0].tokens) for f in finished),
                seconds=loop.clock() - started,
            )
        self._settle(finished, [])
        return bool(finished)

    def _drop_abandoned(self) -> None:
        """Rows of requests that were cancelled (client gone, or the request gave up) or are
        past their deadline leave the running batches instead of being decoded for nobody.
        Most turns nobody did: it looks only once a job was closed early or the earliest
        running deadline passed (a look at every sentence each step cost 3-10 µs a step)."""
        now = self.loop.clock()
        jobs_closed = self.loop._jobs_closed  # read without the lock: a change shows next turn
        if jobs_closed == self._jobs_closed_seen and now < self._next_deadline:
            return
        self._jobs_closed_seen = jobs_closed
        for batch in self._batches.values():
            if len(batch):
                gone = batch.drop(lambda s: s.ticket.job.closed or s.ticket.job.deadline <= now)
                if gone:
                    self._settle([], gone)
        self._next_deadline = min(
            (item.job.deadline for running in self._running.values() for item in running),
            default=math.inf,
        )

    def _settle(self, finished: list[Finished], gone: list[Finished]) -> None:
        """Record who ended here, then answer the requests that are now complete and 504 to
        those whose sentences left because their deadline passed (the loop's jobs)."""
        if not (finished or gone):  # most steps: nobody ended (this runs at every step)
            return
        for ended in (finished, gone):
            for done in ended:
                item: QueuedSentence = done.sentence.ticket
                self._running.get(item.key, {}).pop(item, None)
        self.loop._settle_jobs(finished, gone)

    def _isolate(self, key: Hashable, joining: list[QueuedSentence]) -> None:
        """The engine failed on a batch: start that beam size's batch afresh and decode each
        of its sentences (and those that were joining) alone, to fail only the culprits."""
        loop = self.loop
        if loop._observer:
            loop._observer.observe_batch_failure(loop.model)
        self._batches.pop(key, None)
        # `joining` are not in `_running` yet, even where a join failed midway: each
        # sentence is decoded (and answered) once.
        items = [*self._running.pop(key, {}), *joining]
        for item in items:
            if item.job.closed:
                continue
            alone = loop._new_batch(key)
            try:
                alone.join([_sentence(item)])
                finished: list[Finished] = []
                while len(alone):
                    finished += alone.step()
            except Exception as error:
                loop._fail(item, error)
                if loop._observer:
                    loop._observer.observe_left(loop.model, "failed", 1)
                continue
            self._settle(finished, [])

    def _fail_running(self, error: Exception) -> None:
        self._batches = {}
        running, self._running = self._running, {}
        for items in running.values():
            for item in items:
                self.loop._fail(item, error)


def _trace_encoding(items: list[QueuedSentence], started: float, ended: float) -> None:
    """One encoder call encoded `items`: written down for the traced ones."""
    for item in items:
        if item.job.trace is not None:
            item.job.trace.encoded(item.index, started, ended, len(items))


def _short(error: Exception, limit: int = 300) -> str:
    """Engine errors can be long (ONNX Runtime stack details): keep the first line, bounded."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
