"""What the offline side (`export/`, torch) and the runtime (`service/runtime/`, no torch) must
agree on, written once and imported by both. They meet only at the bundle on disk; this module
is that meeting point's specification: its format number, the names of the per-layer tensors,
the checksum, how long a translation may get, what a search returns, how a language code
token is read, and how a multilingual bundle names its languages (Languages, and the codes of
code_of_language_and_script). Torch-free and ONNX-free, so either side can import it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# The layout of bundle.json and of the graphs' inputs and outputs. Bump it on any change that
# an older runtime would misread; the runtime refuses other formats with "re-export".
# 2: decoder graphs select the top-k in the graph
# 3: caches per layer; cross keys/values per source, shared by the beams of a sentence;
#    only the top-k log-probs come out (no [B, V] output)
# 4: the decoder step takes past_mask [rows, P] and positions [rows] (rows of a running batch
#    joined at different steps) and also returns every layer's cross-attention, attention_i
# 5: one decoder step, "decoder", over self-attention caches written in place: buffers
#    [rows, H, capacity, Dh] as past_* (the runtime binds the same memory as present_*), each
#    row's cache the first `positions` of its slot; no past_mask. No no-cache decoder. The
#    shortlist's step ("decoder_shortlist") is the same step over candidate words.
# 6: the decoder step also takes forced_ids [rows, F] and returns their log-probs,
#    forced_log_probs [rows, F] (terms a constrained search must write)
BUNDLE_FORMAT = 6


def attention_output_names(layers: int) -> list[str]:
    """The decoder step's outputs of each layer's cross-attention weights [rows, H, S]."""
    return [f"attention_{layer}" for layer in range(layers)]


def layer_names(kind: str, layers: int) -> list[str]:
    """The graphs' names for one kind ("cross", "past", "present") of per-layer keys/values,
    layer by layer: [f"{kind}_keys_0", f"{kind}_values_0", f"{kind}_keys_1", ...]"""
    return [f"{kind}_{part}_{i}" for i in range(layers) for part in ("keys", "values")]


def sha256_of(path: Path) -> str:
    """The checksum bundle.json records for each of its files."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def length_limit(source_length: int, max_length: int, max_positions: int) -> int:
    """Most tokens a sentence may produce, </s> included: 1.5x its source plus 10, within the
    caller's max_length and the model's positions (one is taken by the start token)."""
    return max(1, min(max_length, max_positions - 1, int(1.5 * source_length) + 10))


@dataclass
class Hypothesis:
    """One finished translation of one sentence, as token ids; both searches return these."""

    tokens: list[int]  # without the final </s>
    score: float  # log_prob / length ** length_penalty: what hypotheses are ranked by
    log_prob: float  # sum of token log-probs, </s> included when the sentence ended
    # [produced tokens, source tokens] cross-attention weights (numpy), when asked for: one
    # decoder layer's (the last unless asked otherwise), averaged over its heads
    alignment: Any = None
    # [produced tokens, heads, source tokens]: the same layer's weights head by head, when
    # asked for
    head_alignment: Any = None
    # [produced tokens, 3] (numpy), when asked for (SearchOptions.confidence): per produced
    # token, </s> included, how sure the decoder was when it wrote it (TOKEN_CONFIDENCE
    # columns: its log-prob, the entropy of that step's distribution, its margin over the
    # runner-up); NaN where the token was not among the step's best (a forced token).
    token_confidence: Any = None


# The columns of Hypothesis.token_confidence.
TOKEN_CONFIDENCE = ("log_prob", "entropy", "margin")


