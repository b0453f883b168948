"""What the Hugging Face importers share: reading a directory's configuration and weights,
translating the BART-family configuration keys every family uses, renaming weights, and
writing our model directory.

Weight names, ours <- theirs (per layer N; the BART family names them alike):
    embed_tokens                      <- model.shared (= encoder/decoder embed_tokens, lm_head),
                                         or model.encoder.embed_tokens when not shared
    decoder_embed_tokens              <- model.decoder.embed_tokens (= lm_head), when not shared
    {encoder,decoder}_positions [P, D] <- model.{encoder,decoder}.embed_positions [P + 2, D]
                                         from row 2 on (learned positions: mBART)
    {encoder,decoder}_embedding_norm  <- model.{encoder,decoder}.layernorm_embedding
    {encoder,decoder}_layer_norm      <- model.{encoder,decoder}.layer_norm
    final_logits_bias [V]             <- final_logits_bias [1, V]
    encoder_layers.N.ffn.fc1          <- model.encoder.layers.N.fc1 (fc2 alike)
    decoder_layers.N.cross_attn       <- model.decoder.layers.N.encoder_attn
    decoder_layers.N.cross_attn_layer_norm <- model.decoder.layers.N.encoder_attn_layer_norm
    everything else (self_attn.{q,k,v,out}_proj, *_layer_norm): the same name.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from export.checkpoint import save_model_dir
from export.model.config import ModelConfig
from export.model.transformer import Transformer, computed_positions

# Their activation names -> ours ("silu" is the same function as "swish").
ACTIVATION_NAMES = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}

# The shared embedding matrix under every name a checkpoint may store it.
EMBEDDING_NAMES = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)
# Position tables, stored learned (mBART) or as a copy of the computed one (Marian, M2M-100).
POSITION_NAMES = {
    "encoder": ("model.encoder.embed_positions.weight", "model.encoder.embed_positions.weights"),
    "decoder": ("model.decoder.embed_positions.weight", "model.decoder.embed_positions.weights"),
}
# Learned position tables keep two rows in front that no position uses (BART's offset).
LEARNED_POSITION_OFFSET = 2
# A stack's own LayerNorms: theirs (without "model.") -> ours.
STACK_NAMES = {
    "encoder.layer_norm": "encoder_layer_norm",
    "decoder.layer_norm": "decoder_layer_norm",
    "encoder.layernorm_embedding": "encoder_embedding_norm",
    "decoder.layernorm_embedding": "decoder_embedding_norm",
}


class InteropError(ValueError):
    """The directory is not a model we can convert (the message says why)."""


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_optional_json(path: Path) -> dict:
    return read_json(path) if Path(path).is_file() else {}


# ----------------------------------------------------------------------------- names


def our_layer_name(hf_name: str) -> str | None:
    """`model.decoder.layers.0.encoder_attn.q_proj.weight` -> `decoder_layers.0.cross_attn...`;
    None for names outside the encoder/decoder layers."""
    match = re.fullmatch(r"(?:model\.)?(encoder|decoder)\.layers\.(\d+)\.(.+)", hf_name)
    if match is None:
        return None
    side, index, rest = match.groups()
    rest = rest.replace("encoder_attn", "cross_attn")  # also encoder_attn_layer_norm
    if rest.startswith(("fc1.", "fc2.")):
        rest = "ffn." + rest
    return f"{side}_layers.{index}.{rest}"


def hf_layer_name(our_name: str) -> str:
    """The inverse of our_layer_name."""
    side, index, rest = re.fullmatch(r"(encoder|decoder)_layers\.(\d+)\.(.+)", our_name).groups()
    rest = rest.replace("cross_attn", "encoder_attn").removeprefix("ffn.")
    return f"model.{side}.layers.{index}.{rest}"


def our_stack_name(hf_name: str) -> str | None:
    """`model.encoder.layer_norm.weight` -> `encoder_layer_norm.weight`; None for others."""
    module, _, parameter = hf_name.removeprefix("model.").rpartition(".")
    return f"{STACK_NAMES[module]}.{parameter}" if module in STACK_NAMES else None


# ----------------------------------------------------------------------------- config


def single_id(value: Any, name: str) -> int:
    if isinstance(value, list):
        if len(value) != 1:
            raise InteropError(f"{name} lists several ids {value}; one is supported")
        value = value[0]
    if not isinstance(value, int):
        raise InteropError(f"{name} is {value!r}, an integer id is needed")
    return value


def shape_problems(hf: dict) -> list[str]:
    """What our one model cannot represent in a BART-family config.json's shape: encoder and
    decoder differing in heads or feed-forward width, an activation we lack, a width the heads
    do not divide."""
    problems = []
    for encoder_key, decoder_key in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf.get(encoder_key) != hf.get(decoder_key):
            problems.append(
                f"{encoder_key}={hf.get(encoder_key)} differs from "
                f"{decoder_key}={hf.get(decoder_key)} (one value for both sides is supported)"
            )
    activation = hf.get("activation_function", "gelu")
    if activation not in ACTIVATION_NAMES:
        problems.append(
            f"activation_function={activation!r} (supported: {sorted(ACTIVATION_NAMES)})"
        )
    d_model, heads = hf.get("d_model"), hf.get("encoder_attention_heads")
    if not isinstance(d_model, int) or d_model % 2:
        problems.append(f"d_model={d_model!r} must be an even integer (sinusoidal positions)")
    elif not isinstance(heads, int) or d_model % heads:
        problems.append(f"d_model={d_model} is not divisible by the {heads} attention heads")
    return problems


def refuse(problems: list[str], family: str) -> None:
    if problems:
        raise InteropError(
            f"unsupported {family} configuration:\n" + "\n".join(f"  - {p}" for p in problems)
        )


def shape_options(hf: dict) -> dict:
    """ModelConfig's arguments for the network's size and training-time settings, which every
    family names alike."""
    return {
        "d_model": hf["d_model"],
        "n_heads": hf["encoder_attention_heads"],
        "ffn_dim": hf["encoder_ffn_dim"],
        "encoder_layers": hf["encoder_layers"],
        "decoder_layers": hf["decoder_layers"],
        "dropout": float(hf.get("dropout", 0.1)),
        "attention_dropout": float(hf.get("attention_dropout", 0.0)),
        "activation_dropout": float(hf.get("activation_dropout", 0.0)),
        "activation": ACTIVATION_NAMES[hf.get("activation_function", "gelu")],
        "max_positions": hf.get("max_position_embeddings", 1024),
        "scale_embedding": bool(hf.get("scale_embedding", False)),
    }


def decoding_ids(hf: dict, generation: dict) -> dict:
    """ModelConfig's pad_id, eos_id, decoder_start_id and force_eos_at_limit from config.json
    and generation_config.json (which wins where both say something)."""
    eos_id = single_id(hf.get("eos_token_id", 0), "eos_token_id")
    pad_id = single_id(hf.get("pad_token_id"), "pad_token_id")
    # What generate starts from: decoder_start_token_id, else bos_token_id (as transformers),
    # else the pad token (Marian's).
    start = next(
        (
            found
            for key in ("decoder_start_token_id", "bos_token_id")
            for found in (generation.get(key), hf.get(key))
            if found is not None
        ),
        pad_id,
    )
    forced_eos = generation.get("forced_eos_token_id", hf.get("forced_eos_token_id"))
    return {
        "pad_id": pad_id,
        "eos_id": eos_id,
        "decoder_start_id": single_id(start, "decoder_start_token_id"),
        "force_eos_at_limit": forced_eos is not None and forced_eos == eos_id,
    }


def check_special_pieces(vocab: dict[str, int], ids: dict, name: str = "vocab.json") -> int:
    """The vocabulary agrees with config.json on </s> and <pad>, and has <unk>: its id."""
    for piece, key, hf_key in (
        ("</s>", "eos_id", "eos_token_id"),
        ("<pad>", "pad_id", "pad_token_id"),
    ):
        if vocab.get(piece) != ids[key]:
            raise InteropError(
                f"{name} has {piece} = {vocab.get(piece)} but config.json says {hf_key}={ids[key]}"
            )
    if "<unk>" not in vocab:
        raise InteropError(f"{name} has no <unk> piece")
    return vocab["<unk>"]


def check_vocab_fits(vocab: dict[str, int], size: int, name: str = "vocab.json") -> None:
    largest = max(vocab.values())
    if largest >= size:
        raise InteropError(f"{name} uses id {largest}, beyond the model's {size} words")


def shared_vocab_config(
    hf_dir: Path, hf: dict, vocab: dict[str, int], family: str, pair: tuple[str, str], options: dict
) -> ModelConfig:
    """The ModelConfig of a model in the M2M-100 layout (one vocabulary for both sides, tied
    embeddings), after refusing what we cannot run: its shape, an untied output projection,
    special pieces that disagree with config.json, ids beyond the model's words. `options` are
    the family's own settings (pre_norm, positions, ...)."""
    problems = shape_problems(hf)
    if hf.get("tie_word_embeddings", True) is False:
        problems.append("tie_word_embeddings=False (an output projection of its own)")
    refuse(problems, family)
    ids = decoding_ids(hf, read_optional_json(hf_dir / "generation_config.json"))
    unk_id = check_special_pieces(vocab, ids)
    check_vocab_fits(vocab, hf["vocab_size"])
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        **shape_options(hf),
        **ids,
        unk_id=unk_id,
        source_lang=pair[0],
        target_lang=pair[1],
        **options,
    )


