"""How sure a translation is: per-sentence and per-word confidence.

The decoder knows more about a translation than its mean log-prob. While it writes it (with
SearchOptions.confidence), each produced token keeps its log-prob, the entropy of that step's
distribution and its margin over the runner-up (Hypothesis.token_confidence); the chosen
decoder layer's cross-attention says where in the source each token looked
(Hypothesis.alignment); a beam's other hypotheses say whether the search hesitated. From
those, `sentence_features` makes one row of SENTENCE_FEATURES.

A sentence's confidence in [0, 1] is a logistic regression over that row, trained offline
against a quality label on held-out sentences (`nmt calibrate`, which writes the bundle's
`confidence.json`): the estimated probability that the translation is good (the label says
what good means: e.g. a sentence chrF of at least 50 against a reference). A bundle without
`confidence.json` still answers with the raw score (the mean token log-prob) and each word's
probability, but no calibrated sentence confidence and no doubtful flags.

The decoder does not know which words are hard to translate well, only how sure it was of
them. A calibration may add a lexicon (`nmt calibrate --jackknife`): a weight per source piece
and per output piece, learned from tens of thousands of translations made by models that had
not seen their sources (export/jackknife.py); a sentence's `lexicon` feature is the sum of the
weights of the pieces it holds.

A word's confidence is the probability the decoder gave it: the product of its pieces'
probabilities. It is doubtful below the threshold chosen on validation data.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nmt_contract import CONFIDENCE_FILE, TOKEN_CONFIDENCE, Hypothesis
from service.runtime.search import SearchOptions

if TYPE_CHECKING:
    from service.runtime.translator import Translator

# What this server writes; it reads format 1 too (the same file without lexicons).
CONFIDENCE_FORMAT = 2
READABLE_FORMATS = (1, 2)

SENTENCE_FEATURES = (
    "mean_log_prob",  # the raw score: mean of the tokens' log-probs, </s> included
    "min_log_prob",  # the least likely token
    "mean_entropy",  # how flat the steps' distributions were, on average ...
    "max_entropy",  # ... and at the flattest step
    "mean_margin",  # how far each token was ahead of its runner-up, on average ...
    "min_margin",  # ... and at the closest call
    "length_ratio",  # output tokens per source token
    "coverage",  # share of the source tokens that received attention (a dropped clause: low)
    "attention_entropy",  # how spread each step's attention was (wandering: high), 0..1
    "eos_attention",  # attention on the source's </s> (looking at nothing in particular)
    "agreement",  # how much a beam's other hypotheses share with the best (beam search only)
)
# A calibration with a lexicon reads one feature more: the weights of the sentence's pieces.
LEXICON = "lexicon"
# Which features each search has: greedy search has no other hypotheses to agree with.
SEARCH_FEATURES = {
    "greedy": tuple(f for f in SENTENCE_FEATURES if f != "agreement"),
    "beam": SENTENCE_FEATURES,
}
# A margin is capped: past it the runner-up is irrelevant, and a mean should not be
# dominated by a few certain tokens.
MAX_MARGIN = 10.0
# A source token counts as covered once the target tokens' attention on it adds up to this.
COVERED = 0.5

_LOG_PROB = TOKEN_CONFIDENCE.index("log_prob")
_ENTROPY = TOKEN_CONFIDENCE.index("entropy")
_MARGIN = TOKEN_CONFIDENCE.index("margin")


def search_of(beam_size: int) -> str:
    return "greedy" if beam_size == 1 else "beam"


def _nan_stat(values: np.ndarray, how, empty: float) -> float:
    values = values[np.isfinite(values)]
    return float(how(values)) if len(values) else empty


def sentence_features(
    best: Hypothesis, others: list[Hypothesis], source_length: int, skip_first: bool = False
) -> dict[str, float]:
    """One sentence's SENTENCE_FEATURES, from its best hypothesis (decoded with confidence and
    alignment), the search's other hypotheses (best first; [] in greedy search) and its
    source length in tokens (</s> included). `skip_first`: the first produced token was
    forced (a multilingual model's target language), not a decision of the model."""
    tokens = np.asarray(best.token_confidence, dtype=np.float64).reshape(-1, len(TOKEN_CONFIDENCE))
    attention = None if best.alignment is None else np.asarray(best.alignment, dtype=np.float64)
    if skip_first and len(tokens):
        tokens = tokens[1:]
        attention = None if attention is None else attention[1:]
    log_probs, entropy = tokens[:, _LOG_PROB], tokens[:, _ENTROPY]
    margins = np.minimum(tokens[:, _MARGIN], MAX_MARGIN)
    features = {
        "mean_log_prob": _nan_stat(log_probs, np.mean, 0.0),
        "min_log_prob": _nan_stat(log_probs, np.min, 0.0),
        "mean_entropy": _nan_stat(entropy, np.mean, 0.0),
        "max_entropy": _nan_stat(entropy, np.max, 0.0),
        "mean_margin": _nan_stat(margins, np.mean, MAX_MARGIN),
        "min_margin": _nan_stat(margins, np.min, MAX_MARGIN),
        "length_ratio": len(tokens) / max(source_length, 1),
    }
    features.update(attention_features(attention))
    features["agreement"] = agreement(best.tokens, [h.tokens for h in others])
    return features


def attention_features(attention: np.ndarray | None) -> dict[str, float]:
    """coverage, attention_entropy and eos_attention of one sentence's cross-attention
    [target tokens, source tokens] (rows sum to 1; the source's last token is its </s>)."""
    if attention is None or attention.size == 0:
        return {"coverage": 1.0, "attention_entropy": 0.0, "eos_attention": 0.0}
    width = attention.shape[1]
    words = attention[:, :-1] if width > 1 else attention  # the source without its </s>
    coverage = float((words.sum(axis=0) >= COVERED).mean())
    with np.errstate(divide="ignore", invalid="ignore"):
        each = -np.where(attention > 0, attention * np.log(attention), 0.0).sum(axis=1)
    spread = float(each.mean() / math.log(width)) if width > 1 else 0.0
    return {
        "coverage": coverage,
        "attention_entropy": spread,
        "eos_attention": float(attention[:, -1].mean()),
    }


def agreement(best: list[int], others: list[list[int]]) -> float:
    """The mean token F1 between the best hypothesis and each other one (bags of tokens):
    1.0 when the search had no other (greedy) or they all say the same."""
    if not others:
        return 1.0
    mine = _bag(best)
    scores = []
    for other in others:
        theirs = _bag(other)
        common = sum(min(count, theirs.get(token, 0)) for token, count in mine.items())
        total = len(best) + len(other)
        scores.append(2 * common / total if total else 1.0)
    return float(np.mean(scores))


def _bag(tokens: list[int]) -> dict[int, int]:
    bag: dict[int, int] = {}
    for token in tokens:
        bag[token] = bag.get(token, 0) + 1
    return bag


# --- the calibration file (confidence.json) ----------------------------------------------------


class Lexicon(BaseModel):
    """What the decoder's features leave unexplained, learned per piece: how much better or
    worse (in sentence chrF) translations went, all else equal, when their source held a
    piece, and when their translation did. score = bias + the weights of the distinct pieces
    a sentence holds, on each side (ids as the model reads and writes them)."""

    model_config = ConfigDict(extra="forbid")
    bias: float
    source: list[float]  # [source vocabulary]
    target: list[float]  # [target vocabulary]

    def score(self, source_ids: Sequence[int], output_ids: Sequence[int]) -> float:
        return (
            self.bias
            + sum(self.source[i] for i in set(source_ids))
            + sum(self.target[i] for i in set(output_ids))
        )


class SearchCalibration(BaseModel):
    """A logistic regression over standardized features: confidence =
    sigmoid(bias + sum(weights[i] * (x[i] - mean[i]) / scale[i])). With a lexicon, one of the
    features is its score (LEXICON)."""

    model_config = ConfigDict(extra="forbid")
    features: list[str]
    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float
    lexicon: Lexicon | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SearchCalibration:
        known = (*SENTENCE_FEATURES, LEXICON) if self.lexicon is not None else SENTENCE_FEATURES
        unknown = sorted(set(self.features) - set(known))
        if unknown:
            raise ValueError(f"unknown features {unknown} (known: {list(known)})")
        if self.lexicon is not None and LEXICON not in self.features:
            raise ValueError(f"a lexicon without the {LEXICON!r} feature that reads it")
        sizes = {len(self.features), len(self.mean), len(self.scale), len(self.weights)}
        if len(sizes) != 1:
            raise ValueError("features, mean, scale and weights must have the same length")
        if any(s <= 0 for s in self.scale):
            raise ValueError("every scale must be positive")
        return self

    def row(
        self, features: dict[str, float], source_ids: Sequence[int], output_ids: Sequence[int]
    ) -> dict[str, float]:
        """The features it reads: the sentence's, and with a lexicon that lexicon's score of
        the ids the encoder read and the ids produced (without </s> and a forced first
        token)."""
        if self.lexicon is None:
            return features
        return {**features, LEXICON: self.lexicon.score(source_ids, output_ids)}

    def confidence(
        self, features: dict[str, float], source_ids: Sequence[int], output_ids: Sequence[int]
    ) -> float:
        row = self.row(features, source_ids, output_ids)
        x = np.array([row[name] for name in self.features])
        z = self.bias + float(
            np.dot(self.weights, (x - np.array(self.mean)) / np.array(self.scale))
        )
        return 1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))


