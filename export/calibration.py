"""Fitting a bundle's confidence.json: what `nmt calibrate` learns on held-out sentences.

The served model translates held-out sentences with their confidence features
(service/serving/confidence.py: the same code the server answers with); this module labels
them against the references and fits what the server applies:

* the sentence confidence: a logistic regression over the standardized features, the
  estimated probability that the translation is good (its sentence chrF against the
  reference is at least `good_chrf`), fitted in two steps with scikit-learn (fit_search). Its
  mean and scale, weights and bias are the file's, so the server needs no scikit-learn to
  apply it, and anyone can read what carries the signal.
* with jackknifed labels (export/jackknife.py), a lexicon: a ridge regression over which
  pieces a source and its translation hold, of what the decoder's features leave unexplained
  of the chrF of tens of thousands of translations (fit_lexicon); its score is one more
  feature of the logistic regression.
* the word threshold: a word is doubtful below the probability that best separates the
  output words found in the reference from those that are not (Youden's J: the largest
  true-positive rate minus false-positive rate).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import sacrebleu
from scipy import sparse
from scipy.stats import spearmanr
from sklearn.linear_model import LogisticRegression, Ridge

# What a good translation is, by default: a sentence chrF of at least this against the
# reference (on Multi30k's validation set, about two thirds of the committed model's beam-4
# translations).
GOOD_CHRF = 50.0
# The ranking's ridge penalty (on standardized features; 1 to 100 rank alike on Multi30k).
RIDGE_ALPHA = 10.0
# The lexicon's ridge penalty, over piece indicators (30 to 1,000 rank within 0.006 on
# Multi30k's jackknifed labels: docs/confidence.md).
LEXICON_ALPHA = 100.0
# Translations needed on each side of the threshold (good and not good) to fit anything.
MIN_SIDE = 20


def sentence_chrf(hypothesis: str, reference: str) -> float:
    return float(sacrebleu.sentence_chrf(hypothesis, [reference]).score)


@dataclass
class FittedSearch:
    """One search's logistic regression, as confidence.json stores it."""

    features: list[str]
    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float
    lexicon: dict | None = None  # service.serving.confidence.Lexicon's fields

    def predict(self, rows: np.ndarray) -> np.ndarray:
        z = self.bias + ((rows - np.array(self.mean)) / np.array(self.scale)) @ np.array(
            self.weights
        )
        return 1.0 / (1.0 + np.exp(-z))


def feature_matrix(features: list[dict[str, float]], names: list[str]) -> np.ndarray:
    return np.array([[row[name] for name in names] for row in features], dtype=np.float64)


def ridge_ranking(rows: np.ndarray, chrf: np.ndarray) -> tuple[np.ndarray, np.ndarray, Ridge]:
    """A ridge regression of chrF [n] on the standardized rows [n, features]: their mean
    and scale [features], and the fitted Ridge."""
    mean = rows.mean(axis=0)
    scale = rows.std(axis=0)
    scale[scale == 0] = 1.0  # a constant feature (agreement in greedy search) carries nothing
    return mean, scale, Ridge(alpha=RIDGE_ALPHA).fit((rows - mean) / scale, chrf)


def fit_search(
    rows: np.ndarray,
    chrf: np.ndarray,
    good_chrf: float,
    names: list[str],
    lexicon: dict | None = None,
) -> FittedSearch:
    """The sentence confidence for rows [n, features] of sentences whose chrF is `chrf` [n],
    in two steps that fold into one logistic regression:

    1. a ranking: a ridge regression of chrF on the standardized features (it uses every
       difference in quality, where a classifier of good/not good sees only which side of
       the threshold a sentence is on, and ranks worse: docs/confidence.md);
    2. a calibration of that score (Platt scaling): a logistic regression of good (chrF >=
       good_chrf) on it.

    confidence = sigmoid(a * (ridge_bias + ridge_weights . z) + b) = sigmoid(bias + weights . z)
    with z the standardized features: the file stores weights = a * ridge_weights and
    bias = a * ridge_bias + b. With a lexicon (fit_lexicon), one of the rows' columns is its
    score, and the file keeps it."""
    good = int((chrf >= good_chrf).sum())
    if min(good, len(chrf) - good) < MIN_SIDE:
        raise ValueError(
            f"{good} of {len(chrf)} translations have a chrF of at least {good_chrf:g}: too "
            f"few on one side to learn from (at least {MIN_SIDE} each); choose another "
            f"threshold (their median chrF is {float(np.median(chrf)):.1f}) or more sentences"
        )
    mean, scale, ranking = ridge_ranking(rows, chrf)
    score = ranking.predict((rows - mean) / scale)
    platt = LogisticRegression(C=1.0, max_iter=1000).fit(score[:, None], chrf >= good_chrf)
    a, b = float(platt.coef_[0, 0]), float(platt.intercept_[0])
    return FittedSearch(
        list(names),
        [round(float(v), 6) for v in mean],
        [round(float(v), 6) for v in scale],
        [round(a * float(w), 6) for w in ranking.coef_],
        round(a * float(ranking.intercept_) + b, 6),
        lexicon,
    )


