"""Confidence features, word confidence and the calibration file, on made-up arrays."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from nmt_contract import CONFIDENCE_FILE, Hypothesis
from service.serving.confidence import (
    MAX_MARGIN,
    SENTENCE_FEATURES,
    CalibrationError,
    CalibrationFile,
    Lexicon,
    SearchCalibration,
    agreement,
    attention_features,
    load_calibration,
    sentence_confidence,
    sentence_features,
    text_confidence,
    through_pivot,
    word_confidences,
)

NAN = float("nan")


def hypothesis(tokens: list[int], token_confidence, alignment=None) -> Hypothesis:
    return Hypothesis(
        tokens, 0.0, 0.0, alignment=alignment, token_confidence=np.array(token_confidence)
    )


def test_attention_on_half_the_source_covers_half_of_it():
    # 3 target steps over 4 source words and </s>: each step on one of the first two words.
    attention = np.zeros((3, 5))
    attention[0, 0] = attention[1, 1] = attention[2, 1] = 1.0
    found = attention_features(attention)
    assert found["coverage"] == pytest.approx(0.5)
    assert found["attention_entropy"] == pytest.approx(0.0)
    assert found["eos_attention"] == pytest.approx(0.0)


def test_attention_spread_evenly_has_entropy_one_and_some_on_the_end():
    attention = np.full((4, 5), 0.2)
    found = attention_features(attention)
    assert found["attention_entropy"] == pytest.approx(1.0)
    assert found["eos_attention"] == pytest.approx(0.2)
    assert found["coverage"] == pytest.approx(1.0)  # 4 steps x 0.2 = 0.8 on each word


def test_sentence_features_aggregate_tokens_and_ignore_forced_ones():
    tokens = [
        [-0.1, 0.5, 3.0],
        [NAN, 0.2, NAN],  # forced: not among the step's candidates
        [-2.0, 1.5, 0.5],
        [-0.3, 0.4, 50.0],  # margin capped
    ]
    attention = np.full((4, 3), 1 / 3)
    found = sentence_features(hypothesis([5, 6, 7], tokens, attention), [], source_length=4)
    assert set(found) == set(SENTENCE_FEATURES)
    assert found["mean_log_prob"] == pytest.approx((-0.1 - 2.0 - 0.3) / 3)
    assert found["min_log_prob"] == pytest.approx(-2.0)
    assert found["mean_entropy"] == pytest.approx((0.5 + 0.2 + 1.5 + 0.4) / 4)
    assert found["max_entropy"] == pytest.approx(1.5)
    assert found["mean_margin"] == pytest.approx((3.0 + 0.5 + MAX_MARGIN) / 3)
    assert found["min_margin"] == pytest.approx(0.5)
    assert found["length_ratio"] == pytest.approx(4 / 4)
    assert found["agreement"] == 1.0  # greedy: nothing to disagree with


def test_a_forced_first_token_is_left_out():
    tokens = [[0.0, 0.0, NAN], [-1.0, 1.0, 1.0]]
    attention = np.array([[0.0, 1.0], [1.0, 0.0]])
    found = sentence_features(hypothesis([9, 5], tokens, attention), [], 2, skip_first=True)
    assert found["mean_log_prob"] == pytest.approx(-1.0)
    assert found["length_ratio"] == pytest.approx(1 / 2)
    assert found["eos_attention"] == pytest.approx(0.0)


def test_agreement_of_a_beams_hypotheses():
    assert agreement([1, 2, 3], [[1, 2, 3]]) == 1.0
    assert agreement([1, 2, 3], [[4, 5, 6]]) == 0.0
    assert agreement([1, 2, 3, 4], [[1, 2, 3, 4], [1, 2, 9, 9]]) == pytest.approx((1 + 0.5) / 2)


def test_words_are_pieces_grouped_at_word_starts_with_the_product_of_their_probabilities():
    pieces = ["\u2581A", "\u2581dog", "s", ".", "\u2581run"]
    log_probs = np.log([0.9, 0.5, 0.8, 1.0, 0.3])
    words = word_confidences(pieces, log_probs, threshold=0.5)
    assert [w.word for w in words] == ["A", "dogs.", "run"]
    assert [w.confidence for w in words] == pytest.approx([0.9, 0.4, 0.3], abs=1e-4)
    assert [w.doubtful for w in words] == [False, True, True]
    uncalibrated = word_confidences(pieces, log_probs, threshold=None)
    assert [w.doubtful for w in uncalibrated] == [None, None, None]


def test_a_forced_piece_counts_as_certain():
    words = word_confidences(["\u2581hound", "s"], np.array([NAN, math.log(0.5)]), 0.4)
    assert words[0].confidence == pytest.approx(0.5)


def calibration(**changes) -> dict:
    greedy = {
        "features": ["mean_log_prob", "coverage"],
        "mean": [-0.3, 0.7],
        "scale": [0.2, 0.1],
        "weights": [1.5, 0.5],
        "bias": 1.0,
    }
    body = {
        "label": "sentence chrF >= 50 against a reference translation",
        "searches": {"greedy": greedy},
        "word_threshold": 0.4,
        "trained_on": "made up",
        "command": "nmt calibrate --model-dir x",
        "metrics": {"greedy_ece": 0.02},
    }
    body.update(changes)
    return body


def test_the_logistic_regression_is_the_formula_it_says():
    search = SearchCalibration(**calibration()["searches"]["greedy"])
    features = {"mean_log_prob": -0.1, "coverage": 0.5}
    z = 1.0 + 1.5 * (-0.1 + 0.3) / 0.2 + 0.5 * (0.5 - 0.7) / 0.1
    assert search.confidence(features, [5], [6]) == pytest.approx(1 / (1 + math.exp(-z)))


GREEDY = calibration()["searches"]["greedy"]


def test_calibration_file_round_trip(tmp_path: Path):
    assert load_calibration(tmp_path) is None  # a bundle without one: raw scores only
    (tmp_path / CONFIDENCE_FILE).write_text(json.dumps(calibration()))
    loaded = load_calibration(tmp_path)
    again = CalibrationFile.model_validate_json(loaded.model_dump_json())
    assert again == loaded
    assert loaded.searches["greedy"].bias == 1.0


@pytest.mark.parametrize(
    "broken, message",
    [
        ({"format": 3}, "format 3"),
        ({"searches": {"sampling": calibration()["searches"]["greedy"]}}, "searches must be"),
        (
            {
                "searches": {
                    "greedy": {**calibration()["searches"]["greedy"], "features": ["x", "y"]}
                }
            },
            "unknown features",
        ),
        (
            {"searches": {"greedy": {**calibration()["searches"]["greedy"], "weights": [1.0]}}},
            "same length",
        ),
        ({"word_threshold": 2}, "word_threshold"),
    ],
)
def test_a_broken_calibration_file_is_refused_naming_the_file(tmp_path: Path, broken, message):
    (tmp_path / CONFIDENCE_FILE).write_text(json.dumps(calibration(**broken)))
    with pytest.raises(CalibrationError, match=message) as error:
        load_calibration(tmp_path)
    assert CONFIDENCE_FILE in str(error.value)


def test_without_a_calibration_only_the_raw_score_and_word_probabilities():
    features = dict.fromkeys(SENTENCE_FEATURES, 0.0) | {"mean_log_prob": -0.25}
    found = sentence_confidence(
        None, "greedy", features, ["\u2581Hi"], np.array([-0.1]), source_ids=[9, 1], output_ids=[7]
    )
    assert found.sentence is None and found.raw == -0.25
    assert found.words[0].doubtful is None
    calibrated = CalibrationFile.model_validate(calibration())
    found = sentence_confidence(
        calibrated, "greedy", features, ["\u2581Hi"], np.array([-0.1]), source_ids=[9, 1],
        output_ids=[7],
    )  # fmt: skip
    assert 0 < found.sentence < 1 and found.words[0].doubtful is False
    # a calibration for greedy search only says nothing of a beam search
    beam = sentence_confidence(
        calibrated, "beam", features, [], np.array([]), source_ids=[1], output_ids=[]
    )
    assert beam.sentence is None


def test_texts_and_pivots_combine_their_sentences():
    nothing = {"source_ids": [1], "output_ids": []}
    first = sentence_confidence(
        None, "greedy", dict.fromkeys(SENTENCE_FEATURES, -1.0), [], [], **nothing
    )
    first.sentence = 0.8
    second = sentence_confidence(
        None, "greedy", dict.fromkeys(SENTENCE_FEATURES, -0.5), [], [], **nothing
    )
    second.sentence = 0.5
    text = text_confidence([first, second])
    assert text.sentence == pytest.approx(0.65) and text.raw == pytest.approx(-0.75)
    both = through_pivot(first, second)
    assert both.sentence == pytest.approx(0.4) and both.raw == pytest.approx(-1.5)
    second.sentence = None
    assert text_confidence([first, second]).sentence is None


def lexicon_calibration() -> dict:
    """A greedy calibration whose second feature is a lexicon over 4 source and 3 target
    pieces."""
    greedy = {
        "features": ["mean_log_prob", "lexicon"],
        "mean": [-0.3, 0.0],
        "scale": [0.2, 2.0],
        "weights": [1.5, 0.5],
        "bias": 1.0,
        "lexicon": {"bias": 0.5, "source": [0.0, 1.0, -2.0, 0.0], "target": [3.0, 0.0, -1.0]},
    }
    return calibration(format=2, searches={"greedy": greedy})


def test_a_lexicon_adds_the_weights_of_the_distinct_pieces_on_each_side():
    lexicon = Lexicon(bias=0.5, source=[0.0, 1.0, -2.0, 0.0], target=[3.0, 0.0, -1.0])
    # source pieces 1 and 2 (2 twice: counted once), target pieces 0 and 2
    assert lexicon.score([2, 1, 2], [0, 2, 2]) == pytest.approx(0.5 + 1.0 - 2.0 + 3.0 - 1.0)
    assert lexicon.score([], []) == pytest.approx(0.5)
    search = SearchCalibration(**lexicon_calibration()["searches"]["greedy"])
    features = {"mean_log_prob": -0.1}
    z = 1.0 + 1.5 * (-0.1 + 0.3) / 0.2 + 0.5 * (1.5 - 0.0) / 2.0
    assert search.confidence(features, [2, 1, 2], [0, 2, 2]) == pytest.approx(
        1 / (1 + math.exp(-z))
    )
    # a sentence without any weighted piece scores the lexicon's bias
    z = 1.0 + 1.5 * (-0.1 + 0.3) / 0.2 + 0.5 * 0.5 / 2.0
    assert search.confidence(features, [3], [1]) == pytest.approx(1 / (1 + math.exp(-z)))


def test_a_calibration_with_a_lexicon_round_trips_and_format_1_is_still_read(tmp_path: Path):
    (tmp_path / CONFIDENCE_FILE).write_text(json.dumps(lexicon_calibration()))
    loaded = load_calibration(tmp_path, (4, 3))
    assert CalibrationFile.model_validate_json(loaded.model_dump_json()) == loaded
    assert loaded.searches["greedy"].lexicon.target == [3.0, 0.0, -1.0]
    (tmp_path / CONFIDENCE_FILE).write_text(json.dumps(calibration(format=1)))
    assert load_calibration(tmp_path, (4, 3)).searches["greedy"].lexicon is None


def test_a_lexicon_for_another_vocabulary_fails_the_load_saying_why(tmp_path: Path):
    (tmp_path / CONFIDENCE_FILE).write_text(json.dumps(lexicon_calibration()))
    with pytest.raises(CalibrationError, match=r"4 source and 3 target weights.*8000 and 8000"):
        load_calibration(tmp_path, (8000, 8000))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"lexicon": None}, "unknown features \\['lexicon'\\]"),
        ({"features": ["mean_log_prob", "coverage"]}, "without the 'lexicon' feature"),
    ],
)
def test_a_lexicon_and_its_feature_come_together(tmp_path: Path, change, message):
    body = lexicon_calibration()
    body["searches"]["greedy"].update(change)
    (tmp_path / CONFIDENCE_FILE).write_text(json.dumps(body))
    with pytest.raises(CalibrationError, match=message):
        load_calibration(tmp_path)
