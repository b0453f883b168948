"""Hugging Face mBART-50 (`MBartForConditionalGeneration` with `MBart50Tokenizer`, as
facebook/mbart-large-50-many-to-many-mmt) -> our model directory.

The network is our model with
* pre-norm sub-layers and a final LayerNorm after each stack (`pre_norm`, `final_layer_norm`);
* a LayerNorm over embeddings plus positions on each side (`embedding_norm`: mBART's
  `layernorm_embedding`);
* learned positions, a table per side; BART keeps two unused rows in front of each, which the
  import leaves out (`positions="learned"`);
* a `final_logits_bias`, and </s> forced at the length limit (MBartConfig's
  forced_eos_token_id); decoding starts from </s>.

The tokenizer numbers SentencePiece's pieces as fairseq does (<s> <pad> </s> <unk>, then the
pieces shifted by one), then the 52 language codes `fr_XX`, then <mask>. Sources are
[src_lang, pieces..., </s>]; the target language's code is the first token written
(`forced_bos_token_id`).
"""

from __future__ import annotations

from pathlib import Path

from export.hf.common import InteropError, read_json, read_optional_json
from export.hf.languages import MBART50_CODES
from export.hf.multilingual import (
    check_tokenizer_json,
    default_pair,
    fairseq_vocab,
    import_multilingual,
    languages_of,
)
from export.model.config import ModelConfig

SPM_FILE = "sentencepiece.bpe.model"
OPTIONS = {
    "pre_norm": True,
    "final_layer_norm": True,
    "embedding_norm": True,
    "positions": "learned",
}


def import_mbart50(
    hf_dir: Path,
    out_dir: Path,
    source_lang: str | None = None,
    target_lang: str | None = None,
    description: str | None = None,
) -> ModelConfig:
    hf = read_json(hf_dir / "config.json")
    if hf.get("model_type") != "mbart":
        raise InteropError(f"model_type is {hf.get('model_type')!r}, not 'mbart'")
    tokenizer_config = read_optional_json(hf_dir / "tokenizer_config.json")
    tokenizer_class = tokenizer_config.get("tokenizer_class", "")
    if not tokenizer_class.startswith("MBart50Tokenizer"):
        raise InteropError(
            f"tokenizer_class {tokenizer_class or None!r}: mBART is imported with "
            "MBart50Tokenizer (the many-to-many mBART-50 models)"
        )
    spm_path = hf_dir / SPM_FILE
    if not spm_path.is_file():
        raise InteropError(f"{hf_dir} lacks the tokenizer's {SPM_FILE}")
    vocab = fairseq_vocab(spm_path, MBART50_CODES)
    check_tokenizer_json(hf_dir, vocab)
    languages = languages_of(vocab, list(MBART50_CODES), MBART50_CODES, "mbart50", "prefix")
    pair = default_pair(languages, tokenizer_config, source_lang, target_lang)
    return import_multilingual(
        hf_dir, out_dir, hf, spm_path, vocab, languages, OPTIONS, "mbart50", pair, description
    )
