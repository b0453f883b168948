"""Our model directory -> a Hugging Face Marian directory (`nmt export-marian`), which
`MarianMTModel`, `MarianTokenizer` and `ct2-transformers-converter` read: the same weights run
by transformers and CTranslate2, as baselines (bench/compare/).

Both are the same network (see export/hf/marian.py for the other direction, and
export/hf/common.py for the weight names). Ids are renumbered so that <pad> is the last one,
as in every opus-mt model: CTranslate2's Marian converter drops the last vocabulary entry,
taking it to be <pad>. Only Marian-shaped models export (our own, and imported Marian models
with one shared vocabulary).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from export.checkpoint import load_model_dir
from export.hf.common import InteropError, hf_layer_name
from export.model.config import ModelConfig
from export.model.transformer import Transformer
from export.tokenizer import SOURCE_SPM, TARGET_SPM, VOCAB_JSON, Tokenizer, VocabTokenizer

log = logging.getLogger("nmt.marian")

# The family options a Marian directory can express: ModelConfig's defaults.
MARIAN_SHAPE = {
    "pre_norm": False,
    "final_layer_norm": False,
    "embedding_norm": False,
    "positions": "sinusoidal",
    "share_encoder_decoder_embeddings": True,
}


# ----------------------------------------------------------------------------- export


def is_marian_shaped(config: ModelConfig) -> bool:
    """Whether a Marian directory can hold the model (else, export/m2m100.py may)."""
    return all(getattr(config, key) == value for key, value in MARIAN_SHAPE.items())


def marian_order(config: ModelConfig) -> list[int]:
    """Our ids in Marian's order: order[marian_id] = our_id. <pad> moves to the end (opus-mt's
    layout, which CTranslate2's converter relies on); the others keep their relative order."""
    return [i for i in range(config.vocab_size) if i != config.pad_id] + [config.pad_id]


def pieces_of(tokenizer: Tokenizer | VocabTokenizer, vocab_size: int) -> list[str]:
    """The piece of every id (ids without one get a placeholder, so vocab.json is complete)."""
    if isinstance(tokenizer, VocabTokenizer):
        return [tokenizer.piece_of.get(i, f"<unused{i}>") for i in range(vocab_size)]
    size = tokenizer.vocab_size
    return [
        tokenizer.processor.id_to_piece(i) if i < size else f"<unused{i}>"
        for i in range(vocab_size)
    ]


def network_config(config: ModelConfig) -> dict:
    """The network's size and training-time settings, named alike by every BART-family
    config.json (the inverse of export/hf/common.py's shape_options)."""
    return {
        "vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.ffn_dim,
        "decoder_ffn_dim": config.ffn_dim,
        "activation_function": config.activation,
        "max_position_embeddings": config.max_positions,
        "scale_embedding": config.scale_embedding,
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout,
    }


def marian_config(config: ModelConfig) -> dict:
    """config.json of the Marian model, in our ids renumbered by marian_order."""
    to_marian = {ours: m for m, ours in enumerate(marian_order(config))}
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "decoder_vocab_size": config.vocab_size,
        **network_config(config),
        "pad_token_id": to_marian[config.pad_id],
        "eos_token_id": to_marian[config.eos_id],
        "decoder_start_token_id": to_marian[config.decoder_start_id],
        "bos_token_id": None,
        # MarianConfig's default (0) would force </s> at max_length, which our engine does only
        # for models that asked for it (imported opus-mt models do).
        "forced_eos_token_id": to_marian[config.eos_id] if config.force_eos_at_limit else None,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dtype": "float32",
    }


