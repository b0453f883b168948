"""The exported graphs and the ONNX Runtime engine, against the torch model and reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from export.checkpoint import load_model_dir  # noqa: E402
from export.data import pad  # noqa: E402
from export.decoding import beam_search as torch_beam_search  # noqa: E402
from export.decoding import greedy_search as torch_greedy_search  # noqa: E402
from export.onnx_export import export_bundle  # noqa: E402
from nmt_contract import length_limit  # noqa: E402
from service.runtime.bundle import BundleError, load_bundle  # noqa: E402
from service.runtime.engine import Engine  # noqa: E402
from service.runtime.search import SearchOptions  # noqa: E402
from service.runtime.sessions import EngineOptions  # noqa: E402
from service.runtime.translator import search  # noqa: E402
from tests.runtime.steps import full_log_probs  # noqa: E402


def random_sources(count: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[*rng.integers(3, vocab, rng.integers(1, 12)).tolist(), 1] for _ in range(count)]


def test_decoder_steps_match_torch_for_a_padded_batch(
    tiny_checkpoint: Path, tiny_bundle: Path
) -> None:
    """Every step's log-probs, alignment and layer-0 keys (written in place in the buffer)."""
    model, _ = load_model_dir(tiny_checkpoint)
    engine = Engine(load_bundle(tiny_bundle))
    sources = random_sources(4, 400, seed=1)
    source_ids = pad(sources, 0)
    source_mask = source_ids != 0
    assert not source_mask.all()  # the batch really is padded
    steps = 12
    targets = torch.randint(3, 400, (4, steps), generator=torch.Generator().manual_seed(2))
    targets[:, 0] = 0  # decoder start
    state = engine.start(source_ids.numpy(), source_mask.numpy())
    with torch.no_grad():
        cross = model.cross_keys_values(model.encode(source_ids, source_mask))
        # layer 1's keys, at the real tokens: what padding holds is masked (export/model/packing.py)
        real = source_mask.numpy()[:, None, :, None]  # [B, 1, S, 1]
        np.testing.assert_allclose(
            np.where(real, state.cross[2], 0), np.where(real, cross[1][0].numpy(), 0), atol=1e-5
        )
        past = model.empty_cache(4)
        for step in range(steps):
            logits, past, weights = model.decode(
                targets[:, step : step + 1], past, cross, source_mask
            )
            expected = torch.log_softmax(logits[:, -1], dim=-1).numpy()
            log_probs, result = full_log_probs(
                engine, state, targets[:, step].numpy(), want_alignment=True
            )
            assert np.abs(log_probs - expected).max() <= 1e-4, f"step {step}"
            np.testing.assert_allclose(result.alignment, weights[:, -1].numpy(), atol=1e-5)
            # [B, H, P, Dh]: the buffer's first P positions are the cache
            keys = state.past[0][:, :, : step + 1]
            assert keys.shape == (4, 4, step + 1, 16)
            np.testing.assert_allclose(keys, past[0][0].numpy(), atol=1e-5)


def test_beams_sharing_the_source_match_torch_with_a_copy_per_beam(
    tiny_checkpoint: Path, tiny_bundle: Path
) -> None:
    """Rows reordered and sources dropped between steps, as beam search does."""
    model, _ = load_model_dir(tiny_checkpoint)
    engine = Engine(load_bundle(tiny_bundle))
    sources = random_sources(3, 400, seed=9)
    source_ids = pad(sources, 0)
    source_mask = source_ids != 0
    state = engine.start(source_ids.numpy(), source_mask.numpy(), rows_per_source=2)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        cross = model.cross_keys_values(model.encode(source_ids, source_mask))
        cross = [(k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)) for k, v in cross]
        mask = source_mask.repeat_interleave(2, 0)
        past = model.empty_cache(6)
        tokens = torch.zeros(6, dtype=torch.long)
        for step in range(6):
            logits, past, _ = model.decode(tokens[:, None], past, cross, mask)
            expected = torch.log_softmax(logits[:, -1], dim=-1).numpy()
            got, _ = full_log_probs(engine, state, tokens.numpy())
            assert np.abs(got - expected).max() <= 1e-4, f"step {step}"
            # swap the beams of every source, then (at step 3) drop source 1
            rows = torch.arange(len(tokens)).view(-1, 2).flip(1).reshape(-1)
            if step == 3:
                rows = torch.tensor([1, 0, 5, 4])
            past = [(k[rows], v[rows]) for k, v in past]
            state.select_rows(rows.numpy())
            if step == 3:
                kept = torch.tensor([0, 2])
                cross = [(k[rows], v[rows]) for k, v in cross]
                mask = mask[rows]
                state.select_sources(kept.numpy())
            tokens = torch.randint(3, 400, (len(rows),), generator=generator)


