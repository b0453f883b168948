"""Hugging Face Marian (`MarianMTModel`, the opus-mt family) -> our model directory.

Marian is our own model's shape (export/model/config.py's defaults): post-norm, sinusoidal
positions (sines in the first half of the dimensions, cosines in the second), embeddings
scaled by sqrt(d_model) when `scale_embedding`, a frozen `final_logits_bias`, decoding started
from the pad token. So converting is renaming weights, and translating the configuration and
the tokenizer. Marian's ids are kept as they are; the tokenizer files come along
(export/tokenizer.py: VocabTokenizer).

* One shared vocabulary (opus-mt): `source.spm`, `target.spm`, `vocab.json`; one embedding
  matrix tied between encoder, decoder and output projection.
* Separate vocabularies (the newer opus-mt tc-big models: `share_encoder_decoder_embeddings`
  false, `decoder_vocab_size`, `target_vocab.json`): the encoder's embeddings of `vocab_size`
  source words, the decoder's of `decoder_vocab_size` target words, tied to the output
  projection (`share_encoder_decoder_embeddings=False` in our config).

The reverse direction, our checkpoint -> a Marian directory, is export/marian.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from export.hf.common import (
    InteropError,
    check_special_pieces,
    check_vocab_fits,
    decoding_ids,
    read_hf_weights,
    read_json,
    read_optional_json,
    refuse,
    save_imported,
    shape_options,
    shape_problems,
    weights_from_hf,
)
from export.model.config import ModelConfig
from export.tokenizer import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB_JSON, VOCAB_JSON, VocabTokenizer


def unsupported_settings(hf: dict, separate_vocabs: bool) -> list[str]:
    """Everything in a Marian config.json that our model cannot represent; `separate_vocabs`:
    the directory has a target_vocab.json."""
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
        ("tie_word_embeddings", True),
    ):
        if key in hf and bool(hf[key]) != supported:
            problems.append(f"{key}={hf[key]!r} (only {supported} is supported)")
    shared = hf.get("share_encoder_decoder_embeddings", True)
    if shared and separate_vocabs:
        problems.append(
            "share_encoder_decoder_embeddings=True but a target_vocab.json: one vocabulary or two?"
        )
    if not shared and not separate_vocabs:
        problems.append(
            "share_encoder_decoder_embeddings=False needs the target side's vocabulary, "
            "target_vocab.json (separate vocabularies)"
        )
    vocab_size = hf.get("vocab_size")
    if shared and hf.get("decoder_vocab_size") not in (None, vocab_size):
        problems.append(
            f"decoder_vocab_size={hf['decoder_vocab_size']} differs from vocab_size={vocab_size}"
            " with share_encoder_decoder_embeddings (one vocabulary must have one size)"
        )
    return problems + shape_problems(hf)


def marian_languages(
    hf_dir: Path, source_lang: str | None, target_lang: str | None
) -> tuple[str, str]:
    """From the arguments, else tokenizer_config.json, else a name like `opus-mt-fr-en`."""
    found = read_optional_json(hf_dir / "tokenizer_config.json")
    source_lang = source_lang or found.get("source_lang")
    target_lang = target_lang or found.get("target_lang")
    if not (source_lang and target_lang):
        match = re.search(r"([a-z]{2,3})-([a-z]{2,3})$", hf_dir.resolve().name)
        if match:
            source_lang = source_lang or match.group(1)
            target_lang = target_lang or match.group(2)
    if not (source_lang and target_lang):
        raise InteropError(
            f"cannot tell the languages of {hf_dir}: give --source-lang and --target-lang"
        )
    return source_lang, target_lang


def config_from_marian(
    hf: dict,
    vocab: dict[str, int],
    languages: tuple[str, str],
    generation: dict | None = None,
    target_vocab: dict[str, int] | None = None,
) -> ModelConfig:
    """Our ModelConfig for a Marian config.json and its generation_config.json, which wins
    where both say something (refusing what we cannot represent). `target_vocab`: the target
    side's own vocabulary (separate vocabularies)."""
    refuse(unsupported_settings(hf, target_vocab is not None), "Marian")
    ids = decoding_ids(hf, generation or {})
    vocab_size = hf["vocab_size"]
    decoder_vocab_size = 0
    if target_vocab is None:
        unk_id = check_special_pieces(vocab, ids)
        check_vocab_fits(vocab, vocab_size)
    else:
        # The encoder reads the source vocabulary's ids, the decoder writes the target's: the
        # special ids both sides use (</s> ends every source, <unk>) must be the same in both.
        decoder_vocab_size = hf.get("decoder_vocab_size") or vocab_size
        unk_id = check_special_pieces(target_vocab, ids, TARGET_VOCAB_JSON)
        for piece in ("</s>", "<unk>"):
            if vocab.get(piece) != target_vocab[piece]:
                raise InteropError(
                    f"{piece} is {vocab.get(piece)} in vocab.json but {target_vocab[piece]} in "
                    f"{TARGET_VOCAB_JSON}: the two vocabularies must share their special ids"
                )
        if ids["pad_id"] >= vocab_size:
            raise InteropError(f"pad_token_id={ids['pad_id']} is beyond the source vocabulary")
        check_vocab_fits(vocab, vocab_size)
        check_vocab_fits(target_vocab, decoder_vocab_size, TARGET_VOCAB_JSON)
    return ModelConfig(
        vocab_size=vocab_size,
        **shape_options(hf),
        **ids,
        unk_id=unk_id,
        source_lang=languages[0],
        target_lang=languages[1],
        share_encoder_decoder_embeddings=target_vocab is None,
        decoder_vocab_size=decoder_vocab_size,
    )


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
    missing = [
        name for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON) if not (hf_dir / name).is_file()
    ]
    if missing:
        raise InteropError(f"{hf_dir} lacks the Marian tokenizer files {missing}")
    vocab = read_json(hf_dir / VOCAB_JSON)
    separate = (hf_dir / TARGET_VOCAB_JSON).is_file()
    target_vocab = read_json(hf_dir / TARGET_VOCAB_JSON) if separate else None
    languages = marian_languages(hf_dir, source_lang, target_lang)
    generation = read_optional_json(hf_dir / "generation_config.json")
    hf = read_json(hf_dir / "config.json")
    config = config_from_marian(hf, vocab, languages, generation, target_vocab)
    weights = weights_from_hf(read_hf_weights(hf_dir), config)
    names = (SOURCE_SPM, TARGET_SPM, VOCAB_JSON, *((TARGET_VOCAB_JSON,) if separate else ()))
    tokenizer_files = {name: hf_dir / name for name in names}
    # Refuse files the tokenizer cannot read, now.
    VocabTokenizer(*(hf_dir / name for name in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON)))
    if description is None:
        description = marian_description(hf_dir, *languages)
    save_imported(config, weights, dict(tokenizer_files), out_dir, description)
    return config
