"""Hugging Face Marian (`MarianMTModel`, the opus-mt family) <-> our model directory.

Both are the same network: post-norm Transformer, sinusoidal positions (sines in the first
half of the dimensions, cosines in the second), embeddings scaled by sqrt(d_model) when
`scale_embedding`, one embedding matrix tied between encoder, decoder and output projection,
a frozen `final_logits_bias` added to the logits, decoding started from the pad token. So
converting is renaming weights, and translating the configuration and the tokenizer:

* `import_marian`: a local HF Marian directory (config.json, model.safetensors or
  pytorch_model.bin, source.spm, target.spm, vocab.json) -> our model directory, which
  `nmt export` turns into a bundle like any other. Marian's ids are kept as they are; the
  tokenizer files come along (export/tokenizer.py: VocabTokenizer).
* `export_marian`: our model directory -> a HF Marian directory that `MarianMTModel`,
  `MarianTokenizer` and `ct2-transformers-converter` read. Ids are renumbered so that <pad>
  is the last one, as in every opus-mt model: CTranslate2's Marian converter drops the last
  vocabulary entry, taking it to be <pad>.

Weight names, ours <- theirs (per layer N):
    embed_tokens                      <- model.shared (= encoder/decoder embed_tokens, lm_head)
    final_logits_bias [V]             <- final_logits_bias [1, V]
    encoder_layers.N.ffn.fc1          <- model.encoder.layers.N.fc1 (fc2 alike)
    decoder_layers.N.cross_attn       <- model.decoder.layers.N.encoder_attn
    decoder_layers.N.cross_attn_layer_norm <- model.decoder.layers.N.encoder_attn_layer_norm
    everything else (self_attn.{q,k,v,out}_proj, *_layer_norm): the same name.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from export.checkpoint import load_model_dir, save_model_dir
from export.model.config import ModelConfig
from export.model.transformer import Transformer, sinusoidal_table
from export.tokenizer import SOURCE_SPM, TARGET_SPM, VOCAB_JSON, Tokenizer, VocabTokenizer

log = logging.getLogger("nmt.marian")

# Marian's activation names -> ours ("silu" is the same function as "swish").
ACTIVATION_NAMES = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}

# The embedding matrix under every name a Marian checkpoint may store it.
EMBEDDING_NAMES = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)
POSITION_NAMES = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


class MarianInteropError(ValueError):
    """The directory is not a Marian model we can convert (the message says why)."""


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


# ----------------------------------------------------------------------------- import


def _read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _single_id(value, name: str) -> int:
    if isinstance(value, list):
        if len(value) != 1:
            raise MarianInteropError(f"{name} lists several ids {value}; one is supported")
        value = value[0]
    if not isinstance(value, int):
        raise MarianInteropError(f"{name} is {value!r}, an integer id is needed")
    return value


def unsupported_settings(hf: dict) -> list[str]:
    """Everything in a Marian config.json that our model cannot represent."""
    problems = []
    if hf.get("model_type") != "marian":
        problems.append(f"model_type is {hf.get('model_type')!r}, not 'marian'")
    # Names from the BART family that older Marian configs carry; only the Marian values work.
    for key, supported in (
        ("normalize_before", False),
        ("normalize_embedding", False),
        ("add_final_layer_norm", False),
        ("add_bias_logits", False),
        ("static_position_embeddings", True),
        ("share_encoder_decoder_embeddings", True),
        ("tie_word_embeddings", True),
    ):
        if key in hf and bool(hf[key]) != supported:
            problems.append(f"{key}={hf[key]!r} (only {supported} is supported)")
    vocab_size = hf.get("vocab_size")
    if hf.get("decoder_vocab_size") not in (None, vocab_size):
        problems.append(
            f"decoder_vocab_size={hf['decoder_vocab_size']} differs from vocab_size={vocab_size}"
            " (separate source/target vocabularies; one shared vocabulary is supported)"
        )
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


def _languages(hf_dir: Path, source_lang: str | None, target_lang: str | None) -> tuple[str, str]:
    """From the arguments, else tokenizer_config.json, else a name like `opus-mt-fr-en`."""
    tokenizer_config = hf_dir / "tokenizer_config.json"
    found = _read_json(tokenizer_config) if tokenizer_config.is_file() else {}
    source_lang = source_lang or found.get("source_lang")
    target_lang = target_lang or found.get("target_lang")
    if not (source_lang and target_lang):
        match = re.search(r"([a-z]{2,3})-([a-z]{2,3})$", hf_dir.resolve().name)
        if match:
            source_lang = source_lang or match.group(1)
            target_lang = target_lang or match.group(2)
    if not (source_lang and target_lang):
        raise MarianInteropError(
            f"cannot tell the languages of {hf_dir}: give --source-lang and --target-lang"
        )
    return source_lang, target_lang


def config_from_marian(
    hf: dict, vocab: dict[str, int], languages: tuple[str, str], generation: dict | None = None
) -> ModelConfig:
    """Our ModelConfig for a Marian config.json and its generation_config.json, which wins
    where both say something (refusing what we cannot represent)."""
    problems = unsupported_settings(hf)
    if problems:
        raise MarianInteropError(
            "unsupported Marian configuration:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    vocab_size = hf["vocab_size"]
    eos_id = _single_id(hf.get("eos_token_id", 0), "eos_token_id")
    pad_id = _single_id(hf.get("pad_token_id"), "pad_token_id")
    start_id = _single_id(hf.get("decoder_start_token_id", pad_id), "decoder_start_token_id")
    for piece, expected, key in (
        ("</s>", eos_id, "eos_token_id"),
        ("<pad>", pad_id, "pad_token_id"),
    ):
        if vocab.get(piece) != expected:
            raise MarianInteropError(
                f"vocab.json has {piece} = {vocab.get(piece)} but config.json says {key}={expected}"
            )
    if "<unk>" not in vocab:
        raise MarianInteropError("vocab.json has no <unk> piece")
    generation = generation or {}
    forced_eos = generation.get("forced_eos_token_id", hf.get("forced_eos_token_id"))
    largest = max(vocab.values())
    if largest >= vocab_size:
        raise MarianInteropError(
            f"vocab.json uses id {largest}, beyond the model's vocab_size={vocab_size}"
        )
    return ModelConfig(
        vocab_size=vocab_size,
        d_model=hf["d_model"],
        n_heads=hf["encoder_attention_heads"],
        ffn_dim=hf["encoder_ffn_dim"],
        encoder_layers=hf["encoder_layers"],
        decoder_layers=hf["decoder_layers"],
        dropout=float(hf.get("dropout", 0.1)),
        attention_dropout=float(hf.get("attention_dropout", 0.0)),
        activation_dropout=float(hf.get("activation_dropout", 0.0)),
        activation=ACTIVATION_NAMES[hf.get("activation_function", "gelu")],
        max_positions=hf.get("max_position_embeddings", 1024),
        scale_embedding=bool(hf.get("scale_embedding", False)),
        pad_id=pad_id,
        eos_id=eos_id,
        unk_id=vocab["<unk>"],
        decoder_start_id=start_id,
        source_lang=languages[0],
        target_lang=languages[1],
        force_eos_at_limit=forced_eos is not None and forced_eos == eos_id,
    )


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
                hf_dir / f for f in sorted(set(_read_json(hf_dir / index)["weight_map"].values()))
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
    raise MarianInteropError(f"{hf_dir} has no model.safetensors or pytorch_model.bin")


def weights_from_marian(
    hf: dict[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Rename Marian's weights to ours; refuse untied embeddings and learned positions."""
    ours: dict[str, torch.Tensor] = {}
    unused = []
    for name, tensor in hf.items():
        if name in EMBEDDING_NAMES or name in POSITION_NAMES or name == "final_logits_bias":
            continue
        mapped = our_layer_name(name)
        if mapped is None:
            unused.append(name)
        else:
            ours[mapped] = tensor.float()
    if unused:
        raise MarianInteropError(f"weights this converter does not know: {sorted(unused)[:10]}")

    embeddings = [(name, hf[name].float()) for name in EMBEDDING_NAMES if name in hf]
    if not embeddings:
        raise MarianInteropError(f"no embedding matrix among {EMBEDDING_NAMES}")
    first_name, embedding = embeddings[0]
    for name, other in embeddings[1:]:
        if other.shape != embedding.shape or not torch.equal(other, embedding):
            raise MarianInteropError(
                f"{name} differs from {first_name}: untied embeddings are not supported"
            )
    ours["embed_tokens.weight"] = embedding
    bias = hf.get("final_logits_bias")
    ours["final_logits_bias"] = (
        torch.zeros(config.vocab_size) if bias is None else bias.float().reshape(-1)
    )

    # Positions are computed, not learned; a stored table must be the sinusoidal one.
    expected = sinusoidal_table(config.max_positions, config.d_model)
    for name in POSITION_NAMES:
        if name in hf and not torch.allclose(hf[name].float(), expected, atol=1e-4):
            raise MarianInteropError(
                f"{name} is not Marian's sinusoidal table (learned positions?)"
            )
    return ours