def torch_reference(model, sources: list[list[int]], beam_size: int, n_best: int, limit: int):
    """The torch searches' hypotheses for `sources`, n_best each (one for greedy)."""
    source_ids = pad(sources, 0)
    if beam_size == 1:
        return [[h] for h in torch_greedy_search(model, source_ids, source_ids != 0, limit)]
    return torch_beam_search(model, source_ids, source_ids != 0, beam_size, 1.0, n_best, limit)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_engine_search_equals_the_torch_reference(tiny_checkpoint, tiny_bundle, beam_size) -> None:
    model, _ = load_model_dir(tiny_checkpoint)
    engine = Engine(load_bundle(tiny_bundle))
    sources = random_sources(60, 400, seed=5)
    options = SearchOptions(beam_size=beam_size, n_best=min(2, beam_size), max_length=30)
    found = search(engine, sources, options)
    lengths = {len(h.tokens) for hyps in found for h in hyps}
    assert len(lengths) > 3  # outputs of many lengths, some ended by </s>, some by the limit
    expected = torch_reference(model, sources, beam_size, 2, 30)
    for ours, theirs in zip(found, expected, strict=True):
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        for a, b in zip(ours, theirs, strict=True):
            assert a.log_prob == pytest.approx(b.log_prob, abs=1e-3)
            assert a.score == pytest.approx(b.score, abs=1e-3)


@pytest.fixture(scope="module", params=[(6, 1), (8, 2)], ids=["6x1", "8x2"])
def student_shape(request, tiny_checkpoint: Path, tmp_path_factory) -> tuple[Path, Path]:
    """A distillation student's shape (issue 38): a deep pre-norm encoder, a shallow decoder.
    -> (model directory, its bundle)"""
    from export.checkpoint import save_model_dir
    from export.model.config import ModelConfig
    from export.model.transformer import Transformer

    encoder_layers, decoder_layers = request.param
    torch.manual_seed(11)
    config = ModelConfig(
        vocab_size=400, d_model=64, n_heads=4, ffn_dim=128, dropout=0.0, pre_norm=True,
        final_layer_norm=True, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
    )  # fmt: skip
    model = Transformer(config).eval()
    model.final_logits_bias[config.eos_id] = 2.0
    folder = tmp_path_factory.mktemp(f"student-{encoder_layers}x{decoder_layers}")
    save_model_dir(model, tiny_checkpoint / "sentencepiece.model", folder / "model")
    export_bundle(folder / "model", folder / "bundle", int8=False)
    return folder / "model", folder / "bundle"


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_deep_encoder_and_shallow_decoder_decode_as_the_torch_model(
    student_shape, beam_size
) -> None:
    # The fused step and the engine take their layer counts from the model: nothing assumes
    # the committed model's 3 + 3.
    checkpoint, bundle = student_shape
    model, _ = load_model_dir(checkpoint)
    engine = Engine(load_bundle(bundle))
    sources = random_sources(30, 400, seed=7)
    options = SearchOptions(beam_size=beam_size, max_length=30)
    found = search(engine, sources, options)
    assert len({len(hyps[0].tokens) for hyps in found}) > 3  # ended by </s> and by the limit
    expected = torch_reference(model, sources, beam_size, 1, 30)
    for ours, theirs in zip(found, expected, strict=True):
        assert ours[0].tokens == theirs[0].tokens
        assert ours[0].log_prob == pytest.approx(theirs[0].log_prob, abs=1e-3)


def test_top_k_selected_in_the_graph_is_the_top_k_of_torch(tiny_checkpoint, tiny_bundle) -> None:
    model, _ = load_model_dir(tiny_checkpoint)
    engine = Engine(load_bundle(tiny_bundle))
    sources = random_sources(3, 400, seed=8)
    source_ids = pad(sources, 0)
    source_mask = source_ids != 0
    start = np.zeros(3, dtype=np.int64)
    with torch.no_grad():
        cross = model.cross_keys_values(model.encode(source_ids, source_mask))
        logits, _, _ = model.decode(
            torch.zeros((3, 1), dtype=torch.long), model.empty_cache(3), cross, source_mask
        )
        expected = torch.log_softmax(logits[:, -1], dim=-1).topk(8, dim=-1)
    for k in (1, 5, 8):
        top = engine.step(engine.start(source_ids.numpy(), source_mask.numpy()), start, top_k=k)
        assert top.top_ids.shape == (3, k)
        np.testing.assert_array_equal(top.top_ids, expected.indices[:, :k].numpy())
        np.testing.assert_allclose(top.top_log_probs, expected.values[:, :k].numpy(), atol=1e-4)


