"""The vocabulary shortlist: how it is built, stored and read, and the engine that uses it,
against the torch model restricted to the same candidate words."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from nmt_contract import SHORTLIST_FILE, Shortlist, union_of

torch = pytest.importorskip("torch")

from export.checkpoint import load_model_dir  # noqa: E402
from export.onnx_export import export_bundle  # noqa: E402
from export.shortlist import build_shortlist, write_ctranslate2_vmap  # noqa: E402
from service.runtime.bundle import BundleError, load_bundle  # noqa: E402
from service.runtime.engine import Engine  # noqa: E402
from service.runtime.running_batch import running_batch, step_together  # noqa: E402
from service.runtime.search import SearchOptions, Sentence  # noqa: E402
from service.runtime.sessions import EngineOptions  # noqa: E402
from service.runtime.translator import search  # noqa: E402
from tests.runtime.steps import full_log_probs  # noqa: E402
from tests.runtime.test_engine import pad_arrays, random_sources  # noqa: E402

SPECIAL = [0, 1, 2]


def test_a_source_word_gets_its_translation_before_merely_frequent_words() -> None:
    """Source 10 always comes with target 20; target 5 is in every sentence (frequent, but
    no more with 10 than without it); 11 comes with 21 once."""
    sources = [[10, 3], [10, 4], [10, 3], [11, 4], [12, 3], [12, 4]]
    targets = [[20, 5], [20, 5], [20, 5], [21, 5], [22, 5], [22, 5]]
    shortlist = build_shortlist(sources, targets, 30, SPECIAL, per_source=2, always=1)
    assert shortlist.candidates[10].tolist() == [20, 5]  # Dice 1.0, then 0.67
    assert shortlist.candidates[11].tolist() == [21, 5]
    assert shortlist.candidates[29].tolist() == [-1, -1]  # never seen: no candidates
    assert shortlist.always.tolist() == [0, 1, 2, 5]  # the most frequent target and specials


def test_a_shortlist_survives_the_disk_and_gives_a_batch_its_candidates(tmp_path: Path) -> None:
    shortlist = Shortlist(
        always=np.array([0, 1, 2, 7], dtype=np.int32),
        candidates=np.array([[-1, -1], [-1, -1], [-1, -1], [9, 4], [4, -1]], dtype=np.int32),
    )
    shortlist.save(tmp_path / SHORTLIST_FILE)
    again = Shortlist.load(tmp_path / SHORTLIST_FILE)
    np.testing.assert_array_equal(again.candidates, shortlist.candidates)
    vocabulary = again.vocabulary_for(np.array([[3, 4, 0], [4, 0, 0]]))
    assert vocabulary.tolist() == [0, 1, 2, 4, 7, 9]
    assert vocabulary.dtype == np.int64


def test_a_batch_vocabulary_is_numpys_union_of_its_sources_candidates() -> None:
    rng = np.random.default_rng(5)
    parts = [rng.integers(0, 9000, size=int(rng.integers(0, 400))) for _ in range(32)]
    parts += [np.array([], dtype=np.int32), np.array([8999, 3], dtype=np.int32)]
    union = union_of(parts)
    np.testing.assert_array_equal(union, np.unique(np.concatenate(parts)))
    assert union.dtype == np.int64
    assert union_of([np.array([], dtype=np.int64)]).tolist() == []


def test_the_ctranslate2_vocabulary_map_says_the_same(tmp_path: Path) -> None:
    shortlist = Shortlist(
        always=np.array([0, 1], dtype=np.int32),
        candidates=np.array([[-1], [-1], [1], [0]], dtype=np.int32),
    )
    write_ctranslate2_vmap(shortlist, ["<pad>", "</s>", "▁chien", "▁dog"], tmp_path / "vmap")
    lines = (tmp_path / "vmap").read_text(encoding="utf-8").splitlines()
    assert lines == ["\t<pad> </s>", "▁chien\t</s>", "▁dog\t<pad>"]


@pytest.fixture(scope="module")
def shortlist_bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a random shortlist of about a fifth of its 400 words."""
    folder = tmp_path_factory.mktemp("shortlist")
    checkpoint = folder / "model"
    shutil.copytree(tiny_checkpoint, checkpoint)
    rng = np.random.default_rng(4)
    candidates = rng.integers(3, 400, (400, 12)).astype(np.int32)
    candidates[rng.random(candidates.shape) < 0.3] = -1
    Shortlist(np.array([*SPECIAL, 7, 8], dtype=np.int32), candidates).save(
        checkpoint / SHORTLIST_FILE
    )
    export_bundle(checkpoint, folder / "bundle", int8=True)
    return folder / "bundle"


