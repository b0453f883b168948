"""A model directory: `config.json`, `model.safetensors`, the tokenizer, and optionally
`description.txt`: what the model was trained on and is good for, in a few sentences, which
`nmt export` copies into the bundle for `/v1/models` and the web page to show.

This is what `nmt train` produces, what `models/fr-en/` holds, and what `nmt export` reads.
The tokenizer is either our joint `sentencepiece.model` (ids = SentencePiece ids), or, for
models imported from Hugging Face Marian (`nmt import-marian`), Marian's `source.spm`,
`target.spm` and `vocab.json` (see export/tokenizer.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from export.model.config import ModelConfig
from export.model.transformer import Transformer
from export.tokenizer import SOURCE_SPM, TARGET_SPM, VOCAB_JSON, Tokenizer, VocabTokenizer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "sentencepiece.model"
DESCRIPTION_FILE = "description.txt"


def read_description(model_dir: Path) -> str:
    """The model directory's description, or "" when it has none."""
    path = Path(model_dir) / DESCRIPTION_FILE
    return " ".join(path.read_text(encoding="utf-8").split()) if path.is_file() else ""


def weights_of(model: Transformer) -> dict[str, torch.Tensor]:
    # The output projection is the (tied) embedding matrix: stored once, under embed_tokens.
    return {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}


def save_model_dir(
    model: Transformer,
    tokenizer_model: Path | Mapping[str, Path],
    out_dir: Path,
    description: str | None = None,
) -> None:
    """Write atomically: a half-written checkpoint is never left under the final name.

    tokenizer_model: our joint SentencePiece model, or {file name in the directory: source
    path} for Marian's layout (source.spm, target.spm, vocab.json).
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


def load_tokenizer(model_dir: Path) -> Tokenizer | VocabTokenizer:
    """Our joint SentencePiece model, or Marian's source/target models with a shared vocab."""
    model_dir = Path(model_dir)
    if (model_dir / TOKENIZER_FILE).is_file():
        return Tokenizer(model_dir / TOKENIZER_FILE)
    marian = [model_dir / name for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON)]
    if all(path.is_file() for path in marian):
        return VocabTokenizer(*marian)
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