def test_alignment_has_a_row_per_output_token(tiny_bundle: Path) -> None:
    engine = Engine(load_bundle(tiny_bundle))
    sources = random_sources(5, 400, seed=6)
    for beam_size in (1, 3):
        found = search(
            engine, sources, SearchOptions(beam_size=beam_size, max_length=20, alignment=True)
        )
        for source, (best, *_) in zip(sources, found, strict=True):
            limit = length_limit(len(source), 20, engine.max_positions)
            rows = len(best.tokens) + (len(best.tokens) < limit)  # + the </s> step when it ended
            assert best.alignment.shape == (rows, len(source))
            np.testing.assert_allclose(best.alignment.sum(axis=1), 1.0, atol=1e-4)


def test_int8_graphs_decode_close_to_fp32(tiny_bundle: Path) -> None:
    bundle = load_bundle(tiny_bundle)
    fp32, int8 = Engine(bundle), Engine(bundle, EngineOptions(int8=True))
    assert (
        bundle.graph("decoder", int8=True).stat().st_size
        < 0.6 * bundle.graph("decoder").stat().st_size
    )
    sources = random_sources(4, 400, seed=7)
    ids, mask = pad(sources, 0).numpy(), (pad(sources, 0) != 0).numpy()
    a, _ = full_log_probs(fp32, fp32.start(ids, mask), np.zeros(4, dtype=np.int64))
    b, _ = full_log_probs(int8, int8.start(ids, mask), np.zeros(4, dtype=np.int64))
    assert np.abs(np.exp(a) - np.exp(b)).max() < 0.05  # quantized, so close but not equal


def test_export_is_deterministic(tiny_checkpoint: Path, tiny_bundle: Path, tmp_path: Path) -> None:
    again = export_bundle(tiny_checkpoint, tmp_path / "again", int8=True)
    first = json.loads((tiny_bundle / "bundle.json").read_text())
    assert again["files"] == first["files"]


def test_a_bundle_whose_files_do_not_match_is_refused(tiny_bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_bundle, copy)
    load_bundle(copy)  # intact: accepted
    with open(copy / "decoder.onnx", "r+b") as f:
        f.seek(-10, 2)
        f.write(b"0123456789")
    with pytest.raises(BundleError, match=r"decoder.onnx has checksum"):
        load_bundle(copy)
    (copy / "encoder.onnx").unlink()
    with pytest.raises(BundleError, match=r"encoder.onnx is missing"):
        load_bundle(copy)
    (copy / "bundle.json").unlink()
    with pytest.raises(BundleError, match=r"bundle.json is missing"):
        load_bundle(copy)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_every_layers_and_heads_alignment_is_the_torch_models(
    tiny_checkpoint: Path, tiny_bundle: Path, beam_size: int
) -> None:
    """alignment_layer / alignment_heads: the chosen layer's weights, head by head, are what
    torch computes when it is fed the hypothesis' own tokens (teacher forcing)."""
    model, _ = load_model_dir(tiny_checkpoint)
    engine = Engine(load_bundle(tiny_bundle))
    sources = random_sources(3, 400, seed=12)
    for layer in range(model.config.decoder_layers):
        options = SearchOptions(
            beam_size=beam_size,
            max_length=20,
            alignment=True,
            alignment_layer=layer,
            alignment_heads=True,
        )
        for source, (best, *_) in zip(sources, search(engine, sources, options), strict=True):
            steps = best.head_alignment.shape[0]
            fed = torch.tensor([[model.config.decoder_start_id, *best.tokens][:steps]])
            source_ids = torch.tensor([source])
            with torch.no_grad():
                cross = model.cross_keys_values(model.encode(source_ids, source_ids != 0))
                _, _, attention = model.decode(
                    fed, model.empty_cache(1), cross, source_ids != 0, all_attention=True
                )  # per layer [1, H, T, S]
            expected = attention[layer][0].transpose(0, 1).numpy()  # [T, H, S]
            np.testing.assert_allclose(best.head_alignment, expected, atol=1e-4)
            np.testing.assert_allclose(best.alignment, expected.mean(axis=1), atol=1e-4)


