"""The waiting queue: what waits for the decoding loop (service/serving/loop.py), and which of
it is admitted, joins a running batch, or has expired.

Each request is a `Job`, queued as one `QueuedSentence` per sentence. A job is interactive
(a client waits for it) or `background` (a document's chunk): background sentences join a
running batch only after every interactive sentence that fits has joined, and never count
against an interactive job's admission, so that a 300-page upload never starves a request a
person is waiting for (it only takes the room they leave). Admission is bounded
twice: by the queue's length (`QueueFull`), and by time (service/serving/admission.py): a job
that the backlog would keep past its deadline is refused at once (`Backlogged`), and a queued
sentence that can no longer finish in time is found by `expired_jobs` before it costs a step.

`WaitingQueue` has no thread, no clock and no lock of its own, and calls nothing back in the
loop or the runtime: it is given times, each sentence's cost (when queued) and each running
batch's room (`Room`) as numbers, and the admission that the loop keeps measuring, so it is
tested with made-up ones. The loop holds its lock around every call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING

from nmt_contract import Hypothesis
from service.runtime.search import SearchOptions, batch_key
from service.serving.admission import DeadlineAdmission, retry_after
from service.serving.errors import Backlogged, QueueFull
from service.serving.terminology import SentenceTerms

if TYPE_CHECKING:
    from service.serving.tracing import JobTrace


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
        terms: list[SentenceTerms | None] | None = None,
        background: bool = False,
    ) -> None:
        self.sources = sources
        self.background = background
        self.options = options
        # per source: the glossary terms its translation must contain (None: none)
        self.terms = terms if terms is not None else [None] * len(sources)
        self.key = batch_key(options)  # the running batch its sentences share
        self.deadline = deadline  # on the decoding loop's clock
        self.timeout = deadline - now
        self.created = now
        self.started: float | None = None  # when its first sentence reached the engine
        self.output_tokens = 0
        self.results: list[list[Hypothesis] | None] = [None] * len(sources)
        self.remaining = len(sources)
        self.closed = False  # finished, failed or cancelled: no more work (loop's lock)
        self.trace: JobTrace | None = None  # its times, for its spans, when it is traced
        self.future: asyncio.Future[list[list[Hypothesis]]] = loop.create_future()
        self._loop = loop

    def record(self, index: int, hypotheses: list[Hypothesis]) -> bool:
        """Store sentence `index`'s result; True when that completes the job (then closed)."""
        self.results[index] = hypotheses
        self.output_tokens += len(hypotheses[0].tokens)
        self.remaining -= 1
        if self.remaining:
            return False
        self.closed = True
        return True

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


@dataclass(eq=False)  # each is its own entry, even with the same fields
class QueuedSentence:
    """Sentence `index` of `job`, queued at time `enqueued`; joining a running batch of its
    key reserves `cost` tokens of that batch (priced by the loop when it was queued)."""

    job: Job
    index: int
    enqueued: float
    cost: int
    tokens: int = field(init=False)  # in its source
    # The loop may encode a queued sentence ahead, on a thread of its own: while that runs
    # `encoding` is True, then `encoded` holds the joining state (or the exception).
    encoding: bool = field(default=False, init=False)
    encoded: object = field(default=None, init=False)
    joined: float | None = field(default=None, init=False)  # when it reached the engine

    def __post_init__(self) -> None:
        self.tokens = len(self.job.sources[self.index])

    @property
    def key(self) -> Hashable:
        return self.job.key

    @property
    def source(self) -> list[int]:
        return self.job.sources[self.index]


@dataclass(frozen=True)
class Room:
    """What the running batch of one key may take now: sentences, reserved tokens (source
    plus the self-attention cache its rows may grow to), and whether it is empty (then it
    takes its first sentence whatever its cost, so that every sentence can be served).

    `hold_for_encoding`: if a sentence it would take is still being encoded ahead, the batch
    takes none this turn and steps meanwhile, rather than wait for the encoder (the loop
    allows it one turn in a row, so that a join is never put off for ever)."""

    sentences: int
    tokens: int
    empty: bool
    hold_for_encoding: bool = False


@dataclass
class Joiners:
    """What `take_joiners` took off the queue, and the keys whose join it held back for a
    sentence still being encoded."""

    taken: list[QueuedSentence]
    held_back: set[Hashable]


