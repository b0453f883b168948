"""The batching scheduler on the real engine (the rest of its tests use a fake runner): batches
formed across requests give every request what the engine gives each sentence alone, and an
input the engine really fails on takes down only its own request."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from service.runtime.bundle import load_bundle
from service.runtime.engine import EngineOptions
from service.runtime.search import SearchOptions
from service.runtime.translator import Translator
from service.serving.scheduler import BatchLimits, BatchScheduler, SentenceFailed
from tests.conftest import FRENCH_SENTENCES

FAST = SearchOptions(beam_size=1, max_length=12)
BEAM = SearchOptions(beam_size=2, max_length=12)


@pytest.fixture(scope="module")
def translator(fr_en_bundle: Path) -> Translator:
    return Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))


def run_batch(translator: Translator, batches: list[int]):
    def run(sources: list[list[int]], options: SearchOptions, abandoned):
        batches.append(len(sources))
        return translator.translate_ids(sources, options, len(sources), abandoned)

    return run


def alone(translator: Translator, sources: list[list[int]], options: SearchOptions) -> list:
    """The reference: every sentence translated on its own, one after the other."""
    return [translator.translate_ids([s], options, batch_size=1)[0] for s in sources]


@pytest.mark.parametrize("options", [FAST, BEAM], ids=["greedy", "beam"])
def test_jobs_batched_together_get_what_each_sentence_gets_alone(
    translator: Translator, options: SearchOptions
):
    batches: list[int] = []
    limits = BatchLimits(max_sentences=8, max_wait=60.0)
    scheduler = BatchScheduler("fr-en", run_batch(translator, batches), limits)
    scheduler.start()
    sources = translator.tokenizer.encode(FRENCH_SENTENCES[:8])
    jobs_sources = [sources[0:1], sources[1:4], sources[4:5], sources[5:8]]

    async def main() -> list:
        later = time.monotonic() + 600
        jobs = [scheduler.submit(s, options, later) for s in jobs_sources]
        return await asyncio.gather(*(job.future for job in jobs))

    try:
        results = asyncio.run(main())
    finally:
        scheduler.close(30)
    for job_sources, job_results in zip(jobs_sources, results, strict=True):
        expected = alone(translator, job_sources, options)
        assert [r[0].tokens for r in job_results] == [e[0].tokens for e in expected]
    assert batches == [8]


def test_an_input_the_engine_fails_on_fails_only_its_own_job(translator: Translator):
    """A source longer than the model's positions makes ONNX Runtime fail."""
    batches: list[int] = []
    limits = BatchLimits(max_sentences=4, max_wait=60.0)
    scheduler = BatchScheduler("fr-en", run_batch(translator, batches), limits)
    scheduler.start()
    good = translator.tokenizer.encode(FRENCH_SENTENCES[:3])
    positions = translator.bundle.dims["max_positions"]
    too_long = translator.tokenizer.encode(["un chien noir " * positions])[0][: positions + 50]

    async def main() -> tuple:
        later = time.monotonic() + 600
        first = scheduler.submit(good[:1], FAST, later)
        culprit = scheduler.submit([good[1], too_long], FAST, later)
        last = scheduler.submit(good[2:3], FAST, later)
        return await asyncio.gather(
            first.future, culprit.future, last.future, return_exceptions=True
        )

    try:
        first, culprit, last = asyncio.run(main())
    finally:
        scheduler.close(30)
    assert [r[0].tokens for r in first] == [e[0].tokens for e in alone(translator, good[:1], FAST)]
    assert [r[0].tokens for r in last] == [e[0].tokens for e in alone(translator, good[2:3], FAST)]
    assert isinstance(culprit, SentenceFailed) and culprit.index == 1
    assert batches[0] == 4  # they really were in one batch


class StepSpy:
    """The engine's step, counting the rows fed at each call."""

    def __init__(self, translator: Translator) -> None:
        self.rows: list[int] = []
        self.step = translator.engine.step

    def __call__(self, state, tokens, *args, **kwargs):
        self.rows.append(len(tokens))
        return self.step(state, tokens, *args, **kwargs)


@pytest.mark.parametrize("options", [FAST, BEAM], ids=["greedy", "beam"])
def test_an_abandoned_sentence_leaves_the_batch_and_the_others_are_unchanged(
    translator: Translator, options: SearchOptions, monkeypatch: pytest.MonkeyPatch
):
    """Sentence 1 is abandoned after the third step: from then on it costs no row, it gets
    no hypothesis, and the others get exactly what they get alone."""
    sources = translator.tokenizer.encode(FRENCH_SENTENCES[:4])
    spy = StepSpy(translator)
    monkeypatch.setattr(translator.engine, "step", spy)

    def abandoned() -> list[bool]:
        return [False, len(spy.rows) >= 3, False, False]

    found = translator.translate_ids(sources, options, 4, abandoned)
    rows_with_one_abandoned = sum(spy.rows)
    assert found[1] == []
    for index in (0, 2, 3):
        expected = alone(translator, [sources[index]], options)[0]
        assert [h.tokens for h in found[index]] == [h.tokens for h in expected]
    spy.rows.clear()
    assert all(translator.translate_ids(sources, options, 4))
    assert rows_with_one_abandoned < sum(spy.rows)