class CalibrationFile(BaseModel):
    """confidence.json: what `nmt calibrate` learned on held-out sentences."""

    model_config = ConfigDict(extra="forbid")
    format: int = Field(CONFIDENCE_FORMAT)
    label: str  # what the sentence confidence estimates the probability of
    searches: dict[str, SearchCalibration]  # "greedy", "beam"
    word_threshold: float = Field(ge=0.0, le=1.0)  # a word is doubtful below it
    trained_on: str  # the data and the decoding it was fitted on
    command: str  # how to make it again
    metrics: dict[str, float] = Field(default_factory=dict)  # how well it did on that data

    @model_validator(mode="after")
    def _known(self) -> CalibrationFile:
        if self.format not in READABLE_FORMATS:
            readable = " and ".join(map(str, READABLE_FORMATS))
            raise ValueError(f"format {self.format}, this server reads {readable}")
        unknown = sorted(set(self.searches) - set(SEARCH_FEATURES))
        if unknown or not self.searches:
            raise ValueError(f"searches must be among {list(SEARCH_FEATURES)}, got {unknown}")
        return self

    def check_vocabulary(self, source_size: int, target_size: int) -> None:
        """Its lexicons were learned for a model of these vocabularies (ValueError if not)."""
        for search, fitted in self.searches.items():
            lexicon = fitted.lexicon
            if lexicon is not None and (len(lexicon.source), len(lexicon.target)) != (
                source_size,
                target_size,
            ):
                raise ValueError(
                    f"the {search} lexicon has {len(lexicon.source)} source and "
                    f"{len(lexicon.target)} target weights, the model's vocabularies "
                    f"{source_size} and {target_size}: calibrate it for this model"
                )


