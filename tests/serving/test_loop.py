"""The decoding loop with no model at all: a fake running batch and a fake clock.

The loop is driven turn by turn with `work_once` (no worker thread, no sleeps, no timing
thresholds), except where threads are what is tested (draining on close, a join and the
encoder thread). tests/runtime/test_running_batch.py checks the same loop on the real
engine against decoding each sentence alone; tests/serving/test_queue.py, who joins.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from nmt_contract import Hypothesis
from service.runtime.search import Finished, SearchOptions, Sentence
from service.serving.admission import DeadlineAdmission
from service.serving.errors import DeadlineExceeded, ShuttingDown
from service.serving.loop import BatchLimits, DecodingLoop, SentenceFailed
from service.serving.metrics import Metrics
from service.serving.queue import Job

GREEDY = SearchOptions(beam_size=1)
BEAM = SearchOptions(beam_size=2)
POISON = -1  # a step with this token in a source fails, as the engine fails on a bad input
UNENCODABLE = -2  # encoding a source with this token fails
HALF_JOINS = -3  # a join with this token fails after the batch took the sentences in
FAR = 1e9  # a deadline that never comes


def sentence(n: int, steps: int = 3) -> list[int]:
    """A made-up source the fake decodes in `steps` steps: `steps` - 1 tokens n, then </s>."""
    return [n] * (steps - 1) + [2]


def answer(source: list[int]) -> list[Hypothesis]:
    """What the fake model translates a source to: its tokens reversed, without </s>."""
    return [Hypothesis(tokens=source[-2::-1], score=-float(len(source)), log_prob=-1.0)]


class Gate:
    """Holds a fake batch's calls midway, as a slow engine would: `entered` is set once a call
    is under way, which then waits until `opened` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def pass_through(self) -> None:
        self.entered.set()
        assert self.opened.wait(10), "the test never let the encoder go on"


class FakeBatch:
    """A running batch whose sentences each take len(source) steps. It records who was in it
    at every step, reserves len(source) * (1 + beams) tokens a sentence, and fails a step while
    it holds POISON. Encoding ahead waits at `encoder_gate`, a step at `step_gate`, if any."""

    def __init__(
        self,
        beams: int,
        log: list,
        encoded: list,
        encoder_gate: Gate | None = None,
        step_gate: Gate | None = None,
    ) -> None:
        self.beams = beams
        self.sentences: list[Sentence] = []
        self.done_steps: dict[int, int] = {}  # id(sentence) -> steps taken
        self.log = log  # (beams, [ticket labels at this step]) per step, shared by all batches
        self.encoded = encoded  # the labels of each encode() call, shared by all batches
        self.encoder_gate, self.step_gate = encoder_gate, step_gate

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def rows(self) -> int:
        return len(self.sentences) * self.beams

    def cost_of(self, sentence: Sentence) -> int:
        return len(sentence.source) * (1 + self.beams)

    def reserved_tokens(self) -> int:
        return sum(self.cost_of(s) for s in self.sentences)

    def encode(self, sentences: list[Sentence]) -> list[Sentence]:
        if any(UNENCODABLE in s.source for s in sentences):
            raise RuntimeError("the encoder failed on this input")
        self.encoded.append([label(s) for s in sentences])
        return list(sentences)  # what a real batch's joining state would hold: these sources

    def encode_each(self, sentences: list[Sentence]) -> list[list[Sentence]]:
        if self.encoder_gate is not None:
            self.encoder_gate.pass_through()
        return [[s] for s in self.encode(sentences)]

    def join(self, sentences: list[Sentence], encoded: list | None = None) -> None:
        if encoded is None:
            encoded = [self.encode(sentences)]
        # each sentence encoded once, in the order given
        assert [s.ticket for part in encoded for s in part] == [s.ticket for s in sentences]
        self.sentences += sentences
        for s in sentences:
            self.done_steps[id(s)] = 0
        if any(HALF_JOINS in s.source for s in sentences):
            raise RuntimeError("the join failed midway")

    def step(self) -> list[Finished]:
        if self.step_gate is not None:
            self.step_gate.pass_through()
        self.log.append((self.beams, [label(s) for s in self.sentences]))
        if any(POISON in s.source for s in self.sentences):
            raise RuntimeError("the engine failed on this input")
        finished = []
        for s in self.sentences:
            self.done_steps[id(s)] += 1
            if self.done_steps[id(s)] >= len(s.source):
                finished.append(Finished(s, answer(s.source), self.done_steps[id(s)]))
        self.sentences = [s for s in self.sentences if self.done_steps[id(s)] < len(s.source)]
        return finished

    def drop(self, condition: Callable[[Sentence], bool]) -> list[Finished]:
        gone = [s for s in self.sentences if condition(s)]
        self.sentences = [s for s in self.sentences if not condition(s)]
        return [Finished(s, [], self.done_steps[id(s)]) for s in gone]