def split_language_code(text: str) -> tuple[list[str], str]:
    """A leading `>>xx<<` (multilingual Marian models name the target language so) is one
    piece of its own, never cut by SentencePiece: ([">>xx<<"] or [], the rest)."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return [text[: end + 2]], text[end + 2 :]
    return [], text


class UnknownLanguage(ValueError):
    """A language the bundle does not translate from or to (the message lists those it does)."""


# Where a multilingual model wants the source language's token (Languages.source_token).
SOURCE_TOKEN_PLACES = ("prefix", "suffix")
# How it is told the target language (Languages.target_token): its token is the first one
# written, forced (Hugging Face's forced_bos_token_id).
TARGET_TOKEN_WAYS = ("forced",)


@dataclass(frozen=True)
class Languages:
    """A multilingual bundle's languages (M2M-100, NLLB, mBART-50), and how a sentence names
    them: each language has a token of the vocabulary, the same on both sides. bundle.json's
    "languages" section; a bilingual bundle has none.

    * The source: its language's token goes before the sentence's pieces ("prefix":
      [lang, pieces..., </s>]: M2M-100, mBART-50, NLLB) or after their </s> ("suffix":
      [pieces..., </s>, lang]: NLLB's legacy placement, `legacy_behaviour`).
    * The target ("forced"): decoding starts from decoder_start as for any bundle, and the
      first token written is the target language's, forced with log-prob 0 (as Hugging Face's
      forced_bos_token_id). It counts as a produced token (for the length limit and the
      length penalty) and is no part of the text.

    Every language is both a source and a target: the bundle translates every ordered pair of
    two different ones.
    """

    tokens: dict[str, int]  # our language code ("fr", "zh-Hant") -> the id of its token
    model_codes: dict[str, str]  # our language code -> the model's own ("fra_Latn", "__fr__")
    source_token: str = "prefix"
    target_token: str = "forced"

    def __post_init__(self) -> None:
        if self.source_token not in SOURCE_TOKEN_PLACES:
            raise ValueError(f"source_token must be one of {SOURCE_TOKEN_PLACES}")
        if self.target_token not in TARGET_TOKEN_WAYS:
            raise ValueError(f"target_token must be one of {TARGET_TOKEN_WAYS}")

    @property
    def codes(self) -> list[str]:
        """Our codes of the languages, in the model's order."""
        return list(self.tokens)

    @property
    def token_ids(self) -> frozenset[int]:
        """Every language token: ids that are never text."""
        return frozenset(self.tokens.values())

    def token_of(self, language: str) -> int:
        if language not in self.tokens:
            raise UnknownLanguage(
                f"no language {language!r} in this model; it has {', '.join(self.tokens)}"
            )
        return self.tokens[language]

    def source_ids(self, ids: list[int], language: str) -> list[int]:
        """A source sentence's ids (its pieces' ids and </s>) -> the ids the encoder reads,
        with the language's token where the model wants it."""
        token = self.token_of(language)
        return [token, *ids] if self.source_token == "prefix" else [*ids, token]

    def forced_target(self, language: str) -> int:
        """The first token a translation into `language` must write (log-prob 0)."""
        return self.token_of(language)

    def to_manifest(self) -> dict:
        return {
            "source_token": self.source_token,
            "target_token": self.target_token,
            "tokens": {
                code: {"code": self.model_codes[code], "id": token}
                for code, token in self.tokens.items()
            },
        }

    @classmethod
    def from_manifest(cls, section: dict) -> Languages:
        tokens = section["tokens"]
        return cls(
            tokens={code: int(entry["id"]) for code, entry in tokens.items()},
            model_codes={code: str(entry["code"]) for code, entry in tokens.items()},
            source_token=section["source_token"],
            target_token=section["target_token"],
        )


