"""Ensemble decoding (export/ensemble.py): the members' mean probability, step by step."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from export.checkpoint import TOKENIZER_FILE, save_model_dir  # noqa: E402
from export.decoding import beam_search, greedy_search  # noqa: E402
from export.ensemble import Ensemble, load_ensemble  # noqa: E402
from export.model.config import ModelConfig  # noqa: E402
from export.model.transformer import Transformer  # noqa: E402


def random_model(seed: int, decoder_layers: int = 2, d_model: int = 32) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=40, d_model=d_model, n_heads=4, ffn_dim=64, dropout=0.0,
        encoder_layers=2, decoder_layers=decoder_layers,
    )  # fmt: skip
    model = Transformer(config).eval()
    model.final_logits_bias[config.eos_id] = 1.0  # hypotheses end at varied lengths
    return model


def test_each_step_is_the_log_of_the_members_mean_probability(batch) -> None:
    # Members of different depth and width: the flat cache must be split right.
    first, second = random_model(1, decoder_layers=1), random_model(2, d_model=48)
    ensemble = Ensemble([first, second])
    source_ids, source_mask = batch
    target_in = torch.tensor([[0, 7, 9, 11]] * source_ids.shape[0])
    with torch.no_grad():
        expected = torch.log(
            (
                torch.softmax(first(source_ids, source_mask, target_in), dim=-1)
                + torch.softmax(second(source_ids, source_mask, target_in), dim=-1)
            )
            / 2
        )  # [B, T, V], from each model's own uncached pass
        cross = ensemble.cross_keys_values(ensemble.encode(source_ids, source_mask))
        past = ensemble.empty_cache(source_ids.shape[0])
        for position in range(target_in.shape[1]):  # step by step, through the caches
            log_probs, past, _ = ensemble.decode(
                target_in[:, position : position + 1], past, cross, source_mask
            )
            torch.testing.assert_close(log_probs[:, 0], expected[:, position], atol=1e-5, rtol=0)
    assert len(past) == 1 + 2 and past[0][0].shape[2] == target_in.shape[1]


def test_an_ensemble_of_one_model_twice_decodes_as_the_model(batch) -> None:
    model = random_model(3)
    ensemble = Ensemble([model, model])
    for ours, its in zip(
        beam_search(ensemble, *batch, beam_size=3, n_best=2),
        beam_search(model, *batch, beam_size=3, n_best=2),
        strict=True,
    ):
        assert [h.tokens for h in ours] == [h.tokens for h in its]
        for a, b in zip(ours, its, strict=True):
            assert math.isclose(a.score, b.score, abs_tol=1e-4)
    greedy = [h.tokens for h in greedy_search(ensemble, *batch)]
    assert greedy == [h.tokens for h in greedy_search(model, *batch)]


def test_members_must_share_the_vocabulary_and_the_tokenizer(tmp_path: Path) -> None:
    committed = Path("models/fr-en")
    if not (committed / TOKENIZER_FILE).is_file():
        pytest.skip("the committed model is not in this checkout")
    small = random_model(4)
    with pytest.raises(ValueError, match="vocab_size"):
        Ensemble([small, Transformer(ModelConfig(vocab_size=41, d_model=32, n_heads=4))])
    for name in ("a", "b"):
        save_model_dir(small, committed / TOKENIZER_FILE, tmp_path / name, description="")
    ensemble, _ = load_ensemble([tmp_path / "a", tmp_path / "b"])
    assert len(ensemble.members) == 2
    other = tmp_path / "other-pieces"
    shutil.copytree(tmp_path / "b", other)
    (other / TOKENIZER_FILE).write_bytes(b"not the same pieces")
    with pytest.raises(ValueError, match="does not share"):
        load_ensemble([tmp_path / "a", other])
