"""Running batches on the real engine: sentences that join while others decode, and batches of
two beam sizes stepped together, come out as they do when decoded alone (fp32: int8's dynamic
quantization scales activations per batch, so its outputs depend on the batch at any
batching). The decoding loop that drives them in the server: tests/serving/test_loop_engine.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.runtime.bundle import load_bundle
from service.runtime.engine import Engine
from service.runtime.running_batch import filling_holes, pad_sources, running_batch, step_together
from service.runtime.search import SearchOptions, Sentence
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator, search
from tests.conftest import FRENCH_SENTENCES

MIXED = [
    SearchOptions(),
    SearchOptions(max_length=6),
    SearchOptions(length_penalty=0.6, max_repeats=3),
    SearchOptions(beam_size=3),
    SearchOptions(beam_size=3, n_best=2, length_penalty=1.3),
    SearchOptions(beam_size=3, max_length=5, alignment=True),
]


@pytest.fixture(scope="module")
def translator(fr_en_bundle: Path) -> Translator:
    return Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))


def alone(translator: Translator, source: list[int], options: SearchOptions) -> list:
    return search(translator.engine, [source], options)[0]


def same(found: list, expected: list) -> bool:
    """Same n-best tokens; scores and alignments equal up to float rounding."""
    if [h.tokens for h in found] != [h.tokens for h in expected]:
        return False
    for a, b in zip(found, expected, strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-4)
        if b.alignment is not None:
            assert a.alignment.shape == b.alignment.shape
            assert abs(a.alignment - b.alignment).max() < 1e-4
    return True


@pytest.mark.parametrize("beam_size", [1, 2])
def test_a_join_after_the_oldest_sentence_left_keeps_alignments_and_tokens(
    translator: Translator, beam_size: int
):
    """The first sentence (short) leaves while one that joined later (long) runs on: the
    tokens and alignments nobody needs any more are cut; then another sentence joins. All
    three, alignment asked for, come out as alone."""
    texts = [
        "Un chat.",
        "Un homme en chemise bleue marche dans la rue avec son chien noir.",
        "Le chien court.",
    ]
    short, long, late = translator.tokenizer.encode(texts)
    options = SearchOptions(beam_size=beam_size, alignment=True)
    batch = running_batch(translator.engine, beam_size)
    found = {}
    batch.join([Sentence(short, options, ticket="short")])
    batch.step()
    batch.step()
    batch.join([Sentence(long, options, ticket="long")])
    while "short" not in found:
        found |= {f.sentence.ticket: f.hypotheses for f in batch.step()}
    assert len(batch) == 1  # the long one runs on, alone
    batch.step()
    batch.join([Sentence(late, options, ticket="late")])
    while len(batch):
        found |= {f.sentence.ticket: f.hypotheses for f in batch.step()}
    for ticket, source in (("short", short), ("long", long), ("late", late)):
        assert same(found[ticket], alone(translator, source, options)), ticket


def test_batches_of_two_beam_sizes_stepped_together_decode_as_they_do_alone(
    translator: Translator,
):
    """step_together: a greedy and a beam-3 batch take every step in one engine call while
    sentences join either at different steps (caches of different lengths, sources of
    different widths) and leave; every sentence comes out as it does alone, scores and
    alignments included."""
    sources = translator.tokenizer.encode(FRENCH_SENTENCES)
    engine = translator.engine
    greedy, beam = running_batch(engine, 1), running_batch(engine, 3)
    greedy_options = [SearchOptions(), SearchOptions(length_penalty=0.6, alignment=True)]
    beam_options = [SearchOptions(beam_size=3, n_best=2), SearchOptions(beam_size=3)]
    # step -> (batch, sentence indices)
    joins = {0: [(greedy, [0, 1])], 2: [(beam, [2])], 4: [(greedy, [3]), (beam, [4, 5])]}
    joins |= {7: [(greedy, [6, 7])], 9: [(beam, [8])]}
    options_of = {}
    found, steps_together = {}, 0
    for step in range(200):
        for batch, indices in joins.get(step, []):
            choices = greedy_options if batch is greedy else beam_options
            sentences = []
            for i in indices:
                options_of[i] = choices[i % 2]
                sentences.append(Sentence(sources[i], options_of[i], ticket=i))
            batch.join(sentences)
        if not (len(greedy) or len(beam)) and step > max(joins):
            break
        steps_together += bool(len(greedy) and len(beam))
        for ended in step_together([greedy, beam]):
            for finished in ended:
                found[finished.sentence.ticket] = finished.hypotheses
    assert steps_together >= 10 and sorted(found) == sorted(options_of)
    for index, hypotheses in found.items():
        assert same(hypotheses, alone(translator, sources[index], options_of[index]))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_lone_sentence_after_another_decodes_in_its_buffers_through_its_binding(
    translator: Translator, fr_en_bundle: Path, beam_size: int
):
    """When a batch's last sentence leaves, the engine keeps its cache as a spare, and the
    next sentence to join an empty batch decodes in the same buffers through the same IO
    binding, with its own sources bound: sentences of different lengths, one after the
    other, come out as they do in one batch of an engine that kept none (a source left bound
    from the sentence before would change them, or fail on its shape)."""
    engine = Engine(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))
    options = SearchOptions(beam_size=beam_size, n_best=beam_size)
    # Longest first: the first one's buffers have room for every later one (no growing).
    sources = sorted(translator.tokenizer.encode(FRENCH_SENTENCES[:6]), key=len, reverse=True)
    expected = search(translator.engine, sources, options)
    batch = running_batch(engine, beam_size)
    found, buffers, bindings = [], [], []
    for source in sources:
        batch.join([Sentence(source, options)])
        buffers.append(batch.cache.past[0])
        ended = batch.step()
        bindings.append(batch.cache.binding if batch.cache is not None else None)
        while len(batch):
            ended += batch.step()
        found.append(ended[0].hypotheses)
    assert all(buffer is buffers[0] for buffer in buffers)
    assert bindings[0] is not None and all(binding is bindings[0] for binding in bindings)
    for mine, theirs in zip(found, expected, strict=True):
        assert same(mine, theirs)


@pytest.mark.parametrize("threads", [1, 2])
def test_encoding_ahead_runs_on_one_thread_and_encodes_the_same(
    translator: Translator, fr_en_bundle: Path, threads: int
):
    """The encoder thread's session has one intra-op thread (the encoder's own when the
    engine has one; a second session otherwise), and its keys/values are the same."""
    engine = Engine(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=threads))
    ids, mask = pad_sources(translator.tokenizer.encode(FRENCH_SENTENCES[:3]), engine.pad_id)
    here, ahead = engine.start(ids, mask), engine.start(ids, mask, ahead=True)
    session = engine.ahead_encoder()
    assert session.get_session_options().intra_op_num_threads == 1
    assert (session is engine.encoder) == (threads == 1)
    for a, b in zip(here.cross, ahead.cross, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_filling_holes_keeps_what_stays_in_place() -> None:
    """Sentences that leave are replaced by the last ones, so that the others' caches stay."""
    kept = np.array([0, 2, 3, 5])
    assert kept[filling_holes(kept)].tolist() == [0, 5, 2, 3]
    assert np.array([3, 4])[filling_holes(np.array([3, 4]))].tolist() == [3, 4]
    everything = np.arange(5)
    assert filling_holes(everything).tolist() == everything.tolist()
    assert filling_holes(np.zeros(0, dtype=np.int64)).tolist() == []
