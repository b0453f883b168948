"""Our model directory -> a Hugging Face M2M-100 directory, for models trained in M2M-100's
layout (`nmt train --pre-norm --positions sinusoidal_offset --decoder-start eos`), which no
Marian directory can hold: `M2M100ForConditionalGeneration` runs the same network.

The layout (see export/model/config.py): pre-norm sub-layers with a LayerNorm after each stack,
fairseq's sinusoidal positions counted from the row after the padding id, decoding started
from </s>, one embedding matrix for encoder, decoder and output projection, no output bias.
Ids keep our numbering: the positions' offset is counted from the padding id, so <pad> stays
where it is. A bilingual model has no language tokens, so the tokenizer is MarianTokenizer
(SentencePiece pieces, then </s>: how our models read a source), not M2M100Tokenizer.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from export.checkpoint import load_model_dir
from export.hf.common import InteropError, hf_layer_name
from export.marian import checked_pieces, network_config, write_hf_directory
from export.model.config import ModelConfig
from export.model.transformer import Transformer

log = logging.getLogger("nmt.m2m100")

# The family options an M2M-100 directory expresses.
M2M100_SHAPE = {
    "pre_norm": True,
    "final_layer_norm": True,
    "embedding_norm": False,
    "positions": "sinusoidal_offset",
    "share_encoder_decoder_embeddings": True,
}


def m2m100_problems(model: Transformer) -> list[str]:
    """What keeps the model out of an M2M-100 directory (none: it exports)."""
    config = model.config
    problems = [
        f"{key}={getattr(config, key)!r} (M2M-100: {value!r})"
        for key, value in M2M100_SHAPE.items()
        if getattr(config, key) != value
    ]
    if config.decoder_start_id != config.eos_id:
        problems.append("decoding starts from another token than </s>")
    if model.final_logits_bias.any():
        problems.append("an output bias (final_logits_bias)")
    return problems


def m2m100_config(config: ModelConfig) -> dict:
    """config.json of the M2M-100 model, in our ids."""
    return {
        "architectures": ["M2M100ForConditionalGeneration"],
        "model_type": "m2m_100",
        **network_config(config),
        "pad_token_id": config.pad_id,
        "eos_token_id": config.eos_id,
        "bos_token_id": None,
        "decoder_start_token_id": config.decoder_start_id,
        "forced_eos_token_id": config.eos_id if config.force_eos_at_limit else None,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dtype": "float32",
    }


def m2m100_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under M2M-100's names (positions are computed, not stored)."""
    weights = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().clone().contiguous()
        if name == "embed_tokens.weight":
            weights["model.shared.weight"] = tensor  # tied to the stacks and lm_head on load
        elif name in ("encoder_layer_norm.weight", "encoder_layer_norm.bias"):
            weights["model.encoder.layer_norm." + name.rpartition(".")[2]] = tensor
        elif name in ("decoder_layer_norm.weight", "decoder_layer_norm.bias"):
            weights["model.decoder.layer_norm." + name.rpartition(".")[2]] = tensor
        elif name != "final_logits_bias":  # (zero: checked by m2m100_problems)
            weights[hf_layer_name(name)] = tensor
    return weights


def export_m2m100(checkpoint: Path, out_dir: Path) -> dict:
    """Our model directory -> a Hugging Face M2M-100 directory (written atomically)."""
    model, tokenizer = load_model_dir(checkpoint)
    config = model.config
    problems = m2m100_problems(model)
    if problems:
        raise InteropError(f"{checkpoint} is not in M2M-100's layout: {'; '.join(problems)}")
    pieces = checked_pieces(tokenizer, config)
    hf_config = m2m100_config(config)
    order = list(range(config.vocab_size))  # our ids, unchanged
    write_hf_directory(out_dir, hf_config, m2m100_weights(model), tokenizer, config, pieces, order)
    log.info("exported %s to %s", checkpoint, out_dir)
    return {
        "out": str(out_dir),
        "family": "m2m_100",
        "vocab_size": config.vocab_size,
        "pad_id": config.pad_id,
        "eos_id": config.eos_id,
    }
