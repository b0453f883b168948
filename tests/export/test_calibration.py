"""Fitting confidence.json (export/calibration.py): against scikit-learn and known answers."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="needs the export extra (scikit-learn)")

from sklearn.linear_model import LogisticRegression

from export import calibration as fit
from service.serving.confidence import SearchCalibration


def synthetic(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two features; good with the probability a known logistic model gives (the second
    feature carries nothing)."""
    rng = np.random.default_rng(seed)
    rows = np.column_stack([rng.normal(-0.4, 0.3, count), rng.normal(5.0, 2.0, count)])
    chance = 1 / (1 + np.exp(-(1.0 + 6.0 * (rows[:, 0] + 0.4))))
    return rows, rng.random(count) < chance


def test_the_stored_regression_predicts_what_scikit_learn_predicts():
    rows, good = synthetic(2000, seed=1)
    fitted = fit.fit_search(rows, good, ["mean_log_prob", "mean_margin"])
    standardized = (rows - rows.mean(axis=0)) / rows.std(axis=0)
    reference = LogisticRegression(C=1.0, max_iter=1000).fit(standardized, good.astype(int))
    served = SearchCalibration(**vars(fitted))
    expected_chances = reference.predict_proba(standardized[:50])[:, 1]
    for row, expected in zip(rows[:50], expected_chances, strict=True):
        features = {"mean_log_prob": row[0], "mean_margin": row[1]}
        assert served.confidence(features) == pytest.approx(expected, abs=1e-4)
    assert abs(fitted.weights[0]) > 5 * abs(fitted.weights[1])  # the informative feature


def test_a_regression_fitted_on_one_sample_is_calibrated_on_another():
    rows, good = synthetic(4000, seed=2)
    fitted = fit.fit_search(rows, good, ["mean_log_prob", "mean_margin"])
    held_rows, held_good = synthetic(4000, seed=3)
    assert fit.expected_calibration_error(fitted.predict(held_rows), held_good) < 0.05
    # ... and a constant guess far from the truth is not
    assert fit.expected_calibration_error(np.full(4000, 0.99), held_good) > 0.2


def test_expected_calibration_error_of_known_bins():
    confidence = np.array([0.15, 0.15, 0.85, 0.85])
    good = np.array([False, True, True, True])
    # bin 0.1-0.2: predicted 0.15, observed 0.5; bin 0.8-0.9: 0.85 against 1.0
    assert fit.expected_calibration_error(confidence, good) == pytest.approx(
        0.5 * 0.35 + 0.5 * 0.15
    )


def test_words_missing_from_the_reference_are_wrong_each_matched_once():
    words = ["A", "dog", "dog", "runs.", "cat"]
    expected = [False, False, True, False, True]  # (punctuation and case do not count)
    assert fit.word_labels(words, "A dog runs in the park.") == expected
    assert fit.word_labels(["The", "dog."], "the dog") == [False, False]


def test_the_word_threshold_separates_wrong_words_from_right_ones():
    rng = np.random.default_rng(4)
    right = rng.uniform(0.6, 1.0, 500)
    wrong = rng.uniform(0.0, 0.4, 100)
    threshold = fit.word_threshold(
        np.concatenate([right, wrong]), np.concatenate([np.zeros(500, bool), np.ones(100, bool)])
    )
    assert 0.4 <= threshold <= 0.6


def test_sentence_chrf_is_sacrebleus():
    assert fit.sentence_chrf("A dog runs.", "A dog runs.") == pytest.approx(100.0)
    assert fit.sentence_chrf("xyz", "A dog runs.") < 10
