"""Hugging Face M2M-100 and NLLB (`M2M100ForConditionalGeneration`) -> our model directory.

One network, two tokenizers. The network is our model with
* pre-norm sub-layers and a final LayerNorm after each stack (`pre_norm`, `final_layer_norm`);
* fairseq's sinusoidal positions, whose first real position is the row after the padding id
  (`positions="sinusoidal_offset"`);
* embeddings scaled by sqrt(d_model), one matrix for encoder, decoder and output projection,
  no final_logits_bias; decoding starts from </s> (decoder_start_token_id 2).

The tokenizer says which model it is:
* `MarianTokenizer`: a bilingual model in M2M-100's layout, as `nmt export-hf` writes one of
  ours (export/m2m100.py): `source.spm`, `target.spm` and `vocab.json`, no language tokens;
  sources are [pieces..., </s>]. Imported as Marian's tokenizer is (export/hf/marian.py).
* `M2M100Tokenizer` (M2M-100): `sentencepiece.bpe.model` cuts, `vocab.json` numbers the pieces,
  and the language tokens `__fr__` follow the vocabulary in M2M-100's order (or WMT21's,
  `language_codes`). Sources are [__src__, pieces..., </s>].
* `NllbTokenizer` (NLLB-200): fairseq ids from `sentencepiece.bpe.model`, then the language
  tokens `fra_Latn`, then <mask>. Sources are [src_lang, pieces..., </s>], or with
  `legacy_behaviour` [pieces..., </s>, src_lang].
Either way, the target language's token is the first one written (`forced_bos_token_id`).
"""

from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

from export.hf.common import (
    InteropError,
    read_hf_weights,
    read_json,
    read_optional_json,
    save_imported,
    shared_vocab_config,
    weights_from_hf,
)
from export.hf.languages import M2M100_CODES, NLLB_CODES, WMT21_CODES
from export.hf.multilingual import (
    check_tokenizer_json,
    default_pair,
    fairseq_vocab,
    import_multilingual,
    languages_of,
)
from export.model.config import ModelConfig
from export.tokenizer import SOURCE_SPM, TARGET_SPM, VOCAB_JSON, VocabTokenizer

SPM_FILE = "sentencepiece.bpe.model"
OPTIONS = {"pre_norm": True, "final_layer_norm": True, "positions": "sinusoidal_offset"}


def tokenizer_family(hf_dir: Path) -> str:
    """The tokenizer, "m2m100", "nllb" or "bilingual" (MarianTokenizer): tokenizer_config.json's
    class, else the files."""
    tokenizer_class = read_optional_json(hf_dir / "tokenizer_config.json").get("tokenizer_class")
    if tokenizer_class:
        if tokenizer_class.startswith("MarianTokenizer"):
            return "bilingual"
        if tokenizer_class.startswith("M2M100Tokenizer"):
            return "m2m100"
        if tokenizer_class.startswith("NllbTokenizer"):
            return "nllb"
        raise InteropError(
            f"tokenizer_class {tokenizer_class!r}: an M2M100ForConditionalGeneration model is "
            "imported with M2M100Tokenizer, NllbTokenizer or MarianTokenizer"
        )
    return "m2m100" if (hf_dir / "vocab.json").is_file() else "nllb"


def import_m2m100(
    hf_dir: Path,
    out_dir: Path,
    source_lang: str | None = None,
    target_lang: str | None = None,
    description: str | None = None,
) -> ModelConfig:
    hf = read_json(hf_dir / "config.json")
    if hf.get("model_type") != "m2m_100":
        raise InteropError(f"model_type is {hf.get('model_type')!r}, not 'm2m_100'")
    if tokenizer_family(hf_dir) == "bilingual":
        return import_bilingual(hf_dir, out_dir, hf, source_lang, target_lang, description)
    spm_path = hf_dir / SPM_FILE
    if not spm_path.is_file():
        raise InteropError(f"{hf_dir} lacks the tokenizer's {SPM_FILE}")
    spm.SentencePieceProcessor(model_file=str(spm_path))  # (refuse one it cannot read, now)
    tokenizer_config = read_optional_json(hf_dir / "tokenizer_config.json")
    family = tokenizer_family(hf_dir)
    if family == "m2m100":
        if not (hf_dir / "vocab.json").is_file():
            raise InteropError(f"{hf_dir} lacks M2M100Tokenizer's vocab.json")
        vocab = read_json(hf_dir / "vocab.json")
        sets = {"m2m100": M2M100_CODES, "wmt21": WMT21_CODES}
        code_set = tokenizer_config.get("language_codes", "m2m100")
        if code_set not in sets:
            raise InteropError(f"language_codes {code_set!r} (supported: {sorted(sets)})")
        model_codes = sets[code_set]
        tokens = [f"__{code}__" for code in model_codes]
        first = len(vocab)  # M2M100Tokenizer numbers its language tokens after the vocabulary
        vocab |= {token: first + i for i, token in enumerate(tokens)}
        source_token = "prefix"
    else:
        model_codes = NLLB_CODES
        tokens = list(model_codes)
        vocab = fairseq_vocab(spm_path, model_codes)
        check_tokenizer_json(hf_dir, vocab)
        source_token = "suffix" if tokenizer_config.get("legacy_behaviour") else "prefix"
    languages = languages_of(vocab, tokens, model_codes, family, source_token)
    pair = default_pair(languages, tokenizer_config, source_lang, target_lang)
    return import_multilingual(
        hf_dir, out_dir, hf, spm_path, vocab, languages, OPTIONS, family, pair, description
    )


def import_bilingual(
    hf_dir: Path,
    out_dir: Path,
    hf: dict,
    source_lang: str | None,
    target_lang: str | None,
    description: str | None,
) -> ModelConfig:
    """A bilingual model in M2M-100's layout with Marian's tokenizer files (what `nmt
    export-hf` writes for a student trained in that layout)."""
    from export.hf.marian import marian_languages

    missing = [
        name for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON) if not (hf_dir / name).is_file()
    ]
    if missing:
        raise InteropError(f"{hf_dir} lacks MarianTokenizer's files {missing}")
    vocab = read_json(hf_dir / VOCAB_JSON)
    languages = marian_languages(hf_dir, source_lang, target_lang)
    config = shared_vocab_config(hf_dir, hf, vocab, "M2M-100", languages, OPTIONS)
    weights = weights_from_hf(read_hf_weights(hf_dir), config)
    files = {name: hf_dir / name for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON)}
    VocabTokenizer(*files.values())  # (refuse files the tokenizer cannot read, now)
    if description is None:
        name = hf_dir.resolve().name
        description = f"{name}: a Hugging Face M2M-100 model ({languages[0]}→{languages[1]})."
    save_imported(config, weights, dict(files), out_dir, description)
    return config