def test_a_shortlisted_step_is_the_torch_models_log_softmax_over_the_candidates(
    tiny_checkpoint: Path, shortlist_bundle: Path
) -> None:
    model, _ = load_model_dir(tiny_checkpoint)
    engine = Engine(load_bundle(shortlist_bundle), EngineOptions(shortlist=True))
    sources = random_sources(3, 400, seed=8)
    source_ids, source_mask = pad_arrays(sources)
    state = engine.start(source_ids, source_mask)
    candidates = engine.shortlist.vocabulary_for(source_ids[source_mask])
    assert 20 < len(candidates) < 300
    tokens = np.zeros(3, dtype=np.int64)
    log_probs, _ = full_log_probs(engine, state, tokens)
    ids = torch.from_numpy(source_ids)
    with torch.no_grad():
        cross = model.cross_keys_values(model.encode(ids, ids != 0))
        logits, _, _ = model.decode(
            torch.zeros((3, 1), dtype=torch.long), model.empty_cache(3), cross, ids != 0
        )
    restricted = logits[:, -1, torch.from_numpy(candidates)]
    expected = torch.log_softmax(restricted, dim=-1).numpy()
    np.testing.assert_allclose(log_probs[:, candidates], expected, atol=1e-4)
    others = np.setdiff1d(np.arange(400), candidates)
    assert np.isneginf(log_probs[:, others]).all()  # words outside cannot be written


def test_the_int8_shortlisted_step_scores_int8_columns_as_the_full_int8_step_does(
    tiny_checkpoint: Path, shortlist_bundle: Path
) -> None:
    """The int8 step reads its candidates' columns quantized (a scale per word). Its scores
    are the full-vocabulary int8 step's over the same candidates (the two graphs differ only
    in the output projection), and as close to torch's log-softmax as that step's are.

    (Why not torch alone: this random model's uniform weights make the int8 decoder layer
    itself saturate on a CPU with AVX2 but no VNNI, where MLAS adds pairs of u8 x s8
    products in 16 bits: there both int8 steps are about 1.1 from torch, on a CPU with VNNI
    about 0.07; a trained model's weights seldom do, docs/performance.md.)"""
    model, _ = load_model_dir(tiny_checkpoint)
    bundle = load_bundle(shortlist_bundle)
    assert {"projection_int8", "projection_scale"} <= bundle.manifest["shortlist"].keys()
    engine = Engine(bundle, EngineOptions(shortlist=True, int8=True))
    assert engine.projection[0].dtype == np.int8 and engine.projection[1].shape == (400,)
    full = Engine(bundle, EngineOptions(int8=True))
    sources = random_sources(3, 400, seed=8)
    source_ids, source_mask = pad_arrays(sources)
    start = np.zeros(3, dtype=np.int64)
    log_probs, _ = full_log_probs(engine, engine.start(source_ids, source_mask), start)
    full_scores, _ = full_log_probs(full, full.start(source_ids, source_mask), start)
    candidates = engine.shortlist.vocabulary_for(source_ids[source_mask])
    over_candidates = full_scores[:, candidates]
    over_candidates -= np.logaddexp.reduce(over_candidates, axis=1, keepdims=True)
    # (log-probs spread over about 5 here; the two projections' quantizations differ by
    # about 0.04, and a wrong scale of 1.5x makes it 1.8)
    assert np.abs(log_probs[:, candidates] - over_candidates).max() < 0.2
    others = np.setdiff1d(np.arange(400), candidates)
    assert np.isneginf(log_probs[:, others]).all()
    ids = torch.from_numpy(source_ids)
    with torch.no_grad():
        cross = model.cross_keys_values(model.encode(ids, ids != 0))
        logits, _, _ = model.decode(
            torch.zeros((3, 1), dtype=torch.long), model.empty_cache(3), cross, ids != 0
        )
    expected = torch.log_softmax(logits[:, -1, torch.from_numpy(candidates)], dim=-1).numpy()
    int8_error = np.abs(over_candidates - expected).max()
    assert np.abs(log_probs[:, candidates] - expected).max() < int8_error + 0.2


def test_an_int8_shortlist_from_an_older_export_is_refused_saying_re_export(
    shortlist_bundle: Path, tmp_path: Path
) -> None:
    """A bundle exported before the int8 projection (bundle.json's shortlist without it)
    still serves its float shortlist; asked for the int8 one, it says what to do."""
    copy = tmp_path / "bundle"
    shutil.copytree(shortlist_bundle, copy)
    manifest = json.loads((copy / "bundle.json").read_text())
    for key in ("projection_int8", "projection_scale"):
        del manifest["files"][manifest["shortlist"].pop(key)]
    (copy / "bundle.json").write_text(json.dumps(manifest))
    Engine(load_bundle(copy), EngineOptions(shortlist=True))
    with pytest.raises(BundleError, match="re-export"):
        Engine(load_bundle(copy), EngineOptions(shortlist=True, int8=True))