class WaitingQueue:
    """Queued sentences, oldest first, of one model: the interactive ones, then the background
    ones. Not thread-safe (see the module)."""

    def __init__(
        self,
        model: str,
        max_queued: int,
        retry_after: int,
        admission: DeadlineAdmission | None = None,
    ) -> None:
        self.model = model
        self.max_queued = max_queued  # sentences waiting (not counting those running)
        self.retry_after = retry_after  # seconds, told to clients refused with QueueFull
        # Shared with the loop, which reports joins and finished sentences to it.
        self.admission = admission if admission is not None else DeadlineAdmission()
        self._items: deque[QueuedSentence] = deque()  # interactive
        self._background: deque[QueuedSentence] = deque()

    def __len__(self) -> int:
        return len(self._items) + len(self._background)

    def __iter__(self) -> Iterator[QueuedSentence]:
        return chain(self._items, self._background)

    def add(self, job: Job, now: float, costs: list[int]) -> None:
        """Queue every sentence of a job (`costs`: each one's, see QueuedSentence), or raise
        QueueFull or Backlogged. A job that finds the queue empty is admitted whatever its
        size and its forecast: nothing else can be done for it, and it may be shorter than
        the mean. A background job is always admitted: its caller bounds what it queues (a
        document's chunk at a time), and interactive work goes first anyway."""
        indices = range(len(job.sources))
        items = [QueuedSentence(job, i, now, cost) for i, cost in zip(indices, costs, strict=True)]
        if job.background:
            self._background.extend(items)
            return
        ahead = len(self._items)
        if ahead:
            self._check_deadline(job, now, ahead)
            if ahead + len(job.sources) > self.max_queued:
                raise QueueFull(self.model, ahead, self.max_queued, self.retry_after)
        self._items.extend(items)

    def _check_deadline(self, job: Job, now: float, ahead: int) -> None:
        longest = max((len(source) for source in job.sources), default=0)
        forecast = self.admission.forecast(now, ahead, len(job.sources), job.key, longest)
        if forecast is not None and not forecast.fits(now, job.deadline):
            raise Backlogged(
                self.model, ahead, forecast, job.timeout, retry_after(forecast, now, job.deadline)
            )

    def remove(self, job: Job) -> int:
        """Drop a job's queued sentences; returns how many there were."""
        before = len(self)
        if job.background:
            self._background = deque(item for item in self._background if item.job is not job)
        else:
            self._items = deque(item for item in self._items if item.job is not job)
        if not self._items:
            self.admission.queue_emptied()
        return before - len(self)

    def waiting(self) -> dict[Hashable, int]:
        """How many sentences wait, per key."""
        counts: dict[Hashable, int] = {}
        for item in self:
            counts[item.key] = counts.get(item.key, 0) + 1
        return counts

    def interactive_waiting(self) -> set[Hashable]:
        """The keys that interactive sentences wait for."""
        return {item.key for item in self._items}

    def expired_jobs(self, now: float) -> list[tuple[Job, bool]]:
        """The distinct jobs with queued sentences whose deadline has passed (False) or which
        can no longer finish before it, their time left being shorter than a sentence's
        service time (True), oldest first."""
        found: dict[int, tuple[Job, bool]] = {}
        for item in self:
            job = item.job
            if id(job) in found:
                continue
            if job.deadline <= now:
                found[id(job)] = (job, False)
            elif self.admission.hopeless(now, job.deadline, job.key, item.tokens):
                found[id(job)] = (job, True)
        return list(found.values())

    def take_joiners(self, rooms: dict[Hashable, Room]) -> Joiners:
        """Continuous batching: the queued sentences that join the running batches now, taken
        off the queue. Oldest first; for each key in `rooms`, until one does not fit. Later
        sentences of that key then wait too, so that a long sentence is never overtaken for
        ever by shorter ones. Interactive sentences first, then background ones (which an
        interactive sentence that does not fit holds back too).

        A batch whose room may `hold_for_encoding` takes none this turn if one of those it
        would take is still `encoding`: the loop then steps instead of waiting for the
        encoder, and they join together at a later turn."""
        taken: list[QueuedSentence] = []
        left = {key: (room.sentences, room.tokens, room.empty) for key, room in rooms.items()}
        blocked: set[Hashable] = set()
        held_back: set[Hashable] = set()
        for item in self:
            key = item.key
            if key in blocked or key not in left:
                continue
            sentences, tokens, empty = left[key]
            if sentences < 1 or (item.cost > tokens and not empty):
                blocked.add(key)
                continue
            if item.encoding and rooms[key].hold_for_encoding:
                blocked.add(key)
                held_back.add(key)
                continue
            taken.append(item)
            left[key] = (sentences - 1, tokens - item.cost, False)
        taken = [item for item in taken if item.key not in held_back]
        if taken:
            chosen = {id(item) for item in taken}
            self._items = deque(item for item in self._items if id(item) not in chosen)
            self._background = deque(item for item in self._background if id(item) not in chosen)
        return Joiners(taken, held_back)