def test_decoder_steps_of_rows_that_joined_later_match_torch_alone(
    tiny_checkpoint: Path, tiny_bundle: Path
) -> None:
    """positions: a row whose cache is shorter (it joined a running batch later) gets the
    log-probs torch gives it decoding alone."""
    model, _ = load_model_dir(tiny_checkpoint)
    engine = Engine(load_bundle(tiny_bundle))
    early, late = random_sources(2, 400, seed=13)
    state = engine.start(*pad_arrays([early]))
    tokens = np.zeros(1, dtype=np.int64)
    for _ in range(4):  # the early row is 4 steps ahead when the late one joins
        tokens = engine.step(state, tokens, top_k=1).top_ids[:, 0]
    state.extend(engine.start(*pad_arrays([late])))
    log_probs, _ = full_log_probs(engine, state, np.array([tokens[0], 0], dtype=np.int64))
    source_ids = torch.tensor([late])
    with torch.no_grad():
        cross = model.cross_keys_values(model.encode(source_ids, source_ids != 0))
        logits, _, _ = model.decode(
            torch.zeros((1, 1), dtype=torch.long), model.empty_cache(1), cross, source_ids != 0
        )
    expected = torch.log_softmax(logits[:, -1], dim=-1).numpy()
    np.testing.assert_allclose(log_probs[1:], expected, atol=1e-4)


def pad_arrays(sources: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = pad(sources, 0).numpy()
    return ids, ids != 0


def test_a_decoder_graph_from_another_exporter_is_refused_at_load(
    tiny_bundle: Path, tmp_path: Path
) -> None:
    """Same format number, a name missing (an exporter of this format's development): the
    engine says so when it loads, not at the first request that needs the name."""
    import onnx

    from nmt_contract import sha256_of

    graph_file = "decoder.onnx"
    copy = tmp_path / "stale"
    shutil.copytree(tiny_bundle, copy)
    graph = onnx.load(str(copy / graph_file))
    kept = [output for output in graph.graph.output if output.name != "attention_0"]
    del graph.graph.output[:]
    graph.graph.output.extend(kept)
    onnx.save(graph, str(copy / graph_file))
    manifest = json.loads((copy / "bundle.json").read_text())
    manifest["files"][graph_file] = sha256_of(copy / graph_file)
    (copy / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"lacks attention_0.*re-export"):
        Engine(load_bundle(copy))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_token_confidence_is_what_torch_gives_the_produced_tokens(
    tiny_checkpoint: Path, tiny_bundle: Path, beam_size: int
) -> None:
    """SearchOptions.confidence: per produced token (</s> included), its log-prob, the entropy
    estimated from the step's 8 best tokens (the rest as one outcome) and its margin over the
    best other token, as torch computes them with the hypothesis' own tokens fed in; and the
    search finds the same hypotheses as without it."""
    model, _ = load_model_dir(tiny_checkpoint)
    engine = Engine(load_bundle(tiny_bundle))
    sources = random_sources(4, 400, seed=21)
    plain = SearchOptions(beam_size=beam_size, n_best=beam_size, max_length=20)
    options = SearchOptions(beam_size=beam_size, n_best=beam_size, max_length=20, confidence=True)
    without = search(engine, sources, plain)
    found = search(engine, sources, options)
    for source, ours, theirs in zip(sources, found, without, strict=True):
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        for hypothesis in ours:
            steps = hypothesis.token_confidence.shape[0]
            produced = [*hypothesis.tokens, model.config.eos_id][:steps]
            fed = torch.tensor([[model.config.decoder_start_id, *produced][:steps]])
            source_ids = torch.tensor([source])
            with torch.no_grad():
                cross = model.cross_keys_values(model.encode(source_ids, source_ids != 0))
                logits, _, _ = model.decode(fed, model.empty_cache(1), cross, source_ids != 0)
            log_probs = torch.log_softmax(logits[0].double(), dim=-1)  # [T, V]
            top = log_probs.topk(8, dim=-1).values
            p = top.exp()
            rest = (1 - p.sum(-1)).clamp(min=1e-30)
            entropy = -(p * top).sum(-1) - rest * rest.log()
            chosen = log_probs[torch.arange(steps), torch.tensor(produced)]
            others = log_probs.clone()
            others[torch.arange(steps), torch.tensor(produced)] = -torch.inf
            margin = chosen - others.max(dim=-1).values
            expected = torch.stack([chosen, entropy, margin], dim=1).numpy()
            np.testing.assert_allclose(hypothesis.token_confidence, expected, atol=2e-4)
            assert hypothesis.token_confidence[:, 0].sum() == pytest.approx(
                hypothesis.log_prob, abs=1e-3
            )
