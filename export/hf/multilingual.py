"""What the multilingual families (M2M-100, NLLB, mBART-50) share: one SentencePiece model for
both sides, language tokens in the vocabulary, and the steps from a Hugging Face directory to
our model directory.

Their ids are not SentencePiece's. M2M-100 ships a `vocab.json` (piece -> id) and numbers its
language tokens after it. NLLB and mBART-50 use fairseq's numbering: <s> 0, <pad> 1, </s> 2,
<unk> 3, then SentencePiece's pieces shifted by one (its own <unk>, <s>, </s> at 0-2 give way
to those four), then the language tokens, then <mask>. Either way the importer writes the
model's whole vocabulary out as one `vocab.json`, language tokens included, so that both
tokenizers (export/tokenizer.py, service/runtime/tokenizer.py) read every family the same
way: SentencePiece cuts the text, the vocabulary gives the ids.

The languages go to `languages.json` (nmt_contract.Languages): every language's token, where
the source's goes, and that the target's is written first (forced).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import sentencepiece as spm

from export.hf.common import (
    InteropError,
    license_of,
    read_hf_weights,
    save_imported,
    shared_vocab_config,
    weights_from_hf,
)
from export.hf.languages import our_codes
from export.model.config import ModelConfig
from export.tokenizer import LANGUAGES_JSON, SOURCE_SPM, TARGET_SPM, VOCAB_JSON
from nmt_contract import Languages, UnknownLanguage

FAIRSEQ_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
FAIRSEQ_OFFSET = 1  # fairseq id = SentencePiece id + 1, for SentencePiece's ids 3 and above
SPM_CONTROL = 3  # SentencePiece's <unk>, <s>, </s> come first in these models
FAMILY_NAMES = {"m2m100": "M2M-100", "nllb": "NLLB", "mbart50": "mBART-50"}


def fairseq_vocab(spm_path: Path, language_codes: tuple[str, ...]) -> dict[str, int]:
    """NLLB's and mBART-50's piece -> id vocabulary, made from their SentencePiece model as
    their tokenizers make it (see the module docstring)."""
    processor = spm.SentencePieceProcessor(model_file=str(spm_path))
    size = processor.get_piece_size()
    vocab = dict(FAIRSEQ_SPECIALS)
    for i in range(SPM_CONTROL, size):
        vocab[processor.id_to_piece(i)] = i + FAIRSEQ_OFFSET
    first = size + FAIRSEQ_OFFSET
    vocab.update({code: first + i for i, code in enumerate(language_codes)})
    vocab["<mask>"] = first + len(language_codes)
    return vocab


def check_tokenizer_json(hf_dir: Path, vocab: dict[str, int]) -> None:
    """A directory's tokenizer.json (what transformers' fast tokenizers read) must give the
    special and language tokens it lists the ids we give them."""
    path = hf_dir / "tokenizer.json"
    if not path.is_file():
        return
    added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])
    differ = [
        f"{token['content']} = {token['id']} (ours {vocab[token['content']]})"
        for token in added
        if token["content"] in vocab and vocab[token["content"]] != token["id"]
    ]
    if differ:
        raise InteropError(f"{path} numbers tokens otherwise: {', '.join(differ[:10])}")


def languages_of(
    vocab: dict[str, int],
    tokens: list[str],
    model_codes: tuple[str, ...],
    family: str,
    source_token: str,
) -> Languages:
    """The Languages of a family: `tokens[i]` is the piece of language `model_codes[i]`."""
    codes = our_codes(model_codes, family)
    return Languages(
        tokens={code: vocab[token] for code, token in zip(codes, tokens, strict=True)},
        model_codes=dict(zip(codes, model_codes, strict=True)),
        source_token=source_token,
    )


def default_pair(
    languages: Languages,
    tokenizer_config: dict,
    source_lang: str | None,
    target_lang: str | None,
) -> tuple[str, str]:
    """The pair a multilingual bundle serves when nobody names one: the arguments, else the
    tokenizer's src_lang and tgt_lang, else English and French (or the first languages)."""
    ours = dict(zip(languages.model_codes.values(), languages.model_codes, strict=True))
    found = [
        lang or ours.get(tokenizer_config.get(key) or "")
        for lang, key in ((source_lang, "src_lang"), (target_lang, "tgt_lang"))
    ]
    codes = languages.codes
    source = found[0] or ("en" if "en" in codes else codes[0])
    target = found[1] or next(c for c in ("en", "fr", *codes) if c in codes and c != source)
    for code in (source, target):
        try:
            languages.token_of(code)
        except UnknownLanguage as error:
            raise InteropError(f"--source-lang/--target-lang: {error}") from error
    return source, target


def import_multilingual(
    hf_dir: Path,
    out_dir: Path,
    hf: dict,
    spm_path: Path,
    vocab: dict[str, int],
    languages: Languages,
    options: dict,
    family: str,
    pair: tuple[str, str],
    description: str | None,
) -> ModelConfig:
    """The common steps: config, weights, tokenizer files, description; `options` are the
    family's ModelConfig options (pre_norm, positions, ...)."""
    config = shared_vocab_config(hf_dir, hf, vocab, FAMILY_NAMES[family], pair, options)
    weights = weights_from_hf(read_hf_weights(hf_dir), config)

    def write_json(data: dict) -> Callable[[Path], None]:
        return lambda path: path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")

    files: dict[str, Path | Callable[[Path], None]] = {
        SOURCE_SPM: spm_path,  # (one model for both sides)
        TARGET_SPM: spm_path,
        VOCAB_JSON: write_json(vocab),
        LANGUAGES_JSON: write_json(languages.to_manifest()),
    }
    if description is None:
        name, count = hf_dir.resolve().name, len(languages.tokens)
        description = (
            f"{name}: a Hugging Face {FAMILY_NAMES[family]} model, {count} languages (every pair)"
        )
        licence = license_of(hf_dir)
        description += f"; licence {licence}." if licence else "."
    save_imported(config, weights, files, out_dir, description)
    return config
