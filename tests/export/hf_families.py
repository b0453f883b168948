"""Hugging Face models of each family `nmt import-hf` reads, built here: random weights in an
unusual shape (3 encoder and 2 decoder layers, d_model 64, 4 heads, a feed-forward width of
88), from a `transformers` config, with a SentencePiece model trained here on the first lines
of Multi30k's English, French and German (skipped when the data is absent), and the tokenizer
files its family's tokenizer reads, laid out as the published checkpoints lay them out.

No hub access. Each directory is built once per test session (`family_dir`), for the export
tests and the runtime's parity tests alike.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from export.train_config import multi30k_dir

LANGUAGES = ("en", "fr", "de")  # Multi30k's
# Three directions each multilingual bundle is held to (every language a source and a target).
DIRECTIONS = (("en", "fr"), ("fr", "de"), ("de", "en"))
LINES_PER_LANGUAGE = 1000  # of train.{en,fr,de}: the SentencePiece models' corpus
SHAPE = {
    "d_model": 64,
    "encoder_layers": 3,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 88,
    "decoder_ffn_dim": 88,
    "max_position_embeddings": 96,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
}
FAMILIES = ("m2m100", "nllb", "nllb-legacy", "mbart50", "marian-separate")
# randomize()'s gains, tried for each family's model until outputs ended at varied lengths
PRE_NORM_GAINS = {"attention_gain": 3.0, "eos_bonus": 7.0}
NLLB_GAINS = {"attention_gain": 3.0, "eos_bonus": 4.5}
MARIAN_GAINS = {"eos_bonus": 6.0}

# What `generate` must do to decode as our engine does: every logits processor off but the
# ones the model asks for (forced_eos_token_id in its generation config) and the forced first
# token the caller names.
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


@dataclass(frozen=True)
class HFModel:
    family: str
    path: Path
    codes: dict[str, str]  # our language code -> the tokenizer's ("fr" -> "fra_Latn")

    def tokenizer(self, source_lang: str | None = None, target_lang: str | None = None):
        """The family's own transformers tokenizer, for a pair (our codes) when multilingual."""
        import transformers

        cls = {
            "m2m100": transformers.M2M100Tokenizer,
            "nllb": transformers.NllbTokenizer,
            "nllb-legacy": transformers.NllbTokenizer,
            "mbart50": transformers.MBart50Tokenizer,
            "marian-separate": transformers.MarianTokenizer,
        }[self.family]
        extra = {}
        if self.family != "marian-separate":
            for key, language in (("src_lang", source_lang), ("tgt_lang", target_lang)):
                if language is not None:
                    extra[key] = self.codes[language]
        return cls.from_pretrained(self.path, **extra)

    def language_token(self, language: str) -> str:
        """The piece of a language's token (M2M-100's `__fr__`, NLLB's `fra_Latn`)."""
        code = self.codes[language]
        return f"__{code}__" if self.family == "m2m100" else code

    def forced_bos(self, language: str) -> int:
        """The id `generate` is given as forced_bos_token_id for a translation into it."""
        return self.tokenizer().convert_tokens_to_ids(self.language_token(language))

    def model(self):
        from transformers import AutoModelForSeq2SeqLM

        return AutoModelForSeq2SeqLM.from_pretrained(self.path).eval()


def corpus_lines(language: str, count: int = LINES_PER_LANGUAGE, start: int = 0) -> list[str]:
    path = multi30k_dir() / f"train.{language}"
    if not path.is_file():
        pytest.skip(f"Multi30k not found at {multi30k_dir()} (set NMT_DATA_DIR to its folder)")
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for _, line in zip(range(start + count), f, strict=False)]
    return lines[start:]


def sentences(language: str, count: int, seed: int) -> list[str]:
    """Lines of Multi30k's validation set (not in the SentencePiece corpus)."""
    path = multi30k_dir() / f"val.{language}"
    if not path.is_file():
        pytest.skip(f"Multi30k not found at {multi30k_dir()} (set NMT_DATA_DIR to its folder)")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [lines[(seed * 97 + i * 13) % len(lines)].strip() for i in range(count)]