def test_the_candidates_are_gathered_once_per_join_or_leave(shortlist_bundle: Path) -> None:
    """The batch scores the union of its sentences' candidates, made again when one leaves
    (so that a busy server's batch does not drift to the whole vocabulary), not per step."""
    engine = Engine(load_bundle(shortlist_bundle), EngineOptions(shortlist=True))
    first, second = random_sources(2, 400, seed=11)
    cache = engine.start(*pad_arrays([first, second]))
    tokens = np.zeros(2, dtype=np.int64)
    engine.step(cache, tokens, top_k=1)
    both = cache.vocabulary
    np.testing.assert_array_equal(both, engine.shortlist.vocabulary_for(np.array(first + second)))
    engine.step(cache, tokens, top_k=1)
    assert cache.vocabulary is both  # not gathered again while nobody joins or leaves
    cache.select_rows(np.array([1]))
    cache.select_sources(np.array([1]))
    engine.step(cache, tokens[:1], top_k=1)
    np.testing.assert_array_equal(
        cache.vocabulary, engine.shortlist.vocabulary_for(np.array(second))
    )
    assert len(cache.vocabulary) < len(both)


def test_batches_of_two_beam_sizes_step_together_over_their_candidates(
    shortlist_bundle: Path,
) -> None:
    """Stepped together, the rows of a greedy and a beam batch score the union of their
    candidates: every sentence ends, with words from it only."""
    engine = Engine(load_bundle(shortlist_bundle), EngineOptions(shortlist=True))
    sources = random_sources(4, 400, seed=12)
    greedy, beams = running_batch(engine, 1), running_batch(engine, 3)
    greedy.join([Sentence(s, SearchOptions(max_length=12)) for s in sources[:2]])
    beams.join([Sentence(s, SearchOptions(beam_size=3, max_length=12)) for s in sources[2:]])
    allowed = set(engine.shortlist.vocabulary_for(np.concatenate(sources)).tolist())
    finished = []
    while len(greedy) or len(beams):
        for ended in step_together([greedy, beams]):
            finished += ended
    assert len(finished) == 4
    for done in finished:
        assert set(done.hypotheses[0].tokens) <= allowed


def test_a_shortlisted_search_writes_only_candidates(shortlist_bundle: Path) -> None:
    engine = Engine(load_bundle(shortlist_bundle), EngineOptions(shortlist=True, int8=True))
    sources = random_sources(6, 400, seed=9)
    for beam in (1, 3):
        found = search(engine, sources, SearchOptions(beam_size=beam, n_best=1))
        allowed = set(engine.shortlist.vocabulary_for(np.concatenate(sources)).tolist())
        for hypotheses in found:
            assert set(hypotheses[0].tokens) <= allowed


def test_a_shortlist_of_every_word_changes_nothing(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The shortlisted step with all 400 words is the full step: same search results."""
    checkpoint = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, checkpoint)
    everything = Shortlist(np.arange(400, dtype=np.int32), np.full((400, 1), -1, np.int32))
    everything.save(checkpoint / SHORTLIST_FILE)
    export_bundle(checkpoint, tmp_path / "bundle")
    bundle = load_bundle(tmp_path / "bundle")
    sources = random_sources(5, 400, seed=10)
    for beam in (1, 4):
        options = SearchOptions(beam_size=beam, n_best=min(beam, 2))
        full = search(Engine(bundle), sources, options)
        short = search(Engine(bundle, EngineOptions(shortlist=True)), sources, options)
        for a, b in zip(full, short, strict=True):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-4)


def test_a_bundle_without_a_shortlist_says_how_to_get_one(tiny_bundle: Path) -> None:
    with pytest.raises(BundleError, match="nmt shortlist"):
        Engine(load_bundle(tiny_bundle), EngineOptions(shortlist=True))
    manifest = json.loads((tiny_bundle / "bundle.json").read_text())
    assert "shortlist" not in manifest


def test_a_shortlist_for_another_vocabulary_is_refused_at_export(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, checkpoint)
    bigger = Shortlist(np.array([0, 1, 2], np.int32), np.full((8000, 3), 7000, np.int32))
    bigger.save(checkpoint / SHORTLIST_FILE)
    with pytest.raises(ValueError, match="nmt shortlist"):
        export_bundle(checkpoint, tmp_path / "bundle")
