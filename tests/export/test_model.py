"""The torch Transformer: masking, and incremental decoding against full recomputation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from export.model.config import ModelConfig  # noqa: E402
from export.model.packing import Packing  # noqa: E402
from export.model.transformer import Transformer  # noqa: E402
from tests.export.shapes import FAMILY_SHAPES, family_options  # noqa: E402


@pytest.fixture(scope="module", params=list(FAMILY_SHAPES))
def model(request: pytest.FixtureRequest) -> Transformer:
    """The model in each family's shape: every property below holds for all of them."""
    torch.manual_seed(0)
    options = family_options(request.param, vocab=60)
    config = ModelConfig(d_model=32, n_heads=4, ffn_dim=64, dropout=0.0, **options)
    model = Transformer(config).eval()
    with torch.no_grad():  # LayerNorms that are not the identity, so that misplacing one shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.2 * torch.randn(parameter.shape))
    return model


def test_the_default_model_is_marian_shaped_with_the_parameters_it_always_had() -> None:
    """Existing checkpoints (models/) load unchanged: the family options add no parameter to
    the default shape."""
    config = ModelConfig()
    assert (config.pre_norm, config.final_layer_norm, config.embedding_norm) == (False,) * 3
    assert config.positions == "sinusoidal" and config.share_encoder_decoder_embeddings
    assert config.target_vocab_size == config.vocab_size
    names = set(Transformer(ModelConfig(vocab_size=40, d_model=16, n_heads=2)).state_dict())
    outside_layers = {n for n in names if not n.startswith(("encoder_layers.", "decoder_layers."))}
    assert outside_layers == {"embed_tokens.weight", "final_logits_bias"}


def test_a_shape_adds_only_its_own_parameters() -> None:
    def extra(family: str) -> set[str]:
        config = ModelConfig(d_model=16, n_heads=2, **family_options(family, vocab=40))
        names = set(Transformer(config).state_dict())
        return {n for n in names if not n.startswith(("encoder_layers.", "decoder_layers."))}

    base = {"embed_tokens.weight", "final_logits_bias"}
    assert extra("m2m100") == base | {
        f"{side}_layer_norm.{p}" for side in ("encoder", "decoder") for p in ("weight", "bias")
    }
    assert extra("mbart50") == extra("m2m100") | {
        "encoder_positions.weight",
        "decoder_positions.weight",
        *(
            f"{side}_embedding_norm.{p}"
            for side in ("encoder", "decoder")
            for p in ("weight", "bias")
        ),
    }
    assert extra("marian-separate-vocabularies") == base | {"decoder_embed_tokens.weight"}


def test_family_options_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(ValueError, match="positions must be one of"):
        ModelConfig(positions="rotary")
    with pytest.raises(ValueError, match="decoder_vocab_size=9 differs"):
        ModelConfig(vocab_size=10, decoder_vocab_size=9)


