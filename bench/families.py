"""The real shapes of the multilingual families, with random weights: ours against
CTranslate2 and `transformers` `generate` on the same weights and the same sentences
(issue 36).

    python -m bench.families --families m2m100-418m --sentences 16 --sentences-batch-1 2 \
        --repeat 3
    python -m bench.families --families nllb-600m,mbart50 --sentences 16 \
        --sentences-batch-1 1 --repeat 2 --section families-nllb-mbart50

The published checkpoints cannot be downloaded here, so each model is built from a
`transformers` config of the published shape (`SHAPES`: M2M-100 418M, NLLB-200 distilled
600M, mBART-50 many-to-many; and a tiny one of each family for the tests) with random
weights, and a SentencePiece model trained on Multi30k's English, French and German. An
M2M-100 gets the published vocabulary's size in its `vocab.json` (the trained pieces, then
filler pieces no text produces), so its tokenizers hold 128,004 pieces as the real one does;
NLLB and mBART-50 number their pieces from the SentencePiece model, so their tokenizers know
the trained pieces only, in a network of the published vocabulary (the ids past them, which
a random model writes too, become <unk> in our text and are left out of transformers').

One run, for each family in turn:
* prepare (in a process of its own, cached in --work-dir; --rebuild to redo it): the Hugging
  Face directory, `nmt import-hf` into our model directory, a vocabulary shortlist for it
  (`family_shortlist`: Dice co-occurrence over Multi30k's training lines, the three
  directions together, with `export/shortlist.py`), `export_bundle` with int8 (timed:
  import, the whole export, and its int8 quantization run again alone to split it), the
  same shortlist as CTranslate2's vocabulary map, CTranslate2's own converter
  (`TransformersConverter`, int8, the map converted in) on the same Hugging Face directory,
  the sizes on disk, and how many times the graphs hold the embedding;
* time six engines, each in its own process (so that its peak memory is its own), loaded at
  once and taking turns on every 20 sentences of a pass (one batch from batch 20 on; a
  pass's time the sum of each stretch's median), configuration by configuration and repeat
  by repeat (as `bench.compare` does), so that the machine's drifts fall on all of them
  alike:
  ours fp32, ours int8 and ours int8 with the shortlist (`Translator.translate`, texts in
  and out, the target language's token forced first), CTranslate2 int8 without and with its
  vocabulary map (`translate_batch`, the family tokenizer's pieces in and out, the target
  language's token as the target prefix; not with the map, which fails with one in
  CTranslate2 4.8.5) and transformers fp32 (the family's tokenizer,
  `generate` with `forced_bos_token_id`, `batch_decode`), one thread each. At batch 1 a pass
  translates --sentences-batch-1 sentences per direction (a batch-1 token costs much the
  same whatever the sentence, and those passes take most of the time), at the larger batch
  --sentences;
* the same work for every engine: the weights are randomized so that </s> never wins (its
  logit is pushed down, `EOS_BONUS`), and every sentence is long enough that its length limit
  is --max-length, so every translation is exactly --max-length tokens long on every engine
  (checked: the report says so, or gives the lengths found; and how many translations are
  token for token transformers').

Writes one section of docs/benchmarks.md (--section, "families" by default; --out another
file). Needs the `bench` extra (transformers, torch, ctranslate2).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.compare.worker import turns
from bench.report import opening, replace_section

if TYPE_CHECKING:
    from nmt_contract import Shortlist

ROOT = Path(__file__).resolve().parent.parent
DIRECTIONS = (("en", "fr"), ("fr", "de"), ("de", "en"))
LANGUAGES = ("en", "fr", "de")
DATA_SPLIT = "test_2016_flickr"  # the timed sentences (not in the SentencePiece corpus)
ENGINES = (
    "ours fp32",
    "ours int8",
    "ours int8 shortlist",
    "ctranslate2 int8",
    "ctranslate2 int8 vmap",
    "transformers fp32",
)
REFERENCE = "transformers fp32"  # the main table's ratios' denominator
# The int8 engines side by side (the report's second table): (engine, against, what it says).
PAIRS = (
    ("ctranslate2 int8", "ours int8", ""),
    ("ours int8 shortlist", "ours int8", "the shortlist's speed-up"),
    ("ctranslate2 int8 vmap", "ctranslate2 int8", "the vocabulary map's speed-up"),
    ("ctranslate2 int8 vmap", "ours int8 shortlist", "the same candidate words"),
)
# The shortlist (export/shortlist.py's defaults, as `nmt shortlist` has them): each source
# word's best target words by Dice co-occurrence, and the most frequent target words always.
SHORTLIST_PER_SOURCE = 20
SHORTLIST_ALWAYS = 200
# What `generate` must do to decode as our engine does: every logits processor off but the
# ones the model asks for (forced_eos_token_id) and the forced first token.
GENERATE_LIKE_OURS = {
    "do_sample": False,
    "length_penalty": 1.0,
    "early_stopping": False,
    "num_return_sequences": 1,
    "bad_words_ids": None,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "min_length": 0,
    "min_new_tokens": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "renormalize_logits": False,
}
# </s>'s logit, pushed down by this much: no translation ends before its length limit.
EOS_BONUS = -40.0
ATTENTION_GAIN = 3.0  # randomize(): sharper attention, outputs that vary along the sentence

_BIG = {
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "max_position_embeddings": 1024,
    "scale_embedding": True,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
}


@dataclass(frozen=True)
class Shape:
    family: str  # "m2m100", "nllb" or "mbart50": the tokenizer and model class
    title: str  # what the report calls it
    config: dict  # the transformers config's arguments
    spm_pieces: int  # the trained SentencePiece model's size
    spm_lines: int  # lines of train.{en,fr,de} each that it is trained on


SHAPES = {
    "m2m100-418m": Shape(
        "m2m100",
        "M2M-100 418M (facebook/m2m100_418M)",
        {**_BIG, "vocab_size": 128112, "activation_function": "relu"},
        8000,
        29000,
    ),
    "nllb-600m": Shape(
        "nllb",
        "NLLB-200 distilled 600M (facebook/nllb-200-distilled-600M)",
        {**_BIG, "vocab_size": 256206, "activation_function": "relu"},
        8000,
        29000,
    ),
    "mbart50": Shape(
        "mbart50",
        "mBART-50 many-to-many (facebook/mbart-large-50-many-to-many-mmt)",
        {
            **_BIG,
            "vocab_size": 250054,
            "activation_function": "gelu",
            "decoder_start_token_id": 2,
            "forced_eos_token_id": 2,
            # What the published config.json carries and transformers ignores, and
            # CTranslate2's converter reads: fairseq's names for pre-norm and the embedding
            # LayerNorm, and the tokenizer (then its decoder starts at </s>, as ours)
            "normalize_before": True,
            "normalize_embedding": True,
            "tokenizer_class": "MBart50Tokenizer",
        },
        8000,
        29000,
    ),
}
FAMILY_NAMES = {"m2m100": "M2M-100", "nllb": "NLLB-200", "mbart50": "mBART-50"}
# Tiny shapes of each family, for the tests of this script (tests/bench/test_families.py):
# seconds, not minutes. Their vocabularies hold the trained pieces and the language tokens.
_TINY = {
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_position_embeddings": 128,
}
for _name, _shape in list(SHAPES.items()):
    _family = _shape.family
    SHAPES[f"{_family}-tiny"] = Shape(
        _family,
        f"{FAMILY_NAMES[_family]}, a tiny shape (the tests')",
        {**_shape.config, **_TINY, "vocab_size": 2108 if _family == "m2m100" else 1000},
        500,
        500,
    )
CODES = {  # our language code -> the tokenizer's
    "m2m100": {"en": "en", "fr": "fr", "de": "de"},
    "nllb": {"en": "eng_Latn", "fr": "fra_Latn", "de": "deu_Latn"},
    "mbart50": {"en": "en_XX", "fr": "fr_XX", "de": "de_DE"},
}


def multi30k() -> Path:
    from export.train_config import multi30k_dir

    return multi30k_dir()


def language_token(family: str, language: str) -> str:
    """The piece of a language's token (M2M-100's `__fr__`, NLLB's `fra_Latn`)."""
    code = CODES[family][language]
    return f"__{code}__" if family == "m2m100" else code