def piece_indicators(
    source_ids: list[list[int]], output_ids: list[list[int]], vocab_sizes: tuple[int, int]
) -> sparse.csr_matrix:
    """[sentences, source vocabulary + target vocabulary]: 1 where a sentence's source
    (left) or translation (right) holds a piece, however often."""
    source_size = vocab_sizes[0]
    rows, columns = [], []
    for row, (source, output) in enumerate(zip(source_ids, output_ids, strict=True)):
        held = {*source} | {source_size + piece for piece in output}
        rows += [row] * len(held)
        columns += sorted(held)
    return sparse.csr_matrix(
        (np.ones(len(rows)), (rows, columns)), shape=(len(source_ids), sum(vocab_sizes))
    )


def fit_lexicon(
    rows: np.ndarray,
    chrf: np.ndarray,
    source_ids: list[list[int]],
    output_ids: list[list[int]],
    vocab_sizes: tuple[int, int],
) -> dict:
    """A weight per source piece and per target piece: a ridge regression over which
    pieces each translation's source and output hold (piece_indicators), of what a ranking
    of its own features (rows [n, features]) leaves of its chrF [n]. Fitted on jackknifed
    labels (translations by models that had not seen their sources), it learns which words
    are hard to translate well beyond what the decoder's uncertainty shows. Returns
    service.serving.confidence.Lexicon's fields (weights in chrF points)."""
    mean, scale, ranking = ridge_ranking(rows, chrf)
    left = chrf - ranking.predict((rows - mean) / scale)
    lexicon = Ridge(alpha=LEXICON_ALPHA).fit(
        piece_indicators(source_ids, output_ids, vocab_sizes), left
    )
    weights = [round(float(w), 4) for w in lexicon.coef_]
    return {
        "bias": round(float(lexicon.intercept_), 4),
        "source": weights[: vocab_sizes[0]],
        "target": weights[vocab_sizes[0] :],
    }


def file_text(calibration: dict) -> str:
    """confidence.json's text: indented, each list of numbers on one line (a lexicon's
    thousands of weights would otherwise take a line each)."""
    text = json.dumps(calibration, indent=2)
    return (
        re.sub(
            r"\[\s*(-?[0-9][-0-9.e+]*(?:,\s*-?[0-9][-0-9.e+]*)*)\s*\]",
            lambda numbers: "[" + ", ".join(n.strip() for n in numbers.group(1).split(",")) + "]",
            text,
        )
        + "\n"
    )


def word_labels(words: list[str], reference: str) -> list[bool]:
    """Per output word: whether it is wrong, i.e. not in the reference (compared lowercased,
    without punctuation, each reference word matched at most once)."""
    left = Counter(_plain(word) for word in reference.split())
    wrong = []
    for word in words:
        plain = _plain(word)
        if left[plain] > 0:
            left[plain] -= 1
            wrong.append(False)
        else:
            wrong.append(True)
    return wrong


def _plain(word: str) -> str:
    return re.sub(r"[^\w]", "", word.lower())


def word_threshold(probabilities: np.ndarray, wrong: np.ndarray) -> float:
    """The probability below which a word is doubtful: the one that maximizes the share of
    wrong words flagged minus the share of right words flagged."""
    best, best_j = 0.5, -1.0
    for threshold in np.round(np.arange(0.02, 1.0, 0.01), 2):
        flagged = probabilities < threshold
        j = flagged[wrong].mean() - flagged[~wrong].mean()
        if j > best_j:
            best, best_j = float(threshold), float(j)
    return best


def expected_calibration_error(confidence: np.ndarray, good: np.ndarray, bins: int = 10) -> float:
    """The mean gap between predicted and observed rate of good translations, over
    equal-width confidence bins, weighted by how many sentences fall in each."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1]), 0, bins - 1)
    gap = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            gap += inside.mean() * abs(confidence[inside].mean() - good[inside].mean())
    return float(gap)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(spearmanr(a, b).statistic)