def train_spm(lines: list[str], prefix: Path, vocab_size: int, model_type: str) -> Path:
    """SentencePiece's default ids (<unk> 0, <s> 1, </s> 2), as the published models have."""
    text = prefix.with_suffix(".txt")
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def randomize(model, seed: int, attention_gain: float = 2.5, eos_bonus: float = 4.0) -> None:
    """Random weights that behave enough like a trained model's for the comparison to bite.

    A plain random model repeats one token forever: its decoder state hardly changes from step
    to step. So: small embeddings (std 0.02, the positions then drive the decoder input),
    sharper attention (query/key projections x attention_gain), sub-layers that outweigh the
    residual (out_proj/fc2 x2), and a larger gain (x8) on the LayerNorm before the output
    projection (no near ties). Not more: sharper models amplify float rounding beyond 1e-4
    between any two fp32 implementations. </s> is favoured by eos_bonus (in final_logits_bias,
    or, in a model without one, along a direction of the last LayerNorm's bias that </s>'s
    embedding follows), so that some outputs end by themselves. Pre-norm models stay more
    degenerate than post-norm ones (runs of a few tokens), whatever the gains: the outputs are
    compared token for token all the same.
    """
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
                gain = attention_gain if ("q_proj" in name or "k_proj" in name) else 1.0
                gain = 2.0 if ("out_proj" in name or "fc2" in name) else gain
                parameter.copy_(noise * gain / parameter.shape[1] ** 0.5)
            else:  # token embeddings
                parameter.copy_(0.02 * noise)
        decoder = model.model.decoder
        last = getattr(decoder, "layer_norm", None) or decoder.layers[-1].final_layer_norm
        last.weight.mul_(8.0)
        eos = config.eos_token_id
        bias = getattr(model, "final_logits_bias", None)
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=generator))
            bias[0, eos] = eos_bonus
        else:
            direction = torch.randn(config.d_model, generator=generator)
            direction /= direction.norm()
            last.bias.add_(40.0 * direction)
            model.get_output_embeddings().weight[eos].add_(eos_bonus / 40.0 * direction)


def _save_model(model, path: Path, seed: int, **gains: float) -> None:
    torch.manual_seed(seed)
    randomize(model, seed, **gains)
    model.save_pretrained(path)


