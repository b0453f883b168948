"""A model directory: `config.json`, `model.safetensors` and `sentencepiece.model`.

This is what `nmt train` produces, what `models/fr-en/` holds, and what `nmt export` reads.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from export.model.config import ModelConfig
from export.model.transformer import Transformer
from export.tokenizer import Tokenizer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "sentencepiece.model"


def weights_of(model: Transformer) -> dict[str, torch.Tensor]:
    # The output projection is the (tied) embedding matrix: stored once, under embed_tokens.
    return {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}


def save_model_dir(model: Transformer, tokenizer_model: Path, out_dir: Path) -> None:
    """Write atomically: a half-written checkpoint is never left under the final name."""
    out_dir = Path(out_dir)
    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.config.to_json(staging / CONFIG_FILE)
    save_file(weights_of(model), str(staging / WEIGHTS_FILE))
    shutil.copyfile(tokenizer_model, staging / TOKENIZER_FILE)
    if out_dir.exists():
        old = out_dir.with_name(out_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
        os.replace(staging, out_dir)
        shutil.rmtree(old)
    else:
        os.replace(staging, out_dir)


def load_model_dir(model_dir: Path, device: str = "cpu") -> tuple[Transformer, Tokenizer]:
    model_dir = Path(model_dir)
    for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE):
        if not (model_dir / name).is_file():
            raise FileNotFoundError(f"{model_dir} is not a model directory: {name} is missing")
    config = ModelConfig.from_json(model_dir / CONFIG_FILE)
    model = Transformer(config)
    model.load_state_dict(load_file(str(model_dir / WEIGHTS_FILE)))
    model.to(device).eval()
    return model, Tokenizer(model_dir / TOKENIZER_FILE)