def padded_batch(pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three sources of lengths 9, 6 and 3: the last two padded."""
    generator = torch.Generator().manual_seed(1)
    source_ids = torch.randint(3, 60, (3, 9), generator=generator)
    lengths = torch.tensor([9, 6, 3])
    source_mask = torch.arange(9)[None, :] < lengths[:, None]
    return source_ids.masked_fill(~source_mask, pad_id), source_mask


def test_changing_a_later_target_token_never_changes_earlier_outputs(model: Transformer) -> None:
    source_ids, source_mask = padded_batch()
    target = torch.randint(3, 60, (3, 8), generator=torch.Generator().manual_seed(2))
    for changed_position in (1, 4, 7):
        altered = target.clone()
        altered[:, changed_position] = (altered[:, changed_position] + 1 - 3) % 57 + 3
        with torch.no_grad():
            before = model(source_ids, source_mask, target)
            after = model(source_ids, source_mask, altered)
        assert torch.equal(before[:, :changed_position], after[:, :changed_position])
        # and the change is visible from that position on (the mask hides nothing it should not)
        assert not torch.allclose(before[:, changed_position:], after[:, changed_position:])


def test_padding_in_the_source_is_invisible(model: Transformer) -> None:
    source_ids, source_mask = padded_batch()
    target = torch.randint(3, 60, (3, 5), generator=torch.Generator().manual_seed(3))
    junk = source_ids.masked_fill(~source_mask, 17)  # other ids under the padding
    with torch.no_grad():
        assert torch.allclose(
            model(source_ids, source_mask, target), model(junk, source_mask, target), atol=1e-6
        )


def test_incremental_decoding_with_caches_equals_full_recomputation(model: Transformer) -> None:
    source_ids, source_mask = padded_batch()
    steps = 10
    target = torch.randint(3, 60, (3, steps), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(source_ids, source_mask, target)  # [B, T, V], no cache at all
        cross = model.cross_keys_values(model.encode(source_ids, source_mask))
        past = model.empty_cache(3)
        for step in range(steps):
            logits, past, _ = model.decode(target[:, step : step + 1], past, cross, source_mask)
            assert (logits[:, 0] - full[:, step]).abs().max() <= 1e-5
            assert past[0][0].shape == (3, 4, step + 1, 8)  # the cache grows one position a step


def test_alignment_weights_cover_only_real_source_tokens(model: Transformer) -> None:
    source_ids, source_mask = padded_batch()
    with torch.no_grad():
        cross = model.cross_keys_values(model.encode(source_ids, source_mask))
        start = torch.zeros((3, 1), dtype=torch.long)
        _, _, weights = model.decode(start, model.empty_cache(3), cross, source_mask)
    assert weights.shape == (3, 1, 9)  # [B, T, S]
    assert torch.allclose(weights.sum(-1), torch.ones(3, 1))
    assert weights.masked_select(~source_mask[:, None, :]).abs().max() == 0


def test_beams_sharing_one_copy_of_the_source_equal_beams_with_their_own(
    model: Transformer,
) -> None:
    """Cross keys/values per sentence, the K beams as K queries, equal K repeated copies."""
    source_ids, source_mask = padded_batch()
    beams, steps = 3, 6
    target = torch.randint(3, 60, (3 * beams, steps), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        shared = model.cross_keys_values(model.encode(source_ids, source_mask))  # [3, H, S, Dh]
        repeated = [
            (k.repeat_interleave(beams, 0), v.repeat_interleave(beams, 0)) for k, v in shared
        ]
        mask_repeated = source_mask.repeat_interleave(beams, 0)
        past_a, past_b = model.empty_cache(3 * beams), model.empty_cache(3 * beams)
        for step in range(steps):
            tokens = target[:, step : step + 1]
            logits_a, past_a, weights_a = model.decode(tokens, past_a, shared, source_mask)
            logits_b, past_b, weights_b = model.decode(tokens, past_b, repeated, mask_repeated)
            assert (logits_a - logits_b).abs().max() <= 1e-5
            assert (weights_a - weights_b).abs().max() <= 1e-6
            assert weights_a.shape == (3 * beams, 1, 9)


def test_packing_round_trips_the_real_tokens_in_order() -> None:
    _, source_mask = padded_batch()
    padded = torch.arange(3 * 9 * 2, dtype=torch.float32).reshape(3, 9, 2)
    packing = Packing(source_mask)
    packed = packing.pack(padded)
    assert packed.shape == (9 + 6 + 3, 2)
    assert torch.equal(packed, padded[source_mask])  # row by row, position by position
    unpacked = packing.unpack(packed)
    assert torch.equal(unpacked[source_mask], padded[source_mask])
    assert torch.equal(unpacked[~source_mask], padded[0, 0].expand(9 - 6 + 9 - 3, 2))


def test_the_encoder_on_packed_tokens_computes_what_it_does_on_the_padded_batch(
    model: Transformer,
) -> None:
    """What the exported encoder runs (export/model/packing.py), at every real token."""
    source_ids, source_mask = padded_batch()
    with torch.no_grad():
        padded = model.encode(source_ids, source_mask)  # [B, S, D]
        packed = model.encode(source_ids, source_mask, Packing(source_mask))
    assert packed.shape == padded.shape
    assert (packed - padded)[source_mask].abs().max() <= 1e-5