def marian_description(hf_dir: Path, source_lang: str, target_lang: str) -> str:
    """What an imported model is, for people choosing it: its name, and the training data its
    model card (README.md, as opus-mt models have) names, when it names one."""
    name = hf_dir.resolve().name
    found = f"{name}: a Hugging Face Marian model ({source_lang}→{target_lang})"
    readme = hf_dir / "README.md"
    if readme.is_file():
        card = readme.read_text(encoding="utf-8", errors="replace")
        match = re.search(r"^\W*datasets?\W*:\s*(.+?)\s*$", card, flags=re.MULTILINE | re.I)
        if match:
            dataset = match.group(1)
            found += f"; trained on {dataset}" + (
                " (OPUS: a general-domain collection of parallel corpora)"
                if dataset.lower().startswith("opus")
                else ""
            )
    return found + "."


def import_marian(
    hf_dir: Path,
    out_dir: Path,
    source_lang: str | None = None,
    target_lang: str | None = None,
    description: str | None = None,
) -> ModelConfig:
    """A local HF Marian directory -> our model directory (config, weights, tokenizer files,
    and description.txt: `description`, else one made from the directory's model card)."""
    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise MarianInteropError(f"{hf_dir} has no config.json: not a Hugging Face model directory")
    missing = [
        name for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON) if not (hf_dir / name).is_file()
    ]
    if missing:
        raise MarianInteropError(f"{hf_dir} lacks the Marian tokenizer files {missing}")
    if (hf_dir / "target_vocab.json").is_file():
        raise MarianInteropError(
            f"{hf_dir} has a target_vocab.json (separate vocabularies): only one shared "
            "vocab.json is supported"
        )
    vocab = _read_json(hf_dir / VOCAB_JSON)
    languages = _languages(hf_dir, source_lang, target_lang)
    generation_file = hf_dir / "generation_config.json"
    generation = _read_json(generation_file) if generation_file.is_file() else None
    config = config_from_marian(_read_json(hf_dir / "config.json"), vocab, languages, generation)
    model = Transformer(config)
    weights = weights_from_marian(read_hf_weights(hf_dir), config)
    result = model.load_state_dict(weights, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise MarianInteropError(
            f"weights do not fit the configuration: missing {result.missing_keys[:10]}, "
            f"unexpected {result.unexpected_keys[:10]}"
        )
    tokenizer_files = {name: hf_dir / name for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON)}
    VocabTokenizer(*tokenizer_files.values())  # refuse files the tokenizer cannot read, now
    if description is None:
        description = marian_description(hf_dir, *languages)
    save_model_dir(model.eval(), tokenizer_files, Path(out_dir), description)
    log.info("imported %s into %s", hf_dir, out_dir)
    return config