def label(s: Sentence) -> str:
    """'job name/sentence index' of a sentence in the running batch."""
    return f"{s.ticket.job.name}/{s.ticket.index}"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A DecodingLoop over FakeBatches, driven by hand. `encoder_gate` and `step_gate`, set
    before the loop makes its batches, hold their encodings ahead or their steps (Gate)."""

    def __init__(self, together: bool = False, **limits) -> None:
        limits = {"join_ratio": 0.0, "join_max_steps": 0, **limits}  # join at every step
        self.steps: list[tuple[int, list[str]]] = []
        self.together: list[list[int]] = []  # the beam sizes of each step taken together
        self.encoded: list[list[str]] = []  # each encode() call's sentences, ahead or at a join
        self.encoder_gate: Gate | None = None
        self.step_gate: Gate | None = None

        def new_batch(beams: int) -> FakeBatch:
            return FakeBatch(beams, self.steps, self.encoded, self.encoder_gate, self.step_gate)

        self.clock = FakeClock()
        self.metrics = Metrics()
        self.admission = DeadlineAdmission()  # what the loop measured, for the tests to read
        self.loop = DecodingLoop(
            ("fr-en", ""),
            new_batch,
            BatchLimits(**limits),
            self.metrics,
            clock=self.clock,
            step_together=self.step_together if together else None,
            admission=self.admission,
        )

    def step_together(self, batches: list[FakeBatch]) -> list[list[Finished]]:
        self.together.append([batch.beams for batch in batches])
        return [batch.step() for batch in batches]  # (each logs its step in self.steps)

    def submit(
        self,
        name: str,
        sources: list[list[int]],
        options=GREEDY,
        timeout=FAR,
        background: bool = False,
    ) -> Job:
        job = self.loop.submit(sources, options, self.clock.now + timeout, background=background)
        job.name = name
        return job

    async def turns(self, count: int) -> None:
        """Run `count` turns of the loop, then let the answered futures resolve."""
        for _ in range(count):
            self.loop.work_once()
        await asyncio.sleep(0)

    def metric(self, name: str, **labels) -> float:
        value = self.metrics.registry.get_sample_value(
            name, {"model": "fr-en", "version": "", **labels}
        )
        return value or 0.0


def run(test) -> None:
    asyncio.run(test())


# The loop, turn by turn.


def test_a_sentence_joins_the_running_batch_at_the_next_step_not_after_it():
    async def test():
        h = Harness()
        h.submit("a", [sentence(1, steps=6)])
        await h.turns(2)
        h.submit("b", [sentence(2, steps=2)])
        await h.turns(1)
        assert h.steps == [(1, ["a/0"]), (1, ["a/0"]), (1, ["a/0", "b/0"])]

    run(test)


def test_a_request_is_answered_when_its_last_sentence_ends_not_when_the_batch_does():
    async def test():
        h = Harness()
        long = h.submit("long", [sentence(1, steps=10)])
        short = h.submit("short", [sentence(2, steps=2), sentence(3, steps=3)])
        await h.turns(2)
        assert not short.future.done()  # its second sentence needs a third step
        await h.turns(1)
        assert short.future.result() == [answer(sentence(2, 2)), answer(sentence(3, 3))]
        assert not long.future.done()
        await h.turns(7)
        assert long.future.result() == [answer(sentence(1, 10))]
        assert h.steps[2:4] == [(1, ["long/0", "short/1"]), (1, ["long/0"])]  # left at once

    run(test)


def test_one_batch_holds_different_lengths_penalties_and_n_best_but_not_beam_sizes():
    async def test():
        h = Harness()
        options = [
            SearchOptions(max_length=5),
            SearchOptions(length_penalty=0.6),
            SearchOptions(beam_size=2, n_best=2, max_length=7),
            SearchOptions(beam_size=2, length_penalty=1.2),
        ]
        jobs = [h.submit(f"j{i}", [sentence(i + 1)], o) for i, o in enumerate(options)]
        await h.turns(6)
        assert all(job.future.done() for job in jobs)
        # One running batch per beam size; the one with the oldest sentence steps first.
        assert h.steps == [(1, ["j0/0", "j1/0"])] * 3 + [(2, ["j2/0", "j3/0"])] * 3

    run(test)


def test_small_batches_of_different_beam_sizes_step_together_and_large_ones_take_turns():
    async def test():
        h = Harness(together=True)
        greedy = h.submit("g", [sentence(1, steps=3), sentence(2, steps=3)])
        beam = h.submit("b", [sentence(3, steps=2)], BEAM)
        await h.turns(2)  # 2 + 2 rows: both batches step at every turn, in one call
        assert h.together == [[1, 2], [1, 2]]
        assert h.steps == [(1, ["g/0", "g/1"]), (2, ["b/0"])] * 2
        await h.turns(1)  # the beam sentence is done: the greedy batch steps alone
        assert h.together == [[1, 2], [1, 2]] and h.steps[-1] == (1, ["g/0", "g/1"])
        assert greedy.future.done() and beam.future.done()

        # 10 + 2 x 4 rows: more than STEP_TOGETHER_ROWS; first come, first served again
        h.steps.clear()
        h.submit("G", [sentence(n, steps=2) for n in range(1, 11)])
        h.submit("B", [sentence(n, steps=2) for n in range(1, 5)], BEAM)
        await h.turns(4)
        assert h.together == [[1, 2], [1, 2]]
        assert [beams for beams, _ in h.steps] == [1, 1, 2, 2]

    run(test)


def test_a_step_taken_together_that_fails_fails_only_the_culprits_request():
    async def test():
        h = Harness(together=True)
        fine = h.submit("fine", [sentence(1, steps=3)], BEAM)
        culprit = h.submit("culprit", [sentence(2), [5, POISON, 2]])
        await h.turns(1)
        assert h.together == [[2, 1]]  # the step together failed on the greedy batch
        assert fine.future.result() == [answer(sentence(1, 3))]  # decoded again, alone
        error = culprit.future.exception()
        assert isinstance(error, SentenceFailed) and error.index == 1

    run(test)


def test_waiting_sentences_join_together_when_enough_wait_or_enough_steps_passed():
    async def test():
        h = Harness(join_ratio=0.5, join_max_steps=3)
        h.submit("a", [sentence(n, steps=20) for n in range(1, 5)])  # 4 running
        await h.turns(1)
        h.submit("b", [sentence(5, steps=20)])  # 1 waiting < 0.5 x 4: not yet
        await h.turns(2)
        assert "b/0" not in h.steps[-1][1]
        await h.turns(1)  # 3 steps since the last join: now
        assert "b/0" in h.steps[-1][1]
        h.submit("c", [sentence(n, steps=20) for n in range(6, 9)])  # 3 waiting >= 0.5 x 5
        await h.turns(1)
        assert {"c/0", "c/1", "c/2"} <= set(h.steps[-1][1])

    run(test)


def test_a_request_joins_a_batch_of_document_sentences_at_once_not_when_a_join_pays():
    async def test():
        h = Harness(join_ratio=0.5, join_max_steps=10)
        h.submit("doc", [sentence(n, steps=20) for n in range(1, 9)], background=True)
        await h.turns(1)  # 8 document sentences run
        h.submit("late-doc", [sentence(9, steps=20)], background=True)
        await h.turns(2)
        assert "late-doc/0" not in h.steps[-1][1]  # background work waits for a join that pays
        h.submit("person", [sentence(10, steps=20)])  # 1 waiting < 0.5 x 8, yet it joins now
        await h.turns(1)
        assert "person/0" in h.steps[-1][1]

    run(test)


def test_with_a_full_queue_sentences_join_when_enough_places_are_free_not_at_every_leave():
    async def test():
        h = Harness(max_sentences=4, join_ratio=0.5, join_max_steps=10)
        # 4 running, ending at steps 2, 3, 4 and 9; 10 more waiting all along
        h.submit("a", [sentence(1, steps=2), sentence(2, steps=3), sentence(3, steps=4)])
        h.submit("b", [sentence(4, steps=9)])
        h.submit("c", [sentence(n, steps=20) for n in range(5, 15)])
        await h.turns(3)  # a/0 left after step 2: 1 place for 10 waiting, 1 < 0.5 x 3 running
        assert h.steps[-1][1] == ["a/1", "a/2", "b/0"]
        await h.turns(1)  # a/1 left after step 3: 2 places, 2 >= 0.5 x 2 running: both join
        assert h.steps[-1][1] == ["a/2", "b/0", "c/0", "c/1"]

    run(test)


def test_sentences_encoded_ahead_join_without_being_encoded_again():
    async def test():
        h = Harness()
        a = h.submit("a", [sentence(1), sentence(2)])
        assert h.loop.encode_once()  # both, in one call
        b = h.submit("b", [sentence(3)])
        await h.turns(1)  # all three join: two already encoded, the third now
        assert h.encoded == [["a/0", "a/1"], ["b/0"]]
        assert sorted(h.steps[0][1]) == ["a/0", "a/1", "b/0"]
        await h.turns(2)
        assert a.future.result() == [answer(sentence(1)), answer(sentence(2))]
        assert b.future.result() == [answer(sentence(3))]

    run(test)


def test_a_join_waits_one_step_for_an_encoding_in_progress_then_waits_for_the_encoder():
    """The worker steps instead of waiting for the encoder thread, but only once: where
    sentences keep arriving one would be in the encoder at every turn."""

    async def test():
        h = Harness()
        gate = h.encoder_gate = Gate()
        h.submit("a", [sentence(1, steps=6)])
        await h.turns(1)  # a joins (the worker encodes it) and runs
        h.submit("b", [sentence(2, steps=2)])
        encoder = threading.Thread(target=h.loop.encode_once, daemon=True)
        encoder.start()
        assert gate.entered.wait(10)  # b is in the encoder

        turn = threading.Thread(target=h.loop.work_once, daemon=True)
        turn.start()
        turn.join(10)  # (a regression would wait for ever: fail instead of hanging)
        waited = turn.is_alive()
        if waited:
            gate.opened.set()
        assert not waited, "the worker waited for the encoder instead of stepping"
        assert h.steps[-1] == (1, ["a/0"]) and h.loop.queued == 1  # a alone

        # Next turn b is still in the encoder: the join takes it now and waits for it.
        turn = threading.Thread(target=h.loop.work_once, daemon=True)
        turn.start()
        deadline = time.monotonic() + 10  # (only a regression gets near it)
        while h.loop.queued and time.monotonic() < deadline:
            time.sleep(0.001)
        taken = not h.loop.queued
        assert turn.is_alive() or not taken, "the join did not wait for the encoder"
        gate.opened.set()
        turn.join(10)
        encoder.join(10)
        assert taken, "the join was held back a second time"
        assert h.steps[-1] == (1, ["a/0", "b/0"])
        assert h.encoded == [["a/0"], ["b/0"]]  # b encoded once, ahead

    run(test)


def test_encoding_ahead_waits_while_nothing_runs():
    """With nothing running the worker joins what is queued at once and encodes it itself:
    handing a lone request to the encoder thread and back would only add latency."""

    async def test():
        h = Harness(max_sentences=1)
        h.submit("a", [sentence(1, steps=2), sentence(2, steps=2)])
        assert h.loop.to_encode_ahead() == []  # idle
        await h.turns(1)  # a/0 joins (the worker encodes it) and runs; a/1 waits for a place
        assert h.encoded == [["a/0"]]
        assert [f"{i.job.name}/{i.index}" for i in h.loop.to_encode_ahead()] == ["a/1"]
        await h.turns(3)  # a/0 ends, a/1 joins, a/1 ends
        assert h.loop.running == 0
        h.submit("b", [sentence(3)])
        assert h.loop.to_encode_ahead() == []  # idle again

    run(test)


def test_encoding_ahead_groups_a_few_sentences_of_one_beam_size_oldest_first():
    async def test():
        h = Harness()
        h.submit("a", [sentence(1)])
        h.submit("b", [sentence(2)], options=BEAM)
        h.submit("c", [sentence(n) for n in range(3, 9)])
        while h.loop.encode_once():
            pass
        assert h.encoded == [["a/0", "c/0", "c/1", "c/2"], ["b/0"], ["c/3", "c/4", "c/5"]]

    run(test)


def test_encoding_ahead_stops_max_sentences_ahead_of_the_joins():
    async def test():
        h = Harness(max_sentences=2)
        h.submit("a", [sentence(n) for n in range(1, 6)])
        assert [h.loop.encode_once() for _ in range(2)] == [True, False]
        await h.turns(1)  # two join: room to encode two more
        assert [h.loop.encode_once() for _ in range(2)] == [True, False]
        assert h.encoded == [["a/0", "a/1"], ["a/2", "a/3"]]

    run(test)


def test_a_sentence_that_fails_to_encode_ahead_fails_only_its_own_request():
    async def test():
        h = Harness()
        first = h.submit("first", [sentence(1, steps=3)])
        culprit = h.submit("culprit", [sentence(2), [5, UNENCODABLE, 2]])
        while h.loop.encode_once():  # the failure is kept until the join
            pass
        await h.turns(3)
        assert first.future.result() == [answer(sentence(1, 3))]
        error = culprit.future.exception()
        assert isinstance(error, SentenceFailed) and error.index == 1

    run(test)


def test_the_running_batch_stays_within_its_sentence_and_token_limits():
    async def test():
        h = Harness(max_sentences=2, max_total_tokens=100)
        h.submit("a", [sentence(n, steps=4) for n in range(1, 6)])  # 8 tokens each
        await h.turns(1)
        assert h.steps[-1] == (1, ["a/0", "a/1"])
        assert h.loop.queued == 3
        h2 = Harness(max_sentences=10, max_total_tokens=20)
        h2.submit("b", [sentence(n, steps=4) for n in range(1, 6)])
        await h2.turns(1)
        assert h2.steps[-1] == (1, ["b/0", "b/1"])  # 16 of 20 tokens: a third would pass

    run(test)


def test_a_sentence_whose_deadline_passes_leaves_the_batch_and_its_request_gets_a_504():
    async def test():
        h = Harness()
        late = h.submit("late", [sentence(1, steps=9), sentence(2, steps=9)], timeout=5.0)
        other = h.submit("other", [sentence(3, steps=4)])
        await h.turns(2)
        h.clock.now += 5.0
        await h.turns(1)  # the late rows leave before the step
        assert isinstance(late.future.exception(), DeadlineExceeded)
        assert h.steps[-1] == (1, ["other/0"])
        await h.turns(1)
        assert other.future.result() == [answer(sentence(3, 4))]
        assert h.metric("nmt_batch_left_sentences_total", reason="abandoned") == 2

    run(test)


def test_a_sentence_that_joins_later_with_an_earlier_deadline_leaves_when_it_passes():
    """The loop looks for abandoned rows only once a job was closed early or the earliest
    running deadline passed: a later join with a shorter deadline moves that earliest one."""

    async def test():
        h = Harness()
        patient = h.submit("patient", [sentence(1, steps=9)], timeout=100.0)
        await h.turns(2)
        hasty = h.submit("hasty", [sentence(2, steps=9)], timeout=5.0)
        await h.turns(1)  # hasty joins
        assert h.steps[-1] == (1, ["patient/0", "hasty/0"])
        h.clock.now += 5.0
        await h.turns(1)
        assert isinstance(hasty.future.exception(), DeadlineExceeded)
        assert h.steps[-1] == (1, ["patient/0"])
        h.clock.now += 95.0
        await h.turns(1)
        assert isinstance(patient.future.exception(), DeadlineExceeded)
        assert h.loop.running == 0

    run(test)


def test_a_cancelled_request_leaves_the_running_batch_and_the_queue():
    async def test():
        h = Harness(max_sentences=1)
        gone = h.submit("gone", [sentence(1, steps=9), sentence(2, steps=9)])
        await h.turns(1)
        h.loop.cancel(gone, "client_gone")
        assert h.loop.queued == 0  # its second sentence never joins
        stay = h.submit("stay", [sentence(3, steps=2)])
        await h.turns(2)  # gone/0 leaves before the next step; stay/0 takes its place
        assert [labels for _, labels in h.steps] == [["gone/0"], ["stay/0"], ["stay/0"]]
        assert stay.future.result() == [answer(sentence(3, 2))]

    run(test)


def test_when_a_step_fails_only_the_culprits_request_fails_and_the_others_are_answered():
    async def test():
        h = Harness()
        first = h.submit("first", [sentence(1, steps=3)])
        culprit = h.submit("culprit", [sentence(2), [5, POISON, 2]])
        last = h.submit("last", [sentence(3, steps=4)])
        await h.turns(1)
        assert first.future.result() == [answer(sentence(1, 3))]  # decoded again, alone
        assert last.future.result() == [answer(sentence(3, 4))]
        error = culprit.future.exception()
        assert isinstance(error, SentenceFailed) and error.index == 1
        assert h.metric("nmt_batch_failures_total") == 1
        h.submit("after", [sentence(4, steps=2)])  # the batch is usable again
        await h.turns(2)
        assert h.steps[-1] == (1, ["after/0"])

    run(test)


def test_a_join_that_fails_midway_decodes_each_sentence_once():
    async def test():
        h = Harness(max_sentences=3)
        first = h.submit("first", [sentence(1, steps=4)])
        await h.turns(1)
        # The join takes culprit/0 and other/0 (two free places; other/1 waits) and breaks
        # after the batch took them in.
        culprit = h.submit("culprit", [[5, HALF_JOINS, 2]])
        other = h.submit("other", [sentence(3, steps=2), sentence(4, steps=3)])
        await h.turns(6)
        # Decoded again alone, each once: a sentence decoded twice would count twice
        # towards its request, which would be answered before its other sentence ended.
        assert first.future.result() == [answer(sentence(1, 4))]
        assert other.future.result() == [answer(sentence(3, 2)), answer(sentence(4, 3))]
        error = culprit.future.exception()
        assert isinstance(error, SentenceFailed) and error.index == 0
        alone = Counter(labels[0] for _, labels in h.steps[1:] if len(labels) == 1)
        assert alone["first/0"] == 4 and alone["other/0"] == 2

    run(test)


def test_occupancy_joins_and_leaves_and_request_timings_are_measured():
    async def test():
        h = Harness()
        h.submit("a", [sentence(1, steps=2), sentence(2, steps=3)])
        h.clock.now += 0.5  # they waited half a second in the queue
        await h.turns(3)
        assert h.metric("nmt_batch_joined_sentences_total") == 2
        assert h.metric("nmt_batch_left_sentences_total", reason="finished") == 2
        assert h.metric("nmt_batch_step_sentences_sum") == 2 + 2 + 1
        assert h.metric("nmt_batch_step_sentences_count") == 3
        assert h.metric("nmt_request_queue_duration_seconds_sum") == pytest.approx(0.5)
        assert h.metric("nmt_queue_wait_seconds_sum") == pytest.approx(1.0)
        assert h.metric("nmt_output_tokens_total") == 1 + 2

    run(test)


def test_closing_drains_what_is_queued_and_running_on_the_worker_thread():
    async def test():
        h = Harness(max_sentences=2)
        gate = h.step_gate = Gate()
        jobs = [h.submit(f"j{n}", [sentence(n, steps=n + 1)]) for n in range(1, 6)]
        h.loop.start()
        closer = threading.Thread(target=h.loop.close, args=(30,), daemon=True)
        closer.start()
        closer.join(0.1)
        held = closer.is_alive()
        gate.opened.set()
        assert held, "close returned while the worker was still decoding"
        closer.join(30)
        assert not closer.is_alive()
        await asyncio.sleep(0)
        for n, job in enumerate(jobs, start=1):
            assert job.future.result() == [answer(sentence(n, n + 1))]

    run(test)


def test_close_finishes_admitted_work_and_then_refuses_more():
    async def test():
        h = Harness()
        h.loop.start()
        sources = [sentence(n) for n in range(4)]
        job = h.submit("j", sources)
        await asyncio.to_thread(h.loop.close, 30)
        with pytest.raises(ShuttingDown):
            h.submit("late", sources)
        assert await job.future == [answer(source) for source in sources]

    run(test)


def test_an_empty_job_is_answered_at_once_without_the_worker():
    async def test():
        h = Harness()  # not started: no worker runs
        assert await h.submit("empty", []).future == []
        assert h.steps == [] and h.encoded == []

    run(test)