def generation_config(config: dict) -> dict:
    """Decoding settings that match our engine: </s> forced at the limit only when the model
    asks for it, no banned words."""
    return {
        "decoder_start_token_id": config["decoder_start_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "forced_eos_token_id": config["forced_eos_token_id"],
        "max_length": config["max_position_embeddings"],
    }


def marian_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, with ids renumbered by marian_order."""
    order = torch.tensor(marian_order(model.config))
    weights = {}
    for name, tensor in model.state_dict().items():
        if name == "embed_tokens.weight":
            # Stored once: the model ties encoder, decoder and lm_head to it on load.
            weights["model.shared.weight"] = tensor[order].contiguous()
        elif name == "final_logits_bias":
            weights["final_logits_bias"] = tensor[order][None].contiguous()
        else:
            weights[hf_layer_name(name)] = tensor.detach().clone().contiguous()
    return weights


def write_hf_directory(
    out_dir: Path,
    hf_config: dict,
    weights: dict[str, torch.Tensor],
    tokenizer: Tokenizer | VocabTokenizer,
    config: ModelConfig,
    pieces: list[str],
    order: list[int],
) -> None:
    """A Hugging Face model directory, written atomically: config.json, generation_config.json,
    the weights, and a MarianTokenizer (the SentencePiece models and vocab.json, id order[i]
    of ours numbered i): pieces, then </s>, which is how our models read a source."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        (staging / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        (staging / "generation_config.json").write_text(
            json.dumps(generation_config(hf_config), indent=2) + "\n"
        )
        save_file(weights, str(staging / "model.safetensors"), {"format": "pt"})
        vocab = {pieces[ours]: m for m, ours in enumerate(order)}
        (staging / VOCAB_JSON).write_text(json.dumps(vocab, ensure_ascii=False, indent=1) + "\n")
        source, target = tokenizer.files["source"], tokenizer.files["target"]
        shutil.copyfile(source, staging / SOURCE_SPM)
        shutil.copyfile(target, staging / TARGET_SPM)
        specials = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
        tokenizer_config = {
            "tokenizer_class": "MarianTokenizer",
            "source_lang": config.source_lang,
            "target_lang": config.target_lang,
            "model_max_length": config.max_positions,
            "separate_vocabs": False,
            **specials,
        }
        (staging / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config, indent=2) + "\n"
        )
        (staging / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def checked_pieces(tokenizer: Tokenizer | VocabTokenizer, config: ModelConfig) -> list[str]:
    """Every id's piece, refused unless vocab.json can hold them and MarianTokenizer finds the
    special tokens by their pieces."""
    pieces = pieces_of(tokenizer, config.vocab_size)
    if len(set(pieces)) != len(pieces):
        raise InteropError("the tokenizer gives two ids the same piece: no vocab.json")
    for piece, i in (("</s>", config.eos_id), ("<pad>", config.pad_id), ("<unk>", config.unk_id)):
        if pieces[i] != piece:
            raise InteropError(f"id {i} is the piece {pieces[i]!r}; Hugging Face needs {piece!r}")
    return pieces


def export_marian(checkpoint: Path, out_dir: Path) -> dict:
    """Our model directory -> a Hugging Face Marian directory (written atomically)."""
    model, tokenizer = load_model_dir(checkpoint)
    config = model.config
    if not is_marian_shaped(config):
        other = {k: getattr(config, k) for k, v in MARIAN_SHAPE.items() if getattr(config, k) != v}
        raise InteropError(f"{checkpoint} is not Marian-shaped ({other}): no Marian export")
    order = marian_order(config)
    pieces = checked_pieces(tokenizer, config)
    hf_config = marian_config(config)
    write_hf_directory(out_dir, hf_config, marian_weights(model), tokenizer, config, pieces, order)
    pad_norm = float(model.embed_tokens.weight[config.pad_id].detach().norm())
    if pad_norm > 0:
        # Marian (and CTranslate2's Marian converter) start the decoder from a zero vector;
        # transformers and we start from the <pad> embedding. Equal only when that row is 0.
        log.warning(
            "the <pad> embedding of %s is not zero (norm %.3g): transformers and our engine "
            "start decoding from it, CTranslate2 from a zero vector, so CTranslate2's "
            "translations may differ",
            checkpoint,
            pad_norm,
        )
    log.info("exported %s to %s", checkpoint, out_dir)
    return {
        "out": str(out_dir),
        "vocab_size": config.vocab_size,
        "pad_id": hf_config["pad_token_id"],
        "eos_id": hf_config["eos_token_id"],
        "pad_embedding_norm": pad_norm,
    }


def our_ids_to_marian(config: ModelConfig) -> list[int]:
    """to_marian[our_id] = marian_id, for feeding our tokenized sources to the exported model."""
    to_marian = [0] * config.vocab_size
    for m, ours in enumerate(marian_order(config)):
        to_marian[ours] = m
    return to_marian
