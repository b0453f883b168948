"""Hugging Face checkpoints -> our model directory (`nmt import-hf`): one importer per family,
each a configuration of our one model (export/model/config.py), sharing what they can
(common.py: configuration keys, weight names, writing; multilingual.py: language tokens).

| config.json's architecture | tokenizer | module |
|---|---|---|
| MarianMTModel (opus-mt, tc-big) | MarianTokenizer | marian.py |
| M2M100ForConditionalGeneration | M2M100Tokenizer (M2M-100), NllbTokenizer (NLLB-200) | m2m100.py |
| MBartForConditionalGeneration | MBart50Tokenizer (mBART-50 many-to-many) | mbart.py |

Everything works on local directories; nothing is downloaded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from export.hf.common import InteropError, read_json
from export.hf.m2m100 import import_m2m100
from export.hf.marian import import_marian
from export.hf.mbart import import_mbart50
from export.model.config import ModelConfig

log = logging.getLogger("nmt.import")

Importer = Callable[[Path, Path, str | None, str | None, str | None], ModelConfig]

# config.json's model_type -> the family's importer
IMPORTERS: dict[str, Importer] = {
    "marian": import_marian,
    "m2m_100": import_m2m100,
    "mbart": import_mbart50,
}
ARCHITECTURES = {
    "MarianMTModel": "marian",
    "M2M100ForConditionalGeneration": "m2m_100",
    "MBartForConditionalGeneration": "mbart",
}


def family_of(hf: dict) -> str:
    """config.json -> its model_type among IMPORTERS (from `architectures` when it has none)."""
    model_type = hf.get("model_type")
    if model_type is None:
        known = [ARCHITECTURES[a] for a in hf.get("architectures") or [] if a in ARCHITECTURES]
        model_type = known[0] if known else None
    if model_type not in IMPORTERS:
        raise InteropError(
            f"model_type {model_type!r} (architectures {hf.get('architectures')}): the "
            f"importable families are {', '.join(ARCHITECTURES)}"
        )
    return model_type


def import_hf(
    hf_dir: Path,
    out_dir: Path,
    source_lang: str | None = None,
    target_lang: str | None = None,
    description: str | None = None,
) -> ModelConfig:
    """A local Hugging Face directory -> our model directory, which `nmt export` turns into a
    bundle like any other. source_lang, target_lang: the pair (a multilingual model's default
    pair); description: for description.txt (default: made from the model card)."""
    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise InteropError(f"{hf_dir} has no config.json: not a Hugging Face model directory")
    family = family_of(read_json(hf_dir / "config.json"))
    config = IMPORTERS[family](hf_dir, Path(out_dir), source_lang, target_lang, description)
    log.info("imported %s (%s) into %s", hf_dir, family, out_dir)
    return config


__all__ = ["InteropError", "import_hf"]