# ----------------------------------------------------------------------------- export


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


def marian_config(config: ModelConfig) -> dict:
    """config.json of the Marian model, in our ids renumbered by marian_order."""
    to_marian = {ours: m for m, ours in enumerate(marian_order(config))}
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.vocab_size,
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


def export_marian(checkpoint: Path, out_dir: Path) -> dict:
    """Our model directory -> a Hugging Face Marian directory (written atomically)."""
    model, tokenizer = load_model_dir(checkpoint)
    config = model.config
    order = marian_order(config)
    pieces = pieces_of(tokenizer, config.vocab_size)
    if len(set(pieces)) != len(pieces):
        raise MarianInteropError("the tokenizer gives two ids the same piece: no vocab.json")
    # MarianTokenizer (and CTranslate2) find the special tokens by these pieces.
    for piece, i in (("</s>", config.eos_id), ("<pad>", config.pad_id), ("<unk>", config.unk_id)):
        if pieces[i] != piece:
            raise MarianInteropError(f"id {i} is the piece {pieces[i]!r}; Marian needs {piece!r}")
    hf_config = marian_config(config)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        (staging / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        (staging / "generation_config.json").write_text(
            json.dumps(generation_config(hf_config), indent=2) + "\n"
        )
        save_file(marian_weights(model), str(staging / "model.safetensors"), {"format": "pt"})
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
