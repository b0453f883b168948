"""Deadline-aware admission: take only the work the model can finish before its deadline.

A queue bounded by its length alone admits work it cannot finish in time: with a 1 s deadline
and arrivals at 1.5x capacity, nearly every admitted request was decoded halfway and then
answered 504, and almost nothing succeeded (docs/reliability.md). What a request needs is
time, so the queue is bounded in time instead, by two measurements:

* the join rate: queued sentences the worker takes into its batches per second, measured
  only over intervals in which sentences were left waiting (then the rate is the model's
  capacity, not the arrival rate);
* the service time: seconds from joining a batch to leaving it finished, per source token
  (a sentence's steps grow with its length) and per batch key (beam size), an exponentially
  weighted mean.

A request with n sentences behind `ahead` queued ones is expected to finish after
(ahead + n) / rate + the service time of its longest sentence. Unless that leaves a margin
(ADMIT_WITHIN of the time it has), it is refused at once with 429 and a Retry-After of the
excess (how long the backlog takes to shrink by that much), instead of costing decoder steps
it cannot use. A queued sentence whose remaining time is shorter than its service time is
dropped before it joins (`hopeless`): it would fail anyway.

Until a rate has been measured (a server that has not yet been busy) everything is admitted;
the queue's length limit still applies. A plain object: times are passed in, so tests drive
it with made-up clocks; the waiting queue and the decoding loop call it under the loop's lock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

# Join-rate samples kept (each: an interval between two joins while sentences waited, and the
# sentences the second one took); about the last second or two of a busy worker.
RATE_SAMPLES = 64
# Weight of the newest service time in the running mean (about the last 20 sentences).
SERVICE_WEIGHT = 0.05
# A request is admitted when its forecast takes at most this share of the time it has: the
# forecast is a mean, and one that needs all of it misses about half the time (measured at 2x
# capacity with a 1 s deadline: a fifth of what was admitted then got 504, docs/reliability.md).
ADMIT_WITHIN = 0.8


@dataclass(frozen=True)
class Forecast:
    """When a request would finish, as expected now."""

    finish: float  # on the decoding loop's clock
    wait: float  # seconds until its last sentence joins
    service: float  # seconds its longest sentence then takes
    rate: float  # sentences joined per second (the measured capacity)

    def fits(self, now: float, deadline: float) -> bool:
        """Finishes within ADMIT_WITHIN of the time left until `deadline`."""
        return self.finish - now <= ADMIT_WITHIN * (deadline - now)


class DeadlineAdmission:
    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque(maxlen=RATE_SAMPLES)
        self._last_join: float | None = None
        self._left_waiting = False  # the last join left sentences in the queue
        self._seconds_per_token: dict[Hashable, float] = {}

    @property
    def rate(self) -> float | None:
        """Sentences joined per second while some waited, or None before any was measured."""
        seconds = sum(interval for interval, _ in self._samples)
        if not self._samples or seconds <= 0:
            return None
        return sum(count for _, count in self._samples) / seconds

    def service_time(self, key: Hashable, tokens: int) -> float:
        """Mean seconds from join to finish for a sentence of `key` with `tokens` source
        tokens (0 before any finished)."""
        return self._seconds_per_token.get(key, 0.0) * tokens

    def joined(self, now: float, count: int, still_queued: int) -> None:
        """`count` sentences joined at `now`, leaving `still_queued` in the queue."""
        if self._left_waiting and self._last_join is not None and now > self._last_join:
            # Sentences waited for the whole interval: the worker took them as fast as it could.
            self._samples.append((now - self._last_join, count))
        self._last_join = now
        self._left_waiting = still_queued > 0

    def queue_emptied(self) -> None:
        """The queue emptied otherwise than by a join (cancelled or expired): the time until
        the next join is not the worker's."""
        self._left_waiting = False

    def finished(self, key: Hashable, seconds: float, tokens: int) -> None:
        """A sentence of `key` with `tokens` source tokens finished `seconds` after it joined."""
        sample = seconds / max(tokens, 1)
        previous = self._seconds_per_token.get(key)
        self._seconds_per_token[key] = (
            sample if previous is None else previous + SERVICE_WEIGHT * (sample - previous)
        )

    def forecast(
        self, now: float, ahead: int, count: int, key: Hashable, longest: int
    ) -> Forecast | None:
        """When `count` sentences of `key` (the longest of `longest` source tokens) queued
        behind `ahead` others would finish, or None while no rate is known."""
        rate = self.rate
        if rate is None:
            return None
        wait = (ahead + count) / rate
        service = self.service_time(key, longest)
        return Forecast(now + wait + service, wait, service, rate)

    def hopeless(self, now: float, deadline: float, key: Hashable, tokens: int) -> bool:
        """A queued sentence that cannot finish by its deadline even if it joined now."""
        return deadline - now < self.service_time(key, tokens)


def retry_after(forecast: Forecast, now: float, deadline: float) -> int:
    """Whole seconds until the backlog has shrunk enough for the same request to fit."""
    allowed = now + ADMIT_WITHIN * (deadline - now)
    return max(1, math.ceil(forecast.finish - allowed))