class CalibrationError(Exception):
    """A bundle's confidence.json cannot be read."""


def load_calibration(
    bundle_dir: Path, vocab_sizes: tuple[int, int] | None = None
) -> CalibrationFile | None:
    """The bundle's calibration, None when it has none; with vocab_sizes (the model's source
    and target vocabularies: Bundle.vocab_sizes), checked against them."""
    path = Path(bundle_dir) / CONFIDENCE_FILE
    if not path.is_file():
        return None
    try:
        calibration = CalibrationFile.model_validate(json.loads(path.read_text()))
        if vocab_sizes is not None:
            calibration.check_vocabulary(*vocab_sizes)
        return calibration
    except (OSError, ValueError, ValidationError) as error:
        raise CalibrationError(f"{path}: {error}") from None


# --- the answer ---------------------------------------------------------------------------------


@dataclass
class WordConfidence:
    word: str
    confidence: float
    doubtful: bool | None  # None without a calibration


@dataclass
class SentenceConfidence:
    sentence: float | None  # calibrated; None without a calibration
    raw: float  # the mean token log-prob (</s> included)
    words: list[WordConfidence]
    # The length limit (max_length, or 1.5x the source plus 10) cut the translation before it
    # ended: it is not a translation of the whole sentence, whatever its words' probabilities
    # (a cut translation's first words are often the surest), and its confidence is 0.
    truncated: bool = False


def word_confidences(
    pieces: list[str], log_probs: np.ndarray, threshold: float | None
) -> list[WordConfidence]:
    """Words of the output (SentencePiece pieces grouped at each word-start mark) and the
    probability the decoder gave each: the product of its pieces' (a piece that was forced,
    NaN, counts as certain). pieces and log_probs: the produced tokens, </s> excluded."""
    words: list[WordConfidence] = []
    text, total = "", 0.0
    for piece, log_prob in zip(pieces, log_probs, strict=True):
        starts = piece.startswith("\u2581")
        if starts and text:
            words.append(_word(text, total, threshold))
            text, total = "", 0.0
        text += piece.lstrip("\u2581") if starts else piece
        total += 0.0 if not np.isfinite(log_prob) else float(log_prob)
    if text:
        words.append(_word(text, total, threshold))
    return words


