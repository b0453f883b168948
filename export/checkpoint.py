"""A model directory: `config.json`, `model.safetensors`, the tokenizer, and optionally
`description.txt`: what the model was trained on and is good for, in a few sentences, which
`nmt export` copies into the bundle for `/v1/models` and the web page to show.

This is what `nmt train` produces, what `models/fr-en/` holds, and what `nmt export` reads.
The tokenizer is either our joint `sentencepiece.model` (ids = SentencePiece ids), or, for
models imported from Hugging Face (`nmt import-hf`), Marian's layout: `source.spm`,
`target.spm` and `vocab.json`, with `target_vocab.json` for separate vocabularies and
`languages.json` for a multilingual model (see export/tokenizer.py).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from export.model.config import ModelConfig
from export.model.transformer import Transformer
from export.tokenizer import (
    LANGUAGES_JSON,
    SOURCE_SPM,
    TARGET_SPM,
    TARGET_VOCAB_JSON,
    VOCAB_JSON,
    Tokenizer,
    VocabTokenizer,
)
from nmt_contract import Languages

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "sentencepiece.model"
DESCRIPTION_FILE = "description.txt"


def read_description(model_dir: Path) -> str:
    """The model directory's description, or "" when it has none."""
    path = Path(model_dir) / DESCRIPTION_FILE
    return " ".join(path.read_text(encoding="utf-8").split()) if path.is_file() else ""


def weights_of(model: Transformer) -> dict[str, torch.Tensor]:
    # The output projection is the (tied) embedding matrix: stored once, under embed_tokens
    # (decoder_embed_tokens for a model with separate vocabularies).
    return {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}


def save_model_dir(
    model: Transformer,
    tokenizer_model: Path | Mapping[str, Path],
    out_dir: Path,
    description: str | None = None,
) -> None:
    """Write atomically: a half-written checkpoint is never left under the final name.

    tokenizer_model: our joint SentencePiece model, or {file name in the directory: source
    path} for Marian's layout (source.spm, target.spm, vocab.json, and target_vocab.json,
    languages.json when the model has them).
    description: written to description.txt; None keeps the one of the directory replaced
    (retraining into models/fr-en does not lose what a person wrote there).
    """
    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.config.to_json(staging / CONFIG_FILE)
    save_file(weights_of(model), str(staging / WEIGHTS_FILE))
    if isinstance(tokenizer_model, Mapping):
        for name, path in tokenizer_model.items():
            shutil.copyfile(path, staging / name)
    else:
        shutil.copyfile(tokenizer_model, staging / TOKENIZER_FILE)
    if description is None:
        description = read_description(out_dir)
    if description:
        (staging / DESCRIPTION_FILE).write_text(description.strip() + "\n", encoding="utf-8")
    if out_dir.exists():
        old = out_dir.with_name(out_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
        os.replace(staging, out_dir)
        shutil.rmtree(old)
    else:
        os.replace(staging, out_dir)


def read_languages(model_dir: Path) -> Languages | None:
    """A multilingual model's language tokens (languages.json), or None."""
    path = Path(model_dir) / LANGUAGES_JSON
    if not path.is_file():
        return None
    return Languages.from_manifest(json.loads(path.read_text(encoding="utf-8")))


def load_tokenizer(model_dir: Path) -> Tokenizer | VocabTokenizer:
    """Our joint SentencePiece model, or Marian's layout: source and target SentencePiece
    models with a vocab (one per side with target_vocab.json; with languages.json, a
    multilingual model's, whose default source language is the config's)."""
    model_dir = Path(model_dir)
    if (model_dir / TOKENIZER_FILE).is_file():
        return Tokenizer(model_dir / TOKENIZER_FILE)
    marian = [model_dir / name for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON)]
    if all(path.is_file() for path in marian):
        target_vocab = model_dir / TARGET_VOCAB_JSON
        languages = read_languages(model_dir)
        source_lang = None
        if languages is not None:
            source_lang = ModelConfig.from_json(model_dir / CONFIG_FILE).source_lang
        return VocabTokenizer(
            *marian,
            target_vocab_path=target_vocab if target_vocab.is_file() else None,
            languages=languages,
            source_lang=source_lang,
        )
    raise FileNotFoundError(
        f"{model_dir} is not a model directory: it has neither {TOKENIZER_FILE} nor "
        f"{SOURCE_SPM}, {TARGET_SPM} and {VOCAB_JSON}"
    )


def load_model_dir(
    model_dir: Path, device: str = "cpu"
) -> tuple[Transformer, Tokenizer | VocabTokenizer]:
    model_dir = Path(model_dir)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (model_dir / name).is_file():
            raise FileNotFoundError(f"{model_dir} is not a model directory: {name} is missing")
    tokenizer = load_tokenizer(model_dir)
    config = ModelConfig.from_json(model_dir / CONFIG_FILE)
    model = Transformer(config)
    model.load_state_dict(load_file(str(model_dir / WEIGHTS_FILE)))
    model.to(device).eval()
    return model, tokenizer