# ISO 639-3 codes (NLLB's, and those of language-identification models that name languages as
# NLLB does) that have an ISO 639-1 code (individual languages standing for their
# macrolanguage where that is what the two-letter code usually means: arb -> ar, pes -> fa,
# zsm -> ms, ...). The others keep their three letters.
# fmt: off
ISO_639_1 = {
    "afr": "af", "aka": "ak", "amh": "am", "arb": "ar", "asm": "as", "ayr": "ay", "azj": "az",
    "bak": "ba", "bam": "bm", "bel": "be", "ben": "bn", "bod": "bo", "bos": "bs", "bul": "bg",
    "cat": "ca", "ces": "cs", "cym": "cy", "dan": "da", "deu": "de", "dzo": "dz", "ell": "el",
    "eng": "en", "epo": "eo", "est": "et", "eus": "eu", "ewe": "ee", "fao": "fo", "pes": "fa",
    "fij": "fj", "fin": "fi", "fra": "fr", "gla": "gd", "gle": "ga", "glg": "gl", "grn": "gn",
    "guj": "gu", "hat": "ht", "hau": "ha", "heb": "he", "hin": "hi", "hrv": "hr", "hun": "hu",
    "hye": "hy", "ibo": "ig", "ind": "id", "isl": "is", "ita": "it", "jav": "jv", "jpn": "ja",
    "kan": "kn", "kas": "ks", "kat": "ka", "kaz": "kk", "khm": "km", "kik": "ki", "kin": "rw",
    "kir": "ky", "kon": "kg", "kor": "ko", "kmr": "ku", "lao": "lo", "lvs": "lv", "lim": "li",
    "lin": "ln", "lit": "lt", "ltz": "lb", "lug": "lg", "mal": "ml", "mar": "mr", "mkd": "mk",
    "plt": "mg", "mlt": "mt", "khk": "mn", "mri": "mi", "zsm": "ms", "mya": "my", "nld": "nl",
    "nno": "nn", "nob": "nb", "npi": "ne", "nya": "ny", "oci": "oc", "gaz": "om", "ory": "or",
    "pan": "pa", "pol": "pl", "por": "pt", "pbt": "ps", "quy": "qu", "ron": "ro", "run": "rn",
    "rus": "ru", "sag": "sg", "san": "sa", "sin": "si", "slk": "sk", "slv": "sl", "smo": "sm",
    "sna": "sn", "snd": "sd", "som": "so", "sot": "st", "spa": "es", "als": "sq", "srd": "sc",
    "srp": "sr", "ssw": "ss", "sun": "su", "swe": "sv", "swh": "sw", "tam": "ta", "tat": "tt",
    "tel": "te", "tgk": "tg", "tgl": "tl", "tha": "th", "tir": "ti", "tsn": "tn", "tso": "ts",
    "tuk": "tk", "tur": "tr", "twi": "tw", "uig": "ug", "ukr": "uk", "urd": "ur", "uzn": "uz",
    "vie": "vi", "wol": "wo", "xho": "xh", "ydd": "yi", "yor": "yo", "zho": "zh", "zul": "zu",
    # The rest of ISO 639-1 (ISO 639-3's table, as pycountry 24.6.1 ships it), macrolanguages
    # included, for language-identification models that name more languages than NLLB
    # (GlotLID: bre_Latn is M2M-100's "br"); nor is Bokmål as "no" is, hbs keeps its code.
    "aar": "aa", "abk": "ab", "ara": "ar", "arg": "an", "ava": "av", "ave": "ae", "aym": "ay",
    "aze": "az", "bis": "bi", "bre": "br", "cha": "ch", "che": "ce", "chu": "cu", "chv": "cv",
    "cor": "kw", "cos": "co", "cre": "cr", "div": "dv", "fas": "fa", "fry": "fy", "ful": "ff",
    "glv": "gv", "her": "hz", "hmo": "ho", "ido": "io", "iii": "ii", "iku": "iu", "ile": "ie",
    "ina": "ia", "ipk": "ik", "kal": "kl", "kau": "kr", "kom": "kv", "kua": "kj", "kur": "ku",
    "lat": "la", "lav": "lv", "lub": "lu", "mah": "mh", "mlg": "mg", "mon": "mn", "msa": "ms",
    "nau": "na", "nav": "nv", "nbl": "nr", "nde": "nd", "ndo": "ng", "nep": "ne", "nor": "nb",
    "oji": "oj", "ori": "or", "orm": "om", "oss": "os", "pli": "pi", "pus": "ps", "que": "qu",
    "roh": "rm", "sme": "se", "sqi": "sq", "swa": "sw", "tah": "ty", "ton": "to", "uzb": "uz",
    "ven": "ve", "vol": "vo", "wln": "wa", "yid": "yi", "zha": "za",
}
# fmt: on