def words_of(best: Hypothesis, first_token: int | None) -> tuple[list[int], np.ndarray, bool]:
    """The tokens of a hypothesis that make its words, and their log-probs: without </s>
    and without a forced first token (a multilingual model's target language), and whether
    it had one."""
    skip_first = first_token is not None and bool(best.tokens) and best.tokens[0] == first_token
    tokens = best.tokens[1:] if skip_first else best.tokens
    log_probs = np.asarray(best.token_confidence)[int(skip_first) :, _LOG_PROB][: len(tokens)]
    return tokens, log_probs, skip_first


def _word(text: str, log_prob: float, threshold: float | None) -> WordConfidence:
    probability = round(math.exp(log_prob), 4)
    return WordConfidence(text, probability, None if threshold is None else probability < threshold)


def sentence_confidence(
    calibration: CalibrationFile | None,
    search: str,
    features: dict[str, float],
    pieces: list[str],
    token_log_probs: np.ndarray,
    *,
    source_ids: Sequence[int],
    output_ids: Sequence[int],
    truncated: bool = False,
) -> SentenceConfidence:
    """A sentence's answer: calibrated confidence (when the bundle has a calibration for this
    search; 0 for a translation the length limit cut), raw score and words.
    `pieces`/`token_log_probs`: its produced tokens without the forced first token and without
    </s>; `output_ids` those tokens, `source_ids` what the encoder read (a lexicon reads both)."""
    chosen = calibration.searches.get(search) if calibration is not None else None
    sentence = (
        None if chosen is None else round(chosen.confidence(features, source_ids, output_ids), 4)
    )
    if sentence is not None and truncated:
        sentence = 0.0
    threshold = None if chosen is None else calibration.word_threshold
    return SentenceConfidence(
        sentence,
        round(features["mean_log_prob"], 4),
        word_confidences(pieces, token_log_probs, threshold),
        truncated,
    )


def text_confidence(sentences: list[SentenceConfidence]) -> SentenceConfidence:
    """A text of several sentences: its sentence confidence is their mean (the expected share
    of its sentences that are good), its raw score their mean, its words all of theirs."""
    if not sentences:
        return SentenceConfidence(None, 0.0, [])
    calibrated = [s.sentence for s in sentences]
    return SentenceConfidence(
        None if None in calibrated else round(float(np.mean(calibrated)), 4),
        round(float(np.mean([s.raw for s in sentences])), 4),
        [word for s in sentences for word in s.words],
        any(s.truncated for s in sentences),
    )


def through_pivot(first: SentenceConfidence, second: SentenceConfidence) -> SentenceConfidence:
    """A sentence translated through a pivot language: good only if both legs are (the
    product of their confidences, as if independent), its raw score the sum of both legs'
    mean log-probs, its words the second leg's."""
    both = None
    if first.sentence is not None and second.sentence is not None:
        both = round(first.sentence * second.sentence, 4)
    return SentenceConfidence(
        both, round(first.raw + second.raw, 4), second.words, first.truncated or second.truncated
    )


# --- what a calibration is fitted on ------------------------------------------------------------


@dataclass
class ScoredSentence:
    """One sentence translated as the server would, with what its confidence is made of."""

    translation: str
    features: dict[str, float]
    words: list[WordConfidence]
    source_ids: list[int]  # what the encoder read
    output_ids: list[int]  # the produced tokens, without </s> and a forced first token


def scored_sentences(
    translator: Translator,
    sentences: list[str],
    options: SearchOptions,
    batch_size: int = 32,
    source_lang: str | None = None,
    target_lang: str | None = None,
) -> list[ScoredSentence]:
    """`sentences` translated with `options` (their confidence asked for, as the server asks:
    alignment on the last layer, every hypothesis of a beam), each with its features and
    words: what `nmt calibrate` fits confidence.json on."""
    first = translator.first_token(target_lang)
    options = replace(
        options,
        confidence=True,
        alignment=True,
        alignment_layer=-1,
        n_best=options.beam_size,
        first_token=first,
    )
    tokenizer = translator.tokenizer
    sources = tokenizer.encode(sentences, source_lang or translator.bundle.source_lang)
    found = translator.translate_ids(sources, options, batch_size)
    scored = []
    for source, hypotheses in zip(sources, found, strict=True):
        best = hypotheses[0]
        tokens, log_probs, skip_first = words_of(best, first)
        scored.append(
            ScoredSentence(
                tokenizer.decode(best.tokens),
                sentence_features(best, hypotheses[1:], len(source), skip_first),
                word_confidences(tokenizer.target_pieces(tokens), log_probs, None),
                list(source),
                list(tokens),
            )
        )
    return scored
