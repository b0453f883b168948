"""Each family's options of our one model (export/model/config.py), for tests that hold every
shape to the same properties: the torch model (test_model.py) and the fused step against it
(test_fused_step.py). `vocab` is the target vocabulary's size; a model with separate
vocabularies gets a larger source one."""

from __future__ import annotations

FAMILY_SHAPES: dict[str, dict] = {
    "marian": {},  # our own model's shape: the defaults
    "m2m100": {  # and NLLB
        "pre_norm": True,
        "final_layer_norm": True,
        "positions": "sinusoidal_offset",
        "pad_id": 1,
        "eos_id": 2,
        "unk_id": 3,
        "decoder_start_id": 2,
    },
    "mbart50": {
        "pre_norm": True,
        "final_layer_norm": True,
        "embedding_norm": True,
        "positions": "learned",
        "activation": "gelu",
        "pad_id": 1,
        "eos_id": 2,
        "unk_id": 3,
        "decoder_start_id": 2,
    },
    "marian-separate-vocabularies": {"share_encoder_decoder_embeddings": False},
}


def family_options(family: str, vocab: int) -> dict:
    """ModelConfig arguments for `family` with a target vocabulary of `vocab` words."""
    options = {"vocab_size": vocab, **FAMILY_SHAPES[family]}
    if not options.get("share_encoder_decoder_embeddings", True):
        options |= {"vocab_size": vocab + 13, "decoder_vocab_size": vocab}
    return options
