"""Fitting confidence.json (export/calibration.py): against scikit-learn and known answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="needs the export extra (scikit-learn)")

from sklearn.linear_model import LogisticRegression, Ridge

from export import calibration as fit
from export.train_config import multi30k_dir
from nmt_contract import CONFIDENCE_FILE
from service.serving.confidence import SearchCalibration, load_calibration
from tests.conftest import ROOT


def synthetic(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two features and a chrF: the first feature and noise make the chrF (the second
    feature carries nothing)."""
    rng = np.random.default_rng(seed)
    rows = np.column_stack([rng.normal(-0.4, 0.3, count), rng.normal(5.0, 2.0, count)])
    chrf = 60 + 40 * (rows[:, 0] + 0.4) + rng.normal(0, 12, count)
    return rows, chrf


NAMES = ["mean_log_prob", "mean_margin"]


def test_the_stored_regression_is_the_ridge_ranking_calibrated_by_scikit_learn():
    rows, chrf = synthetic(2000, seed=1)
    fitted = fit.fit_search(rows, chrf, 50.0, NAMES)
    standardized = (rows - rows.mean(axis=0)) / rows.std(axis=0)
    score = Ridge(alpha=fit.RIDGE_ALPHA).fit(standardized, chrf).predict(standardized)
    platt = LogisticRegression().fit(score[:, None], chrf >= 50.0)
    expected_chances = platt.predict_proba(score[:50, None])[:, 1]
    served = SearchCalibration(**vars(fitted))
    for row, expected in zip(rows[:50], expected_chances, strict=True):
        features = {"mean_log_prob": row[0], "mean_margin": row[1]}
        assert served.confidence(features, [], []) == pytest.approx(expected, abs=1e-4)
    assert abs(fitted.weights[0]) > 5 * abs(fitted.weights[1])  # the informative feature


def test_a_regression_fitted_on_one_sample_is_calibrated_on_another():
    rows, chrf = synthetic(4000, seed=2)
    fitted = fit.fit_search(rows, chrf, 50.0, NAMES)
    held_rows, held_chrf = synthetic(4000, seed=3)
    held_good = held_chrf >= 50.0
    assert fit.expected_calibration_error(fitted.predict(held_rows), held_good) < 0.05
    # ... and a constant guess far from the truth is not
    assert fit.expected_calibration_error(np.full(4000, 0.99), held_good) > 0.2
    # it ranks as the informative feature does
    assert fit.spearman(fitted.predict(held_rows), held_chrf) == pytest.approx(
        fit.spearman(held_rows[:, 0], held_chrf), abs=0.02
    )


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


def test_a_threshold_with_too_few_on_one_side_is_refused_saying_why():
    rows, chrf = synthetic(200, seed=5)
    with pytest.raises(ValueError, match=r"too few on one side.*median chrF is"):
        fit.fit_search(rows, chrf, 500.0, NAMES)


@pytest.mark.slow
def test_nmt_calibrate_writes_a_calibration_the_server_reads(fr_en_bundle: Path, tmp_path: Path):
    """`nmt calibrate` on 300 Multi30k val sentences, through the command line, then read as
    the server reads it."""
    data = multi30k_dir()
    if not (data / "val.fr").exists():
        pytest.skip(f"Multi30k is not at {data}")
    for language in ("fr", "en"):
        lines = (data / f"val.{language}").read_text().splitlines()[:300]
        (tmp_path / f"val.{language}").write_text("\n".join(lines) + "\n")
    out = tmp_path / CONFIDENCE_FILE  # (not into the shared bundle)
    done = subprocess.run(
        [sys.executable, "nmt_cli.py", "calibrate", "--model-dir", str(fr_en_bundle),
         "--source", str(tmp_path / "val.fr"), "--reference", str(tmp_path / "val.en"),
         "--out", str(out), "--threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calibration = load_calibration(tmp_path)
    assert set(calibration.searches) == {"greedy", "beam"}
    assert 0 < calibration.word_threshold < 1
    summary = json.loads(done.stdout)
    # on the data it was fitted on, it ranks at least about as well as the raw score
    for search in ("greedy", "beam"):
        assert summary[f"{search}_spearman"] > summary[f"{search}_spearman_raw"] - 0.05
        assert summary[f"{search}_ece"] < 0.1