def _m2m100(path: Path, work: Path) -> dict[str, str]:
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    lines = [line for lang in LANGUAGES for line in corpus_lines(lang)]
    model_file = train_spm(lines, work / "spm", 1000, "bpe")
    processor = spm.SentencePieceProcessor(model_file=str(model_file))
    # vocab.json as fairseq's dictionary makes it: the four specials, then the pieces; three
    # pieces left out, which both tokenizers must read as <unk>.
    pieces = [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
    dropped = set(pieces[200:203])
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab |= {p: 4 + i for i, p in enumerate(p for p in pieces if p not in dropped)}
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    # The published tokenizer_config.json lists the language tokens as special tokens (which
    # decoding leaves out); transformers 5.23 does not add them by itself.
    languages = [f"__{code}__" for code in FAIRSEQ_LANGUAGE_CODES["m2m100"]]
    tokenizer = M2M100Tokenizer(
        str(work / "vocab.json"),
        str(model_file),
        src_lang="en",
        additional_special_tokens=languages,
    )
    tokenizer.save_pretrained(path)
    config = M2M100Config(vocab_size=len(vocab) + 100 + 8, **SHAPE)  # + languages, madeup
    _save_model(M2M100ForConditionalGeneration(config), path, seed=7, **PRE_NORM_GAINS)
    return {lang: lang for lang in LANGUAGES}


def _nllb(path: Path, work: Path) -> dict[str, str]:
    """Transformers makes NllbTokenizer's tokenizer.json from the SentencePiece model; the
    published one also holds the language tokens after the pieces and <mask> last, which
    this adds the way it has them."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    lines = [line for lang in LANGUAGES for line in corpus_lines(lang)]
    model_file = train_spm(lines, work / "spm", 1000, "bpe")  # NLLB's is a BPE model
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
    vocab_size = first + len(FAIRSEQ_LANGUAGE_CODES) + 1
    config = M2M100Config(vocab_size=vocab_size, **SHAPE)
    _save_model(M2M100ForConditionalGeneration(config), path, seed=8, **NLLB_GAINS)
    return {"en": "eng_Latn", "fr": "fra_Latn", "de": "deu_Latn"}


def _nllb_legacy(path: Path, work: Path) -> dict[str, str]:
    """The same model, its tokenizer in legacy_behaviour (the source language last)."""
    nllb = family_dir("nllb", work.parent)
    shutil.copytree(nllb.path, path, dirs_exist_ok=True)
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokenizer_config["legacy_behaviour"] = True
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    return nllb.codes


def _mbart50(path: Path, work: Path) -> dict[str, str]:
    from transformers import MBart50Tokenizer, MBartConfig, MBartForConditionalGeneration

    lines = [line for lang in LANGUAGES for line in corpus_lines(lang)]
    model_file = train_spm(lines, work / "spm", 1000, "unigram")  # mBART's is a unigram model
    shutil.copyfile(model_file, path / "sentencepiece.bpe.model")
    tokenizer = MBart50Tokenizer.from_pretrained(path)
    tokenizer.save_pretrained(path)
    config = MBartConfig(
        vocab_size=len(tokenizer),
        scale_embedding=True,  # as mbart-large-50-many-to-many-mmt
        decoder_start_token_id=2,
        forced_eos_token_id=2,
        **SHAPE,
    )
    _save_model(MBartForConditionalGeneration(config), path, seed=9)
    return {"en": "en_XX", "fr": "fr_XX", "de": "de_DE"}


def _marian_separate(path: Path, work: Path) -> dict[str, str]:
    """opus-mt tc-big's layout: a vocabulary per side (French source, English target), each
    </s> 0, <unk> 1, ..., <pad> last; the source's the larger, so that the pad id (the
    target's) is a source id too, as MarianMTModel's embeddings need."""
    from transformers import MarianConfig, MarianMTModel

    vocabularies = {}
    for side, lang, size in (("source", "fr", 900), ("target", "en", 700)):
        model_file = train_spm(corpus_lines(lang, 3000), work / side, size, "unigram")
        shutil.copyfile(model_file, path / f"{side}.spm")
        processor = spm.SentencePieceProcessor(model_file=str(model_file))
        vocab = {"</s>": 0, "<unk>": 1}
        for i in range(3, processor.get_piece_size()):
            vocab[processor.id_to_piece(i)] = len(vocab)
        vocab["<pad>"] = len(vocab)
        vocabularies[side] = vocab
    source, target = vocabularies["source"], vocabularies["target"]
    (path / "vocab.json").write_text(json.dumps(source, ensure_ascii=False), encoding="utf-8")
    (path / "target_vocab.json").write_text(json.dumps(target, ensure_ascii=False), "utf-8")
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": "fr",
        "target_lang": "en",
        "separate_vocabs": True,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    config = MarianConfig(
        vocab_size=len(source),
        decoder_vocab_size=len(target),
        share_encoder_decoder_embeddings=False,
        pad_token_id=target["<pad>"],
        eos_token_id=0,
        decoder_start_token_id=target["<pad>"],
        forced_eos_token_id=0,  # as every opus-mt model
        activation_function="swish",
        scale_embedding=True,
        **SHAPE,
    )
    _save_model(MarianMTModel(config), path, seed=10, **MARIAN_GAINS)
    return {"fr": "fr", "en": "en"}


@functools.cache
def family_dir(family: str, root: Path) -> HFModel:
    """The family's Hugging Face directory under `root` (built at the first call)."""
    pytest.importorskip("transformers", reason="needs the bench extra")
    path, work = root / f"hf-{family}", root / f"work-{family}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    work.mkdir(parents=True, exist_ok=True)
    builders = {
        "m2m100": _m2m100,
        "nllb": _nllb,
        "nllb-legacy": _nllb_legacy,
        "mbart50": _mbart50,
        "marian-separate": _marian_separate,
    }
    codes = builders[family](path, work)
    return HFModel(family, path, codes)


@functools.cache
def imported_dir(family: str, root: Path) -> Path:
    """The family's model imported by `nmt import-hf` into our model directory."""
    from export.hf import import_hf

    out = root / f"ours-{family}"
    import_hf(family_dir(family, root).path, out)
    return out


@functools.cache
def bundle_dir(family: str, root: Path) -> Path:
    """The imported model exported to a bundle, with its int8 graphs."""
    from export.onnx_export import export_bundle

    out = root / f"bundle-{family}"
    export_bundle(imported_dir(family, root), out, int8=True)
    return out


def hf_generate(model, ids: list[int], beam: int, limit: int, forced_bos: int | None):
    """`generate` of one source as our engine decodes it, `limit` tokens at most (the forced
    first token and </s> included)."""
    with torch.no_grad():
        return model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
            num_beams=beam,
            max_new_tokens=limit,
            forced_bos_token_id=forced_bos,
            output_scores=True,
            return_dict_in_generate=True,
            **GENERATE_LIKE_OURS,
        )
