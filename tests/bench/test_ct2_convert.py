"""bench/compare/ct2_convert.py: a checkpoint of any of our shapes, converted straight to
CTranslate2, decodes token for token as the torch reference (greedy and beam 4), pre-norm
students included, which no Hugging Face class holds."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the export extra (torch)")
ctranslate2 = pytest.importorskip("ctranslate2", reason="needs the bench extra")

import torch  # noqa: E402

from bench.compare.ct2_convert import convert  # noqa: E402
from export.checkpoint import load_model_dir, save_model_dir  # noqa: E402
from export.decoding import beam_search, greedy_search  # noqa: E402
from export.marian import pieces_of  # noqa: E402
from export.model.config import ModelConfig  # noqa: E402
from export.model.transformer import Transformer  # noqa: E402
from nmt_contract import length_limit  # noqa: E402
from tests.conftest import REVERSE_WORDS  # noqa: E402

SHAPES = {
    # a student: deep encoder, one decoder layer, pre-norm with a LayerNorm after each stack
    "pre-norm 4 + 1": {"encoder_layers": 4, "decoder_layers": 1, "pre_norm": True},
    # the committed model's family (Marian's shape), for which the stock converter also works
    "post-norm 2 + 2": {"encoder_layers": 2, "decoder_layers": 2, "pre_norm": False},
    # a student trained in M2M-100's layout (nmt train --positions sinusoidal_offset
    # --decoder-start eos): no output bias, positions from the row after <pad>, starts at </s>
    "M2M-100 layout 4 + 1": {
        "encoder_layers": 4,
        "decoder_layers": 1,
        "pre_norm": True,
        "positions": "sinusoidal_offset",
        "decoder_start_id": 1,
    },
}


def random_checkpoint(folder: Path, tokenizer: Path, shape: dict) -> Path:
    import sentencepiece as spm

    vocab = spm.SentencePieceProcessor(model_file=str(tokenizer)).get_piece_size()
    config = ModelConfig(
        vocab_size=vocab,
        d_model=64,
        n_heads=4,
        ffn_dim=128,
        dropout=0.0,
        max_positions=128,
        final_layer_norm=shape["pre_norm"],
        **shape,
    )
    torch.manual_seed(5)
    model = Transformer(config).eval()
    with torch.no_grad():  # spread the logits out, so that no two words nearly tie
        model.embed_tokens.weight.mul_(4.0)
        if config.positions != "sinusoidal_offset":  # (M2M-100 has no output bias)
            model.final_logits_bias.copy_(torch.randn(vocab))
            model.final_logits_bias[config.eos_id] = 3.0
        for norm in (model.stack_norm("encoder"), model.stack_norm("decoder")):
            if norm is not None:  # not the identity a fresh LayerNorm is
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.2, 0.2)
    save_model_dir(model, tokenizer, folder)
    return folder


@pytest.mark.parametrize("name", SHAPES)
def test_a_checkpoint_decodes_in_ctranslate2_as_in_torch(
    name: str, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    checkpoint = random_checkpoint(
        tmp_path / "model", tiny_checkpoint / "sentencepiece.model", SHAPES[name]
    )
    convert(checkpoint, tmp_path / "ct2")
    model, tokenizer = load_model_dir(checkpoint)
    pieces = pieces_of(tokenizer, model.config.vocab_size)
    our_id = {piece: i for i, piece in enumerate(pieces)}
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    rng = random.Random(11)
    for _ in range(10):
        source = tokenizer.encode(" ".join(rng.choices(REVERSE_WORDS, k=rng.randint(2, 9))))
        ids = torch.tensor([source])
        mask = ids != model.config.pad_id
        limit = length_limit(len(source), 256, model.config.max_positions)
        for beam in (1, 4):
            with torch.no_grad():
                if beam == 1:
                    expected = greedy_search(model, ids, mask)[0].tokens
                else:
                    expected = beam_search(model, ids, mask, beam)[0][0].tokens
            result = translator.translate_batch(
                [[pieces[i] for i in source]],
                beam_size=beam,
                max_decoding_length=limit,
                min_decoding_length=0,
                length_penalty=1.0,
                patience=2.0 if beam > 1 else 1.0,  # (searches as far as ours: runners.py)
            )
            assert [our_id[p] for p in result[0].hypotheses[0]] == expected, (name, beam)


def test_bench_compare_prepares_and_checks_a_pre_norm_checkpoint_without_transformers(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """No Marian directory for it: CTranslate2 from our weights, the transformers engine left
    out of the parity check, and ours and CTranslate2 give the same beam-4 translations."""
    from bench.compare.parity import run_parity
    from bench.compare.prepare import prepare

    checkpoint = random_checkpoint(
        tmp_path / "model", tiny_checkpoint / "sentencepiece.model", SHAPES["pre-norm 4 + 1"]
    )
    rng = random.Random(3)
    lines = [" ".join(rng.choices(REVERSE_WORDS, k=rng.randint(2, 9))) for _ in range(8)]
    data = tmp_path / "test.src"
    data.write_text("\n".join(lines) + "\n")
    paths = prepare(checkpoint, tmp_path / "work")
    assert set(paths) == {"bundle", "ct2"}
    assert prepare(checkpoint, tmp_path / "work") == paths  # kept while nothing changed
    result = run_parity(checkpoint, data, tmp_path / "work", threads=1)
    assert set(result["engines"]) == {"ctranslate2 fp32"}  # (each against ours fp32)
    assert result["engines"]["ctranslate2 fp32"]["equal"] == len(lines)


def test_bench_compare_runs_transformers_on_a_checkpoint_in_m2m100_layout(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """A student trained in M2M-100's layout has a Hugging Face directory (export/m2m100.py):
    transformers joins the parity check, and every engine gives ours' beam-4 translations."""
    from bench.compare.parity import run_parity
    from bench.compare.prepare import prepare

    checkpoint = random_checkpoint(
        tmp_path / "model", tiny_checkpoint / "sentencepiece.model", SHAPES["M2M-100 layout 4 + 1"]
    )
    rng = random.Random(4)
    lines = [" ".join(rng.choices(REVERSE_WORDS, k=rng.randint(2, 9))) for _ in range(8)]
    data = tmp_path / "test.src"
    data.write_text("\n".join(lines) + "\n")
    paths = prepare(checkpoint, tmp_path / "work")
    assert set(paths) == {"bundle", "hf", "ct2"}
    result = run_parity(checkpoint, data, tmp_path / "work", threads=1)
    assert set(result["engines"]) == {"ctranslate2 fp32", "transformers fp32"}
    for name, report in result["engines"].items():
        assert report["equal"] == len(lines), (name, report["differences"])