# ----------------------------------------------------------------------------- weights


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, pytorch_model.bin, or either one sharded (with its index.json)."""
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (hf_dir / single).is_file():
            files = [hf_dir / single]
        elif (hf_dir / index).is_file():
            files = [
                hf_dir / f for f in sorted(set(read_json(hf_dir / index)["weight_map"].values()))
            ]
        else:
            continue
        weights: dict[str, torch.Tensor] = {}
        for file in files:
            if file.suffix == ".safetensors":
                weights.update(load_file(str(file)))
            else:
                weights.update(torch.load(file, map_location="cpu", weights_only=True))
        return weights
    raise InteropError(f"{hf_dir} has no model.safetensors or pytorch_model.bin")


def _one_matrix(hf: dict[str, torch.Tensor], names: tuple[str, ...], what: str) -> torch.Tensor:
    """The matrix stored under any of `names`; all stored copies must be equal (tied)."""
    found = [(name, hf[name].float()) for name in names if name in hf]
    if not found:
        raise InteropError(f"no {what} among {names}")
    first_name, matrix = found[0]
    for name, other in found[1:]:
        if other.shape != matrix.shape or not torch.equal(other, matrix):
            raise InteropError(f"{name} differs from {first_name}: untied embeddings")
    return matrix


def _positions(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Learned tables from their offset on; a stored copy of a computed table must be ours."""
    ours = {}
    expected = None if config.positions == "learned" else computed_positions(config)
    for side, names in POSITION_NAMES.items():
        stored = [hf[name].float() for name in names if name in hf]
        if config.positions == "learned":
            if not stored:
                raise InteropError(f"no learned position table among {names}")
            table = stored[0][LEARNED_POSITION_OFFSET:]
            if len(table) != config.max_positions:
                raise InteropError(
                    f"the {side}'s position table has {len(stored[0])} rows, not "
                    f"max_position_embeddings + {LEARNED_POSITION_OFFSET}"
                )
            ours[f"{side}_positions.weight"] = table
            continue
        for table in stored:  # a copy of the computed table (the first rows of it suffice)
            if config.positions == "sinusoidal_offset":
                table = table[config.pad_id + 1 :]
            rows = min(len(table), len(expected))
            if not torch.allclose(table[:rows], expected[:rows], atol=1e-4):
                raise InteropError(
                    f"the {side}'s stored position table is not the {config.positions} one "
                    "(learned positions?)"
                )
    return ours