# The usual script of a language NLLB writes in several: it keeps the bare code.
USUAL_SCRIPT = {
    "ace": "Latn",
    "bjn": "Latn",
    "kas": "Arab",
    "knc": "Latn",
    "taq": "Latn",
    "zho": "Hans",
}


def code_of_language_and_script(model_code: str) -> str:
    """A language named by ISO 639-3 and an ISO 15924 script, as NLLB's tokens and the
    fastText language-identification models of NLLB and GlotLID name it, -> our code:
    `fra_Latn` -> "fr", `ast_Latn` -> "ast", `zho_Hant` -> "zh-Hant"."""
    language, script = model_code.split("_")
    code = ISO_639_1.get(language, language)
    if language in USUAL_SCRIPT and USUAL_SCRIPT[language] != script:
        code += f"-{script}"
    return code


def join_marian_pieces(target_model: Any, pieces: list[str]) -> str:
    """Target pieces -> text, as `MarianTokenizer` does: the target SentencePiece model joins
    them, and a "▁" left over in a piece it does not know (a source-only piece of Marian's
    shared vocabulary) becomes a space. `target_model` is a SentencePieceProcessor."""
    return target_model.decode_pieces(pieces).replace("▁", " ").strip()


SHORTLIST_FILE = "shortlist.npz"
# A bundle's confidence calibration (service/serving/confidence.py), written after the export
# by `nmt calibrate` (so bundle.json's checksums do not cover it: the server validates it on
# load instead). A checkpoint directory may carry one, which `nmt export` copies.
CONFIDENCE_FILE = "confidence.json"


@dataclass(frozen=True)
class Shortlist:
    """A vocabulary shortlist (export/shortlist.py builds it): the target words a batch of
    sources may lead to. Stored as `shortlist.npz` in model directories and bundles."""

    always: np.ndarray  # [M] int32: target ids that are candidates for every source
    candidates: np.ndarray  # [V, per_source] int32: each source id's target ids, -1 = none

    def save(self, path: Path) -> None:
        with open(path, "wb") as f:  # np.savez_compressed would append .npz to a bare name
            np.savez_compressed(f, always=self.always, candidates=self.candidates)

    @classmethod
    def load(cls, path: Path) -> Shortlist:
        with np.load(path) as data:
            return cls(data["always"], data["candidates"])

    def fits(self, vocab_size: int) -> bool:
        """Built for a vocabulary of vocab_size words: a row per source id, every id inside."""
        ids = np.concatenate([self.always.ravel(), self.candidates.ravel()])
        return len(self.candidates) == vocab_size and ids.max(initial=-1) < vocab_size

    def vocabulary_for(self, source_ids: np.ndarray) -> np.ndarray:
        """The candidate target ids of a batch, ascending int64: `always` plus the candidates
        of every source id in it (padding is harmless: the pad id is among `always`)."""
        ids = np.asarray(source_ids)
        found = self.candidates[ids[ids < len(self.candidates)]].ravel()
        return union_of([self.always, found[found >= 0]])


def union_of(parts: list[np.ndarray]) -> np.ndarray:
    """The distinct ids of all parts (non-negative), ascending, int64. Marked in a mask as
    long as the largest id: 15x quicker than np.unique's sort for a batch's candidates (32
    sources' 1,844 words of 8,000: 24 against 378 µs)."""
    ids = np.concatenate(parts)
    mask = np.zeros(int(ids.max(initial=-1)) + 1, dtype=bool)
    mask[ids] = True
    return np.flatnonzero(mask)