# ----------------------------------------------------------------------------- the models


def train_spm(shape: Shape, prefix: Path) -> Path:
    """A SentencePiece model on the first lines of train.{en,fr,de}, with SentencePiece's
    default ids (<unk> 0, <s> 1, </s> 2) as the published models have."""
    import sentencepiece as spm

    lines = []
    for language in LANGUAGES:
        with open(multi30k() / f"train.{language}", encoding="utf-8") as f:
            lines += [line.strip() for _, line in zip(range(shape.spm_lines), f, strict=False)]
    text = prefix.with_suffix(".txt")
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(prefix),
        vocab_size=shape.spm_pieces,
        model_type="unigram" if shape.family == "mbart50" else "bpe",  # as theirs
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def randomize(model, seed: int) -> None:
    """Random weights that behave enough like a trained model's to vary along a sentence
    (tests/export/hf_families.py's recipe: small embeddings, sharper attention, sub-layers
    that outweigh the residual, a gain on the last LayerNorm), with </s> pushed down by
    EOS_BONUS (in final_logits_bias, or along a direction of the last LayerNorm's bias that
    </s>'s embedding follows) so that every translation runs to its length limit."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    config = model.config
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "layer_norm" in name or "layernorm" in name:
                parameter.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            elif parameter.dim() == 2 and not ("shared" in name or "embed_tokens" in name):
                gain = ATTENTION_GAIN if ("q_proj" in name or "k_proj" in name) else 1.0
                gain = 2.0 if ("out_proj" in name or "fc2" in name) else gain
                parameter.copy_(noise * gain / parameter.shape[1] ** 0.5)
            else:  # token embeddings
                parameter.copy_(0.02 * noise)
            del noise
        decoder = model.model.decoder
        last = getattr(decoder, "layer_norm", None) or decoder.layers[-1].final_layer_norm
        last.weight.mul_(8.0)
        eos = config.eos_token_id
        bias = getattr(model, "final_logits_bias", None)
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=generator))
            bias[0, eos] = EOS_BONUS
        else:
            direction = torch.randn(config.d_model, generator=generator)
            direction /= direction.norm()
            last.bias.add_(40.0 * direction)
            model.get_output_embeddings().weight[eos].add_(EOS_BONUS / 40.0 * direction)


def _m2m100_tokenizer(shape: Shape, path: Path, work: Path) -> None:
    """M2M100Tokenizer's files: vocab.json as fairseq's dictionary makes it (the four
    specials, the pieces), filled to the published size (the vocabulary less its 100
    language tokens and 8 `madeupword`s) with pieces no text produces."""
    import sentencepiece as spm
    from transformers import M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    model_file = train_spm(shape, work / "spm")
    processor = spm.SentencePieceProcessor(model_file=str(model_file))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(3, processor.get_piece_size()):
        vocab.setdefault(processor.id_to_piece(i), len(vocab))
    languages = [f"__{code}__" for code in FAIRSEQ_LANGUAGE_CODES["m2m100"]]
    size = shape.config["vocab_size"] - len(languages) - 8
    filler = 0
    while len(vocab) < size:  # private-use characters: never in a text
        vocab[f"\U000f0000{filler:06d}"] = len(vocab)
        filler += 1
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = M2M100Tokenizer(
        str(work / "vocab.json"),
        str(model_file),
        src_lang="en",
        additional_special_tokens=languages,
    )
    tokenizer.save_pretrained(path)


def _nllb_tokenizer(shape: Shape, path: Path, work: Path) -> None:
    """NllbTokenizer's files, with the language tokens after the pieces and <mask> last in
    tokenizer.json as the published one has them (tests/export/hf_families.py)."""
    import sentencepiece as spm
    from transformers import NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    model_file = train_spm(shape, work / "spm")
    size = spm.SentencePieceProcessor(model_file=str(model_file)).get_piece_size()
    shutil.copyfile(model_file, path / "sentencepiece.bpe.model")
    NllbTokenizer.from_pretrained(path).save_pretrained(path)
    tokenizer_json = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    added = tokenizer_json["added_tokens"]
    mask = next(token for token in added if token["content"] == "<mask>")
    added = [token for token in added if token["content"] != "<mask>"]
    first = size + 1  # the fairseq offset
    added += [
        dict(mask, id=first + i, content=code, lstrip=False)
        for i, code in enumerate(FAIRSEQ_LANGUAGE_CODES)
    ]
    added.append(dict(mask, id=first + len(FAIRSEQ_LANGUAGE_CODES)))
    tokenizer_json["added_tokens"] = added
    (path / "tokenizer.json").write_text(json.dumps(tokenizer_json), encoding="utf-8")
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokenizer_config["extra_special_tokens"] = list(FAIRSEQ_LANGUAGE_CODES)
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")


def _mbart50_tokenizer(shape: Shape, path: Path, work: Path) -> None:
    from transformers import MBart50Tokenizer

    shutil.copyfile(train_spm(shape, work / "spm"), path / "sentencepiece.bpe.model")
    # <s> as the published tokenizer's files name it (transformers 5 has no default for it;
    # CTranslate2's converter needs one)
    MBart50Tokenizer.from_pretrained(path, bos_token="<s>").save_pretrained(path)


def build_hf(shape: Shape, path: Path, work: Path, seed: int = 7) -> None:
    """The family's Hugging Face directory: its tokenizer's files and a random model of the
    shape, as `save_pretrained` writes them."""
    import torch
    import transformers

    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    work.mkdir(parents=True, exist_ok=True)
    {"m2m100": _m2m100_tokenizer, "nllb": _nllb_tokenizer, "mbart50": _mbart50_tokenizer}[
        shape.family
    ](shape, path, work)
    if shape.family == "mbart50":
        config = transformers.MBartConfig(**shape.config)
        model_class = transformers.MBartForConditionalGeneration
    else:
        config = transformers.M2M100Config(**shape.config)
        model_class = transformers.M2M100ForConditionalGeneration
    torch.manual_seed(seed)
    model = model_class(config)
    randomize(model, seed)
    model.save_pretrained(path)


def family_shortlist(shape: Shape, model_dir: Path) -> Shortlist:
    """The vocabulary shortlist of an imported model (nmt_contract.Shortlist), from the first
    `spm_lines` lines of Multi30k's train.{source,target} of every direction (DIRECTIONS),
    pooled: one shortlist serves a bundle, and a source word's candidates are then the
    target words of the directions it is a source word of. Sources are tokenized as the
    model reads them (language token, </s>), targets as it writes them (the target
    language's token first, </s> last). Always candidates besides the most frequent target
    words: <s>, <pad>, </s>, <unk> (the words CTranslate2's vocabulary map always allows)
    and the three language tokens.

    `build_shortlist` counts co-occurrences in a V x V table: 131 GB at M2M-100's 128,112
    words. It is run on the ids the corpus holds (about 8,000) renumbered from 0, and its
    result numbered back."""
    import numpy as np

    from export.checkpoint import load_tokenizer
    from export.model.config import ModelConfig
    from export.shortlist import build_shortlist
    from nmt_contract import Shortlist

    vocab_size = ModelConfig.from_json(model_dir / "config.json").vocab_size
    tokenizer = load_tokenizer(model_dir)
    languages = tokenizer.languages
    sources: list[list[int]] = []
    targets: list[list[int]] = []
    for source, target in DIRECTIONS:
        lines = {}
        for language in (source, target):
            with open(multi30k() / f"train.{language}", encoding="utf-8") as f:
                lines[language] = [
                    line.strip() for _, line in zip(range(shape.spm_lines), f, strict=False)
                ]
        first = languages.forced_target(target)
        for source_text, target_text in zip(lines[source], lines[target], strict=True):
            sources.append(tokenizer.encode(source_text, source))
            targets.append([first, *tokenizer.encode_target(target_text)])
    specials = [
        tokenizer.vocab[p] for p in ("<s>", "<pad>", "</s>", "<unk>") if p in tokenizer.vocab
    ]
    specials += [languages.token_of(language) for language in LANGUAGES]
    seen = np.unique(np.concatenate([np.concatenate(sources + targets), specials]))  # ascending
    compact = np.full(vocab_size, -1, dtype=np.int64)
    compact[seen] = np.arange(len(seen))
    small = build_shortlist(
        [compact[ids] for ids in sources],
        [compact[ids] for ids in targets],
        len(seen),
        compact[specials].tolist(),
        per_source=SHORTLIST_PER_SOURCE,
        always=SHORTLIST_ALWAYS,
    )
    candidates = np.full((vocab_size, small.candidates.shape[1]), -1, dtype=np.int32)
    candidates[seen] = np.where(small.candidates >= 0, seen[small.candidates], -1)
    return Shortlist(always=seen[small.always].astype(np.int32), candidates=candidates)


def ctranslate2_pieces(family: str, hf_dir: Path) -> list[str]:
    """The family tokenizer's piece of each id: CTranslate2's converter takes its vocabulary
    from the same tokenizer, in id order (checked after the conversion: `convert_ctranslate2`)."""
    tokenizer = family_tokenizers(family, hf_dir)[LANGUAGES[0]]
    return tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))


def ctranslate2_vocabulary(ct2_dir: Path) -> list[str]:
    """A converted model's target vocabulary, by id."""
    for name in ("shared_vocabulary.json", "target_vocabulary.json"):
        if (ct2_dir / name).is_file():
            return json.loads((ct2_dir / name).read_text(encoding="utf-8"))
    raise FileNotFoundError(f"{ct2_dir} has no CTranslate2 vocabulary file")


def fill_mbart_vocabulary() -> None:
    """CTranslate2's converter takes a model's vocabulary from its tokenizer and refuses one
    smaller than the network. The published mBART-50's tokenizer knows all its 250,054 rows;
    this bench's knows the trained pieces only (the module's docstring). For M2M-100 and NLLB
    the converter itself fills the vocabulary up with `madeupword` pieces; this loader, put
    in place of its mBART one in the preparing process, does the same for mBART-50 (words
    no text produces, as this bench's filler pieces are)."""
    from ctranslate2.converters.transformers import MBartLoader, register_loader

    class FilledMBartLoader(MBartLoader):
        def get_vocabulary(self, model, tokenizer):
            tokens = super().get_vocabulary(model, tokenizer)
            missing = model.config.vocab_size - len(tokens)
            return tokens + [f"madeupword{i}" for i in range(missing)]

    register_loader("MBartConfig")(FilledMBartLoader)


def convert_ctranslate2(family: str, hf_dir: Path, out: Path, shortlist: Shortlist) -> None:
    """CTranslate2's own conversion of the Hugging Face directory, int8, with the shortlist
    as its vocabulary map (`write_ctranslate2_vmap`: the same candidate lists). The map names
    words by piece: every piece it was written with must be the converted vocabulary's at the
    same id, or CTranslate2 would allow other words than ours."""
    import numpy as np
    from ctranslate2.converters import TransformersConverter

    from export.shortlist import write_ctranslate2_vmap

    if family == "mbart50":
        fill_mbart_vocabulary()
    pieces = ctranslate2_pieces(family, hf_dir)
    vmap = out.with_name("vmap.txt")
    write_ctranslate2_vmap(shortlist, pieces, vmap)
    TransformersConverter(str(hf_dir)).convert(
        str(out), vmap=str(vmap), quantization="int8", force=True
    )
    vocabulary = ctranslate2_vocabulary(out)
    rows = np.flatnonzero((shortlist.candidates >= 0).any(axis=1))
    used = np.union1d(np.union1d(shortlist.always, shortlist.candidates.ravel()), rows)
    wrong = [int(i) for i in used[used >= 0] if vocabulary[i] != pieces[i]]
    if wrong:
        raise RuntimeError(
            f"CTranslate2's vocabulary differs from the tokenizer's at ids {wrong[:10]}: "
            "its vocabulary map would not hold our shortlist's words"
        )


def _dir_bytes(path: Path, names: list[str] | None = None) -> int:
    files = [path / n for n in names] if names is not None else list(path.rglob("*"))
    return sum(f.stat().st_size for f in files if f.is_file())


def prepare(name: str, work: Path) -> dict:
    """Build, import and export one shape (in this process): what the report says about it.
    The Hugging Face directory, our model directory and the bundle are under `work/name`."""
    import torch

    import export.onnx_export as onnx_export
    from export.hf import import_hf
    from nmt_contract import SHORTLIST_FILE
    from service.runtime.bundle import load_bundle

    torch.set_num_threads(os.cpu_count() or 1)
    shape = SHAPES[name]
    folder = work / name
    hf_dir, ours_dir, bundle_dir = folder / "hf", folder / "ours", folder / "bundle"
    ct2_dir = folder / "ct2"
    started = time.perf_counter()
    build_hf(shape, hf_dir, folder / "spm")
    built = time.perf_counter()
    gc.collect()
    import_hf(hf_dir, ours_dir)
    imported = time.perf_counter()
    gc.collect()
    shortlist = family_shortlist(shape, ours_dir)
    shortlist.save(ours_dir / SHORTLIST_FILE)  # `nmt export` takes it into the bundle
    shortlisted = time.perf_counter()
    gc.collect()
    onnx_export.export_bundle(ours_dir, bundle_dir, int8=True)
    exported = time.perf_counter()
    gc.collect()
    convert_ctranslate2(shape.family, hf_dir, ct2_dir, shortlist)
    converted = time.perf_counter()
    files = load_bundle(bundle_dir).manifest["files"]
    graphs = [f for f in files if ".onnx" in f]
    int8 = [f for f in graphs if ".int8." in f]
    # The export's share that was quantization: the same public function run again on the
    # exported fp32 graphs, timed from outside (the product is not patched to time it).
    quantizing = quantize_again(bundle_dir, [f for f in graphs if f.endswith(".onnx")], folder)
    per_source = (shortlist.candidates >= 0).sum(axis=1)
    kept = per_source > 0
    parameters = parameter_count(hf_dir / "model.safetensors")
    embedding = shape.config["vocab_size"] * shape.config["d_model"]
    copies = {f: embedding_copies(bundle_dir / f, embedding) for f in graphs if f.endswith("onnx")}
    return {
        "name": name,
        "parameters": parameters,
        "build_seconds": built - started,
        "import_seconds": imported - built,
        "shortlist_seconds": shortlisted - imported,
        "export_seconds": max(exported - shortlisted - quantizing, 0.0),
        "quantize_seconds": quantizing,
        "ctranslate2_seconds": converted - exported,
        "ctranslate2_bytes": _dir_bytes(ct2_dir),
        "shortlist": {
            "lines": shape.spm_lines,
            "always": len(shortlist.always),
            "sources": int(kept.sum()),  # source words with candidates of their own
            "per_source": float(per_source[kept].mean()) if kept.any() else 0.0,
            # what it adds to the bundle: its decoder step, the output projection, itself
            "bundle_bytes": _dir_bytes(
                bundle_dir,
                [f for f in files if "shortlist" in f or f.startswith("output_projection")],
            ),
        },
        "hf_bytes": _dir_bytes(hf_dir, ["model.safetensors"]),
        "fp32_bytes": _dir_bytes(bundle_dir, [f for f in graphs if f not in int8]),
        "int8_bytes": _dir_bytes(bundle_dir, int8),
        "bundle_bytes": _dir_bytes(bundle_dir),
        "graph_files": sorted(graphs),
        "embedding_copies": {
            "bytes": embedding * 4,
            "fp32": sum(n for f, (n, _) in copies.items() if f not in int8),
            "int8": sum(n for f, (n, _) in copies.items() if f in int8),
            "int8_float": sum(n for f, (_, n) in copies.items() if f in int8),
        },
        "peak_rss_mib": peak_rss_mib(),
    }


def embedding_copies(graph: Path, elements: int) -> tuple[int, int]:
    """How many of a graph's weights hold `elements` numbers (the V x D embedding, as a table
    or as the output projection), and how many of those are float32."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    found = [
        t.data_type
        for t in model.graph.initializer
        if len(t.dims) == 2 and t.dims[0] * t.dims[1] == elements
    ]
    return len(found), sum(kind == onnx.TensorProto.FLOAT for kind in found)


def quantize_again(bundle_dir: Path, graphs: list[str], work: Path) -> float:
    """Seconds `onnx_export.quantize_graph` takes on the bundle's fp32 graphs (written to a
    scratch folder, then removed)."""
    scratch = work / "quantize-timing"
    scratch.mkdir(parents=True, exist_ok=True)
    import export.onnx_export as onnx_export  # torch: only in the preparing process

    started = time.perf_counter()
    for name in graphs:
        if ".int8." not in name:
            onnx_export.quantize_graph(bundle_dir / name, scratch / name)
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds


def parameter_count(path: Path) -> int:
    """The numbers a safetensors file holds (its tied weights stored once)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # noqa: SIM118


def prepared(name: str, work: Path, rebuild: bool) -> dict:
    """`prepare` in a process of its own (its memory returns to the system at its end), or
    its result from an earlier run with this shape."""
    record = work / name / "prepared.json"
    stamp = (
        json.dumps(SHAPES[name].__dict__, sort_keys=True)
        + f"eos {EOS_BONUS}, gain {ATTENTION_GAIN}, "
        + f"shortlist {SHORTLIST_PER_SOURCE}/{SHORTLIST_ALWAYS}, ctranslate2, v3"
    )
    if not rebuild and record.is_file():
        found = json.loads(record.read_text())
        kept = [work / name / "bundle" / "bundle.json", work / name / "ct2" / "model.bin"]
        if found.get("stamp") == stamp and all(path.is_file() for path in kept):
            print(f"{name}: prepared in an earlier run ({record})", flush=True)
            return found
    print(
        f"{name}: building, importing, exporting (fp32, int8, shortlist) and converting "
        "for CTranslate2…",
        flush=True,
    )
    (work / name).mkdir(parents=True, exist_ok=True)
    out = work / name / "prepare-result.json"
    command = [sys.executable, "-m", "bench.families", "--prepare", name, str(work), str(out)]
    subprocess.run(command, cwd=ROOT, check=True, env=_environment())
    found = json.loads(out.read_text()) | {"stamp": stamp}
    record.write_text(json.dumps(found, indent=1))
    return found


# ----------------------------------------------------------------------------- the engines


class Ours:
    def __init__(self, job: dict) -> None:
        from service.runtime.bundle import load_bundle
        from service.runtime.sessions import EngineOptions
        from service.runtime.translator import Translator

        options = EngineOptions(
            int8=job["int8"],
            intra_op_threads=job["threads"],
            shortlist=job.get("shortlist", False),
        )
        self.translator = Translator(load_bundle(job["bundle"]), options)
        self.eos = self.translator.engine.eos_id

    def translate(self, texts, source, target, beam, limit) -> tuple[list, list]:
        """(produced tokens of each text, </s> included when it ended; source ids)."""
        from service.runtime.search import SearchOptions

        options = SearchOptions(beam_size=beam, max_length=limit)
        found = self.translator.translate(texts, options, len(texts), source, target)
        produced = []
        for translation in found:
            tokens = list(translation.hypotheses[0].tokens)
            produced.append([*tokens, self.eos] if len(tokens) < limit else tokens)
        return produced, [t.source_ids for t in found]


def family_tokenizers(family: str, path: Path | str) -> dict:
    """The family's `transformers` tokenizer of the Hugging Face directory, one per source
    language (the source language is a tokenizer's setting)."""
    import transformers

    classes = {
        "m2m100": transformers.M2M100Tokenizer,
        "nllb": transformers.NllbTokenizer,
        "mbart50": transformers.MBart50Tokenizer,
    }
    return {
        language: classes[family].from_pretrained(path, src_lang=CODES[family][language])
        for language in LANGUAGES
    }


class CTranslate2:
    """CTranslate2 as its documentation runs these families: the family tokenizer's pieces in
    (language token and </s> included), the target language's token as the target prefix,
    pieces out (the prefix first, as it returns them)."""

    def __init__(self, job: dict) -> None:
        import ctranslate2

        family = job["family"]
        self.tokenizers = family_tokenizers(family, job["hf"])
        self.known = len(self.tokenizers[LANGUAGES[0]])  # as Transformers.known
        self.prefix = {language: language_token(family, language) for language in LANGUAGES}
        self.translator = ctranslate2.Translator(
            job["ct2"],
            device="cpu",
            compute_type="int8",
            intra_threads=job["threads"],
            inter_threads=1,
        )
        self.vmap = job["vmap"]
        self.ids = {}
        for i, piece in enumerate(ctranslate2_vocabulary(Path(job["ct2"]))):
            self.ids.setdefault(piece, i)

    def translate(self, texts, source, target, beam, limit) -> tuple[list, list]:
        tokenizer = self.tokenizers[source]
        sources = tokenizer(texts)["input_ids"]
        # CTranslate2 4.8.5 fails with its vocabulary map and a target prefix together
        # (`vector::_M_range_check`, on 7 of M2M-100 418M's 48 sentences here; none fails
        # without the prefix): vmap then decodes without the forced language token, its first
        # token chosen like the others. The work is the same (checked: every translation is
        # --max-length tokens long), but such a model could not serve a multilingual pair.
        prefix = None if self.vmap else [[self.prefix[target]] for _ in texts]
        results = self.translator.translate_batch(
            [tokenizer.convert_ids_to_tokens(ids) for ids in sources],
            target_prefix=prefix,
            beam_size=beam,
            length_penalty=1.0,
            # Its length counts the prefix, as ours counts the forced token (checked by the
            # report: every translation is --max-length tokens long).
            max_decoding_length=limit,
            min_decoding_length=0,  # ours may end at once too
            return_end_token=True,  # </s> in the produced tokens, as the other engines count it
            use_vmap=self.vmap,
        )
        produced = [[self.ids[piece] for piece in r.hypotheses[0]] for r in results]
        known = [[i for i in row if i < self.known] for row in produced]
        tokenizer.batch_decode(known, skip_special_tokens=True)  # texts out, as ours
        return produced, sources


class Transformers:
    def __init__(self, job: dict) -> None:
        import torch
        import transformers

        torch.set_num_threads(job["threads"])
        self.torch = torch
        family, path = job["family"], job["hf"]
        self.tokenizers = family_tokenizers(family, path)
        any_tokenizer = self.tokenizers[LANGUAGES[0]]
        self.known = len(any_tokenizer)  # ids past it (the model's larger vocabulary): none
        self.forced = {
            language: any_tokenizer.convert_tokens_to_ids(language_token(family, language))
            for language in LANGUAGES
        }
        self.model = transformers.AutoModelForSeq2SeqLM.from_pretrained(path).eval()
        self.eos = self.model.config.eos_token_id

    def translate(self, texts, source, target, beam, limit) -> tuple[list, list]:
        torch = self.torch
        tokenizer = self.tokenizers[source]
        encoded = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.inference_mode():
            out = self.model.generate(
                **encoded,
                num_beams=beam,
                max_new_tokens=limit,
                forced_bos_token_id=self.forced[target],
                **GENERATE_LIKE_OURS,
            )
        produced = []
        for row in out[:, 1:].tolist():  # without the decoder start
            produced.append(row[: row.index(self.eos) + 1] if self.eos in row else row)
        known = [[i for i in row if i < self.known] for row in produced]
        tokenizer.batch_decode(known, skip_special_tokens=True)  # texts out, as ours
        sources = [
            [i for i, m in zip(ids, mask, strict=True) if m]
            for ids, mask in zip(
                encoded["input_ids"].tolist(), encoded["attention_mask"].tolist(), strict=True
            )
        ]
        return produced, sources


def status_mib(field: str) -> float:
    """A memory field of /proc/self/status (Linux), in MiB (0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def peak_rss_mib() -> float:
    """This process's resident-set high-water mark (VmHWM: its own since exec)."""
    return status_mib("VmHWM")


def subset(texts: list, count: int) -> list:
    """`count` of the texts, spread over them (all of them when count is larger)."""
    if count >= len(texts):
        return texts
    return [texts[i * len(texts) // count] for i in range(count)]


def stretches(job: dict, run: dict) -> list[list[tuple[int, int]]]:
    """A pass's batches, (direction, first sentence) in order over every direction (the
    run's `count` sentences of each), cut into the engines' turns: 20 sentences' batches,
    or one batch from batch 20 on (as bench.compare's `turns`)."""
    batch = run["batch"]
    batches = [
        (d, start)
        for d, direction in enumerate(job["directions"])
        for start in range(0, len(subset(direction["texts"], run["count"])), batch)
    ]
    return [batches[r.start : r.stop] for r in turns(len(batches) * batch, batch)]


def _one_stretch(engine, job: dict, run: dict, batches: list[tuple[int, int]]) -> dict:
    """The given batches once: decoding seconds (tokenization and detokenization included,
    on both sides), produced tokens and source ids per sentence."""
    seconds, produced, sources = 0.0, [], []
    beam, batch = run["beam"], run["batch"]
    for d, start in batches:
        direction = job["directions"][d]
        chunk = subset(direction["texts"], run["count"])[start : start + batch]
        begin = time.perf_counter()
        found, ids = engine.translate(
            chunk, direction["source"], direction["target"], beam, job["max_length"]
        )
        seconds += time.perf_counter() - begin
        produced += found
        sources += ids
    return {"seconds": seconds, "produced": produced, "sources": sources}


def run_turns(job: dict, commands, answer) -> dict:
    """One engine's process: load it, then one stretch per command ({"warm": i} warms run i
    on its first batch; {"run": i, "stretch": k} times stretch k of it) until
    {"finish": true}. A run's pass time: the sum of each stretch's median."""
    started = time.perf_counter()
    engine = {"ours": Ours, "ctranslate2": CTranslate2, "transformers": Transformers}[
        job["engine"]
    ](job)
    load_seconds = time.perf_counter() - started
    rss_loaded = status_mib("VmRSS")
    answer("loaded")
    timed: dict[int, dict[int, list[float]]] = {}
    last: dict[int, dict[int, dict]] = {}
    for line in commands:
        command = json.loads(line)
        if command.get("finish"):
            break
        index = command.get("run", command.get("warm"))
        run = job["runs"][index]
        if "warm" in command:
            _one_stretch(engine, job, run, stretches(job, run)[0][:1])
        else:
            k = command["stretch"]
            found = _one_stretch(engine, job, run, stretches(job, run)[k])
            timed.setdefault(index, {}).setdefault(k, []).append(found.pop("seconds"))
            last.setdefault(index, {})[k] = found
        answer("done")
    return {
        "name": job["name"],
        "load_seconds": load_seconds,
        "rss_loaded_mib": rss_loaded,
        "peak_rss_mib": peak_rss_mib(),
        "runs": [
            {**run, **_pass_of(timed.get(i, {}), last.get(i, {}))}
            for i, run in enumerate(job["runs"])
        ],
    }


def _pass_of(timed: dict[int, list[float]], found: dict[int, dict]) -> dict:
    """A run's stretches put together: "seconds" (the sum of each stretch's median; NaN if
    none was timed), and the produced tokens and source ids in order."""
    order = sorted(found)
    return {
        "seconds": sum(statistics.median(timed[k]) for k in order) if order else math.nan,
        "produced": [tokens for k in order for tokens in found[k]["produced"]],
        "sources": [ids for k in order for ids in found[k]["sources"]],
    }


def _environment() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONWARNINGS": "ignore",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
    }


def _answer(process: subprocess.Popen, name: str) -> None:
    if not process.stdout.readline():
        raise RuntimeError(f"the {name} worker stopped (exit status {process.wait()})")


def time_engines(jobs: list[dict], work: Path, repeat: int) -> dict[str, dict]:
    """Every job's engine in its own process, loaded one after the other and kept; then, run
    by run, a warm-up call each and `repeat` rounds of timed passes, the engines taking
    turns on every stretch (`stretches`), the first one rotating. Turns of whole passes
    left the machine's drift within a turn (bench.compare's two CTranslate2 settings that
    decode greedy search alike came out 1.12x apart that way: docs/performance.md)."""
    workers = {}
    try:
        for job in jobs:
            slug = job["name"].replace(" ", "-")
            job_path, result_path = work / f"job-{slug}.json", work / f"result-{slug}.json"
            job_path.write_text(json.dumps(job))
            result_path.unlink(missing_ok=True)
            command = [sys.executable, "-m", "bench.families", "--turns", str(job_path)]
            process = subprocess.Popen(
                [*command, str(result_path)],
                cwd=ROOT,
                env=_environment(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            workers[job["name"]] = (process, result_path)
            _answer(process, job["name"])
            print(f"  {job['name']}: loaded", flush=True)
        names = list(workers)
        turn = 0
        for index, run in enumerate(jobs[0]["runs"]):
            count = len(stretches(jobs[0], run))
            commands = [{"warm": index}]
            commands += [{"run": index, "stretch": k} for _ in range(repeat) for k in range(count)]
            for command in commands:
                shift = turn % len(names)  # who goes first rotates
                for name in names[shift:] + names[:shift]:
                    process = workers[name][0]
                    process.stdin.write(json.dumps(command) + "\n")
                    process.stdin.flush()
                    _answer(process, name)
                turn += 1
            print(f"  {_label(run['beam'], run['batch'])}: done", flush=True)
        results = {}
        for name, (process, result_path) in workers.items():
            process.stdin.write(json.dumps({"finish": True}) + "\n")
            process.stdin.close()
            if process.wait() != 0:
                raise RuntimeError(f"the {name} worker failed")
            results[name] = json.loads(result_path.read_text())
        return results
    finally:
        for process, _ in workers.values():
            if process.poll() is None:
                process.kill()
                process.wait()


# ----------------------------------------------------------------------------- the run


def min_source_tokens(max_length: int) -> int:
    """The fewest source tokens whose length limit is max_length (nmt_contract.length_limit:
    1.5 x the source + 10)."""
    from nmt_contract import length_limit

    return next(n for n in range(1, 10_000) if length_limit(n, max_length, 10**9) >= max_length)


def pick_sentences(bundle: Path, per_direction: int, max_length: int) -> list[dict]:
    """Per direction, the first `per_direction` lines of the split long enough that their
    length limit is max_length, sorted by length (the batches are runs of this order)."""
    from service.runtime.bundle import load_bundle
    from service.runtime.tokenizer import BundleTokenizer

    tokenizer = BundleTokenizer(load_bundle(bundle))
    shortest = min_source_tokens(max_length)
    directions = []
    for source, target in DIRECTIONS:
        lines = (multi30k() / f"{DATA_SPLIT}.{source}").read_text(encoding="utf-8").splitlines()
        picked = []
        for line in lines:
            ids = tokenizer.encode([line.strip()], source)[0]
            if len(ids) >= shortest:
                picked.append((len(ids), line.strip(), ids))
            if len(picked) == per_direction:
                break
        picked.sort(key=lambda p: p[0])
        directions.append(
            {
                "source": source,
                "target": target,
                "texts": [t for _, t, _ in picked],
                "source_tokens": [n for n, _, _ in picked],
                "source_ids": [ids for _, _, ids in picked],
            }
        )
    return directions


def searches(args: argparse.Namespace) -> list[tuple[int, int]]:
    return [(1, 1), (1, args.batch), (args.beam, 1), (args.beam, args.batch)]


def runs(args: argparse.Namespace) -> list[dict]:
    """The timed configurations: at batch 1, --sentences-batch-1 sentences per direction
    (a batch-1 token costs about what it costs whatever the sentence: fewer suffice, and
    they take most of the time), at the larger batch all of them."""
    return [
        {
            "beam": beam,
            "batch": batch,
            "count": args.sentences_batch_1 if batch == 1 else args.sentences,
        }
        for beam, batch in searches(args)
    ]


def measure(name: str, args: argparse.Namespace) -> dict:
    """One shape: prepared, then its three engines timed side by side."""
    work = args.work_dir.resolve()
    preparation = prepared(name, work, args.rebuild)
    shape = SHAPES[name]
    bundle, hf = work / name / "bundle", work / name / "hf"
    directions = pick_sentences(bundle, args.sentences, args.max_length)
    common = {
        "family": shape.family,
        "bundle": str(bundle),
        "hf": str(hf),
        "threads": args.threads,
        "max_length": args.max_length,
        "directions": directions,
        "runs": runs(args),
    }
    ct2 = str(work / name / "ct2")
    jobs = [
        {**common, "name": "ours fp32", "engine": "ours", "int8": False},
        {**common, "name": "ours int8", "engine": "ours", "int8": True},
        {
            **common,
            "name": "ours int8 shortlist",
            "engine": "ours",
            "int8": True,
            "shortlist": True,
        },
        {**common, "name": "ctranslate2 int8", "engine": "ctranslate2", "ct2": ct2, "vmap": False},
        {
            **common,
            "name": "ctranslate2 int8 vmap",
            "engine": "ctranslate2",
            "ct2": ct2,
            "vmap": True,
        },
        {**common, "name": "transformers fp32", "engine": "transformers", "int8": False},
    ]
    assert [job["name"] for job in jobs] == list(ENGINES)
    print(f"{name}: timing {', '.join(ENGINES)}, one pass each in turn", flush=True)
    results = time_engines(jobs, work / name, args.repeat)
    return {
        "name": name,
        "preparation": preparation,
        "directions": directions,
        "results": results,
        "candidates": shortlist_use(bundle, directions, results),
    }


def shortlist_use(bundle: Path, directions: list[dict], results: dict) -> dict:
    """The timed batches' candidate words (the shortlist's, the same as CTranslate2's
    vocabulary map's), batched as `stretches` cuts a pass: their mean count per batch size, and
    per restricted engine the words it wrote outside its batch's candidates (none, when the
    shortlist and the vocabulary map are applied as built)."""
    from nmt_contract import Shortlist
    from service.runtime.bundle import load_bundle

    shortlist = Shortlist.load(load_bundle(bundle).shortlist_files()[0])
    restricted = ("ours int8 shortlist", "ctranslate2 int8 vmap")
    counts: dict[int, list[int]] = {}
    outside = dict.fromkeys(restricted, 0)
    written = 0  # tokens each restricted engine wrote (the same for both: the same work)
    for index, run in enumerate(results[REFERENCE]["runs"]):
        produced = {name: iter(results[name]["runs"][index]["produced"]) for name in restricted}
        for direction in directions:
            ids = subset(direction["source_ids"], run["count"])
            for start in range(0, len(ids), run["batch"]):
                batch = ids[start : start + run["batch"]]
                allowed = set(shortlist.vocabulary_for([i for row in batch for i in row]).tolist())
                counts.setdefault(run["batch"], []).append(len(allowed))
                for name in restricted:
                    for _ in batch:
                        tokens = next(produced[name])
                        outside[name] += sum(t not in allowed for t in tokens)
        written += sum(len(p) for p in results[restricted[0]]["runs"][index]["produced"])
    return {
        "counts": {batch: statistics.mean(found) for batch, found in counts.items()},
        "outside": outside,
        "written": written,
    }


# ----------------------------------------------------------------------------- the report


def _label(beam: int, batch: int) -> str:
    return f"{'greedy' if beam == 1 else f'beam {beam}'}, batch {batch}"


def cells(measured: dict) -> dict[str, dict[tuple[int, int], dict]]:
    """Per engine and (beam, batch): tokens/s (a pass: the sum of its stretches' medians), its
    ratio to the reference, and how its outputs compare with the reference's, sentence by
    sentence."""
    results = measured["results"]
    reference = {(r["beam"], r["batch"]): r for r in results[REFERENCE]["runs"]}
    table: dict[str, dict[tuple[int, int], dict]] = {}
    for name in ENGINES:
        table[name] = {}
        for run in results[name]["runs"]:
            key = (run["beam"], run["batch"])
            base = reference[key]
            tokens = sum(len(p) for p in run["produced"])
            base_tokens = sum(len(p) for p in base["produced"])
            tps = tokens / run["seconds"]
            pairs = list(zip(run["produced"], base["produced"], strict=True))
            table[name][key] = {
                "tps": tps,
                "ratio": tps / (base_tokens / base["seconds"]),
                "tokens": tokens,
                "translations": len(pairs),
                "lengths": sorted({len(p) for p in run["produced"]}),
                "same_count": sum(len(a) == len(b) for a, b in pairs),
                "same_tokens": sum(a == b for a, b in pairs),
                "same_sources": run["sources"] == base["sources"],
            }
    return table


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("onnxruntime", "ctranslate2", "transformers", "torch"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} absent")
    return ", ".join(found)


def _mib(size: float) -> str:
    return f"{size / 2**20:,.0f}"


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f}" if seconds < 10 else f"{seconds:.0f}"


def _parameters(count: int) -> str:
    return f"{count / 1e6:,.0f}M" if count >= 10e6 else f"{count / 1e6:.2f}M"


def same_work(table: dict, max_length: int) -> str:
    """Whether every engine produced max_length tokens for every sentence, and its
    translations' agreement with the reference's."""
    lengths = sorted(
        {n for row in table.values() for cell in row.values() for n in cell["lengths"]}
    )
    counted = all(c["same_count"] == c["translations"] for r in table.values() for c in r.values())
    translations = sum(c["translations"] for c in table[REFERENCE].values())
    if lengths == [max_length] and counted:
        verdict = f"yes: every translation, of every engine, is {max_length} tokens long"
    else:
        verdict = f"**no**: translation lengths {lengths} (token counts differ between engines)"
    agreement = []
    for name in ENGINES:
        if name == REFERENCE:
            continue
        same = sum(c["same_tokens"] for c in table[name].values())
        agreement.append(f"{name} {same}/{translations}")
    ids = all(c["same_sources"] for row in table.values() for c in row.values())
    return (
        f"Same work on every engine: {verdict}. Translations token for token equal to "
        f"transformers' (all configurations): {', '.join(agreement)} (int8 differs by "
        "quantization, and a random model has many near ties; the shortlist and the "
        "vocabulary map leave most words out). Source ids: "
        f"{'equal' if ids else '**not equal**'} to the family tokenizer's."
    )


def pairs_markdown(table: dict, keys: list[tuple[int, int]]) -> list[str]:
    """The int8 engines against each other: tokens/s of one over the other's, per
    configuration."""
    lines = [
        "| tokens/s ratio | " + " | ".join(_label(*k) for k in keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for name, against, meaning in PAIRS:
        ratios = [table[name][k]["tps"] / table[against][k]["tps"] for k in keys]
        label = f"{name} / {against}" + (f" ({meaning})" if meaning else "")
        lines.append(f"| {label} | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |")
    return lines


def shortlist_markdown(measured: dict, vocab_size: int) -> str:
    """How the shortlist was made, and how many words it leaves a batch."""
    made = measured["preparation"]["shortlist"]
    use = measured["candidates"]
    directions = ", ".join(f"{s}->{t}" for s, t in DIRECTIONS)
    per_batch = "; ".join(
        f"batch {batch}: {count:,.0f} ({count / vocab_size:.1%})"
        for batch, count in sorted(use["counts"].items())
    )
    outside = ", ".join(f"{name} {count}" for name, count in use["outside"].items())
    return (
        "The shortlist (ours) and the vocabulary map (CTranslate2's) are the same candidate "
        "lists: `export/shortlist.py`'s `build_shortlist` on the first "
        f"{made['lines']:,} lines of Multi30k's `train` of each direction ({directions}, "
        "pooled: one shortlist per bundle), sources tokenized as the model reads them and "
        "targets as it writes them (target language token first); each source word's "
        f"{SHORTLIST_PER_SOURCE} best target words by Dice co-occurrence "
        f"({made['sources']:,} source words have some, {made['per_source']:.1f} on average), "
        f"and {made['always']:,} words always (the {SHORTLIST_ALWAYS} most frequent target "
        "words, <s>, <pad>, </s>, <unk>, the three language tokens); written as "
        "CTranslate2's vocabulary map by `write_ctranslate2_vmap`, converted in, and its "
        "pieces checked against the converted vocabulary. Candidate words per timed batch, "
        f"mean, of {vocab_size:,}: {per_batch}. Words written outside their batch's "
        f"candidates, of {use['written']:,} each: {outside}. With random weights the "
        "candidates are co-occurrence lists of real text, not of this model: the speed is a "
        "real shortlist's, the translations are not."
    )


def family_markdown(measured: dict, args: argparse.Namespace) -> str:
    shape = SHAPES[measured["name"]]
    preparation = measured["preparation"]
    config = shape.config
    table = cells(measured)
    keys = searches(args)
    results = measured["results"]
    sentences = sum(len(d["texts"]) for d in measured["directions"])
    mean_source = sum(n for d in measured["directions"] for n in d["source_tokens"]) / sentences
    embedding = preparation["embedding_copies"]
    lines = [
        f"### {shape.title}",
        "",
        f"`{measured['name']}`: d_model {config['d_model']}, {config['encoder_layers']}+"
        f"{config['decoder_layers']} layers, {config['encoder_attention_heads']} heads, "
        f"feed-forward {config['encoder_ffn_dim']}, vocabulary {config['vocab_size']:,}; "
        f"{_parameters(preparation['parameters'])} parameters; {sentences} sentences, mean "
        f"{mean_source:.1f} source tokens.",
        "",
        "| engine | "
        + " | ".join(_label(*k) for k in keys)
        + " | peak RSS (MiB) | RSS loaded (MiB) | load (s) |",
        "|---|" + "---:|" * (len(keys) + 3),
    ]
    for name in ENGINES:
        row = [f"{table[name][k]['tps']:,.1f} ({table[name][k]['ratio']:.2f}x)" for k in keys]
        result = results[name]
        row += [
            f"{result['peak_rss_mib']:,.0f}",
            f"{result['rss_loaded_mib']:,.0f}",
            f"{result['load_seconds']:.1f}",
        ]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += [
        "",
        *pairs_markdown(table, keys),
        "",
        same_work(table, args.max_length),
        "",
        shortlist_markdown(measured, config["vocab_size"]),
        "",
        f"Preparation ({os.cpu_count()} cores): `nmt import-hf` "
        f"{_seconds(preparation['import_seconds'])} s, the shortlist "
        f"{_seconds(preparation['shortlist_seconds'])} s, export of the fp32 graphs "
        f"{_seconds(preparation['export_seconds'])} s, their int8 quantization "
        f"{_seconds(preparation['quantize_seconds'])} s, CTranslate2's conversion (int8, "
        f"the vocabulary map in) {_seconds(preparation['ctranslate2_seconds'])} s; peak RSS "
        f"{preparation['peak_rss_mib']:,.0f} MiB (the random model's making included). "
        f"On disk: the Hugging Face model.safetensors {_mib(preparation['hf_bytes'])} MiB; "
        f"the CTranslate2 model {_mib(preparation['ctranslate2_bytes'])} MiB; "
        f"the bundle {_mib(preparation['bundle_bytes'])} MiB, of which the fp32 graphs "
        f"{_mib(preparation['fp32_bytes'])} MiB and the int8 graphs "
        f"{_mib(preparation['int8_bytes'])} MiB (the shortlist's decoder steps, its output "
        f"projections, fp32 and int8, and its lists: "
        f"{_mib(preparation['shortlist']['bundle_bytes'])} MiB of the bundle). "
        f"The {config['vocab_size']:,} x "
        f"{config['d_model']} embedding ({_mib(embedding['bytes'])} MiB in fp32) is in the "
        f"fp32 graphs {embedding['fp32']} times and in the int8 graphs {embedding['int8']} "
        f"times ({embedding['int8_float']} of them fp32). RSS counts the pages a process has "
        "touched: memory-mapped weights (safetensors, for one) count once read, so RSS "
        "after loading can be far below the weights' size.",
    ]
    return "\n".join(lines)


def markdown(measured: list[dict], args: argparse.Namespace, load: tuple) -> str:
    threads = f"{args.threads} thread{'s' if args.threads != 1 else ''}"
    shapes = ", ".join(m["name"] for m in measured)
    lines = opening(
        f"Real shapes, random weights ({shapes}): ours vs CTranslate2 and transformers, "
        f"{threads} per engine",
        "bench.families",
        f", load average before the run {' / '.join(f'{x:.2f}' for x in load)}; {_versions()}",
    )
    directions = ", ".join(f"{s}->{t}" for s, t in DIRECTIONS)
    lines += [
        "- models: a `transformers` config of each published shape, random weights, a "
        "SentencePiece model trained on Multi30k; imported with `nmt import-hf`, exported "
        "with int8 (`export_bundle`); the same weights for every engine",
        f"- sentences: {args.sentences} per direction ({directions}; the first lines of "
        f"Multi30k's `{DATA_SPLIT}` long enough for a length limit of {args.max_length} tokens), "
        f"{args.sentences_batch_1} per direction (spread over them) at batch 1; the target "
        "language's token forced first",
        f"- the same work: the random weights never make </s> win, so every translation runs "
        f"to its limit, {args.max_length} tokens (the forced first one included) on every "
        "engine (checked below); the outputs are otherwise degenerate",
        "- engines, each in its own process, loaded at once, taking turns (one pass each, "
        "round after round): ours (`Translator.translate`: the fp32 or the int8 graphs of one "
        f"bundle, `EngineOptions(intra_op_threads={args.threads})`, with `shortlist=True` "
        "for the shortlist), CTranslate2 int8 (`ctranslate2.converters.TransformersConverter` "
        'on the same Hugging Face directory, `quantization="int8"`; `Translator(compute_type='
        f'"int8", intra_threads={args.threads}, inter_threads=1)`, `translate_batch` with '
        "the family tokenizer's pieces, the target language's token as `target_prefix`, "
        "`max_decoding_length` the same limit; for vmap `use_vmap=True` and no target prefix: "
        "CTranslate2 4.8.5 fails with both (`vector::_M_range_check`, on 7 of M2M-100 418M's "
        "48 sentences; none without the prefix), so a vocabulary map cannot serve a forced "
        "target language there) and transformers "
        "fp32 (the family's tokenizer, `generate` with `forced_bos_token_id`, "
        f"`torch.set_num_threads({args.threads})`)",
        "- tokens/s: produced tokens / seconds of a pass (texts in, texts out: tokenization "
        f"and detokenization included on every engine), {args.repeat} passes after a warm-up "
        "call, the engines taking turns on every 20 sentences (one batch from batch 20 on), "
        "a pass's time the sum of each stretch's median; in brackets, the ratio to "
        "transformers fp32 (the int8 engines against each other: the second table). A "
        "direction's sentences are sorted by length and cut into batches",
        "- peak RSS: the engine's process's high-water mark (`VmHWM`) over loading and every "
        "configuration (interpreter and libraries included: transformers brings torch)",
        "",
    ]
    for measured_family in measured:
        lines += [family_markdown(measured_family, args), ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--families",
        default="m2m100-418m",
        help=f"comma-separated shapes among {list(SHAPES)}",
    )
    parser.add_argument("--sentences", type=int, default=16, help="per direction")
    parser.add_argument(
        "--sentences-batch-1",
        type=int,
        default=2,
        help="per direction at batch 1 (spread over --sentences)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per configuration")
    parser.add_argument("--max-length", type=int, default=32, help="tokens per translation")
    parser.add_argument("--batch", type=int, default=16, help="the larger batch size")
    parser.add_argument("--beam", type=int, default=4, help="the beam search's width")
    parser.add_argument("--threads", type=int, default=1, help="per engine")
    parser.add_argument("--work-dir", type=Path, default=Path("build/families"))
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--section", default="families")
    parser.add_argument(
        "--rebuild", action="store_true", help="build and export again what an earlier run kept"
    )


def run_from_args(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.families.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SHAPES))
    if unknown:
        raise SystemExit(f"unknown shapes {unknown}; choose among {list(SHAPES)}")
    if not (multi30k() / f"{DATA_SPLIT}.en").is_file():
        raise SystemExit(f"Multi30k not found at {multi30k()} (set NMT_DATA_DIR)")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if not 1 <= args.sentences_batch_1 <= args.sentences or args.batch > args.sentences:
        raise SystemExit("--batch and --sentences-batch-1 must not pass --sentences")
    load = os.getloadavg()
    started = time.perf_counter()
    measured = [measure(name, args) for name in names]
    text = markdown(measured, args, load)
    replace_section(args.section, text, args.out)
    summary = {
        m["name"]: {
            name: {_label(*k): round(c["tps"], 1) for k, c in row.items()}
            for name, row in cells(m).items()
        }
        for m in measured
    }
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--prepare"]:  # one shape's preparation, started by `prepared`
        name, work, out = argv[1], Path(argv[2]), Path(argv[3])
        out.write_text(json.dumps(prepare(name, work)))
        return 0
    if argv[:1] == ["--turns"]:  # one engine's process, driven by `time_engines`
        job_path, result_path = Path(argv[1]), Path(argv[2])
        # Answers go to the parent over the original stdout; anything an engine prints goes
        # to stderr instead, so that it cannot garble them.
        answers = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

        def answer(word: str) -> None:
            answers.write(word + "\n")
            answers.flush()

        result = run_turns(json.loads(job_path.read_text()), sys.stdin, answer)
        result_path.write_text(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.families",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
