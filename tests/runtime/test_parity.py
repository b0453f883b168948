"""Slow: the engine against the torch reference on all of test_2016_flickr (issue bars)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.parity import parity, produce_outputs
from export.data import read_lines

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(multi30k: Path, committed_model: Path, fr_en_bundle: Path) -> dict:
    sources = read_lines(multi30k / "test_2016_flickr.fr")
    references = read_lines(multi30k / "test_2016_flickr.en")
    return parity(produce_outputs(committed_model, fr_en_bundle, sources), references)


def comparison(result: dict, name: str):
    return next(c for c in result["comparisons"] if c.name == name)


@pytest.mark.parametrize("name", ["engine = torch, greedy", "engine = torch, beam 4"])
def test_engine_equals_torch_on_99_percent_of_lines(result: dict, name: str) -> None:
    found = comparison(result, name)
    assert found.share >= 0.99, f"{found.equal}/{found.total}: {found.differences[:5]}"


@pytest.mark.parametrize("mode", ["greedy", "beam4"])
def test_bleu_of_engine_and_torch_within_a_tenth(result: dict, mode: str) -> None:
    scores = result["scores"]
    assert abs(scores[f"torch {mode}"]["bleu"] - scores[f"onnx {mode} b32"]["bleu"]) <= 0.1


@pytest.mark.parametrize("name", ["batch 1 = batch 32, greedy", "batch 1 = batch 32, beam 4"])
def test_batch_invariance(result: dict, name: str) -> None:
    found = comparison(result, name)
    assert found.share >= 0.995, f"{found.equal}/{found.total}: {found.differences[:5]}"


@pytest.mark.parametrize("mode", ["greedy", "beam4"])
def test_int8_loses_at_most_one_bleu(result: dict, mode: str) -> None:
    scores = result["scores"]
    assert scores[f"onnx {mode} b32"]["bleu"] - scores[f"onnx-int8 {mode} b32"]["bleu"] <= 1.0