def weights_from_hf(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename a BART-family checkpoint's weights to ours (see the module docstring)."""
    ours: dict[str, torch.Tensor] = {}
    unused = []
    positions = {name for names in POSITION_NAMES.values() for name in names}
    for name, tensor in hf.items():
        if name in EMBEDDING_NAMES or name in positions or name == "final_logits_bias":
            continue
        mapped = our_layer_name(name) or our_stack_name(name)
        if mapped is None:
            unused.append(name)
        else:
            ours[mapped] = tensor.float()
    if unused:
        raise InteropError(f"weights this converter does not know: {sorted(unused)[:10]}")

    if config.share_encoder_decoder_embeddings:
        ours["embed_tokens.weight"] = _one_matrix(hf, EMBEDDING_NAMES, "embedding matrix")
    else:
        encoder = ("model.encoder.embed_tokens.weight",)
        decoder = ("model.decoder.embed_tokens.weight", "lm_head.weight")
        ours["embed_tokens.weight"] = _one_matrix(hf, encoder, "source embedding matrix")
        ours["decoder_embed_tokens.weight"] = _one_matrix(hf, decoder, "target embedding matrix")
    bias = hf.get("final_logits_bias")
    ours["final_logits_bias"] = (
        torch.zeros(config.target_vocab_size) if bias is None else bias.float().reshape(-1)
    )
    ours.update(_positions(hf, config))
    return ours


# ----------------------------------------------------------------------------- writing


def license_of(hf_dir: Path) -> str | None:
    """The licence a model card (README.md front matter) names, e.g. `cc-by-nc-4.0`."""
    readme = hf_dir / "README.md"
    if not readme.is_file():
        return None
    card = readme.read_text(encoding="utf-8", errors="replace")
    match = re.search(r"^license:\s*(\S+)\s*$", card, flags=re.MULTILINE | re.I)
    return match.group(1) if match else None


def save_imported(
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    tokenizer_files: dict[str, Path | Callable[[Path], None]],
    out_dir: Path,
    description: str,
) -> None:
    """Build our model from the renamed weights (every parameter accounted for) and write the
    model directory. `tokenizer_files`: file name -> a file to copy, or a function that
    writes it (files made at import: vocab.json, languages.json)."""
    model = Transformer(config)
    result = model.load_state_dict(weights, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise InteropError(
            f"weights do not fit the configuration: missing {result.missing_keys[:10]}, "
            f"unexpected {result.unexpected_keys[:10]}"
        )
    with tempfile.TemporaryDirectory(prefix="nmt-import-") as made:
        files = {}
        for name, source in tokenizer_files.items():
            if callable(source):
                source(Path(made) / name)
                source = Path(made) / name
            files[name] = Path(source)
        save_model_dir(model.eval(), files, Path(out_dir), description)
