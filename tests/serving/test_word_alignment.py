"""Word-level alignment from subword cross-attention, checked against a plain, loop-by-loop
reading of its definition, and through the API on a real sentence."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.serving.settings import Settings
from service.serving.word_alignment import word_alignment
from tests.http.in_process import start


def reference(source: list[str], target: list[str], weights: list[list[float]]):
    """The definition, written the slow way: words start at "▁", </s> is no word."""

    def words(pieces: list[str]) -> list[list[int]]:
        grouped: list[list[int]] = []
        for index, piece in enumerate(pieces):
            if piece == "</s>":
                continue
            if piece.startswith("▁") or not grouped:
                grouped.append([index])
            else:
                grouped[-1].append(index)
        return grouped

    source_words, target_words = words(source), words(target)
    table = []
    for t_pieces in target_words:
        row = []
        for s_pieces in source_words:
            sums = [sum(weights[t][s] for s in s_pieces) for t in t_pieces]
            row.append(sum(sums) / len(sums))
        table.append(row)
    best = [max(range(len(row)), key=lambda j: row[j]) for row in table]
    return source_words, target_words, table, best


@pytest.mark.parametrize("seed", range(25))
def test_word_weights_and_hard_alignment_follow_the_definition(seed: int):
    rng = random.Random(seed)

    def pieces(count: int) -> list[str]:
        made = [
            ("▁" if rng.random() < 0.6 or i == 0 else "") + rng.choice("abcdef")
            for i in range(count)
        ]
        return [*made, "</s>"]

    source, target = pieces(rng.randint(1, 9)), pieces(rng.randint(1, 9))
    weights = np.random.default_rng(seed).dirichlet(np.ones(len(source)), size=len(target))
    found = word_alignment(source, target, weights, decimals=9)
    source_words, target_words, table, best = reference(source, target, weights.tolist())
    assert found.source_words == [
        "".join(source[i] for i in w).replace("▁", "") for w in source_words
    ]
    assert found.target_words == [
        "".join(target[i] for i in w).replace("▁", "") for w in target_words
    ]
    assert np.allclose(found.weights, table, atol=1e-8)
    assert [s for s, _ in found.pairs] == best
    assert [t for _, t in found.pairs] == list(range(len(target_words)))
    assert found.moses == " ".join(f"{s}-{t}" for t, s in enumerate(best))


@pytest.fixture(scope="module")
def client(fr_en_bundle: Path) -> Iterator[TestClient]:
    client = start(Settings(model_dir=fr_en_bundle, threads=1, cache_entries=0))
    yield client
    client.__exit__(None, None, None)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_api_returns_words_and_a_hard_alignment_for_each_sentence(
    client: TestClient, beam_size: int
):
    body = {
        "text": "Un chien noir court. Il pleut.",
        "source_lang": "fr",
        "target_lang": "en",
        "beam_size": beam_size,
        "return_alignment": True,
    }
    (translation,) = client.post("/v1/translate", json=body).json()["translations"]
    first, second = translation["alignment"]
    assert first["source_words"] == ["Un", "chien", "noir", "court."]
    assert " ".join(first["target_words"]) == translation["text"].split(". ")[0] + "."
    assert len(first["word_weights"]) == len(first["target_words"])
    for row in first["word_weights"]:
        assert len(row) == len(first["source_words"]) and sum(row) <= 1.001
    assert [t for _, t in first["word_alignment"]] == list(range(len(first["target_words"])))
    # "dog" attends to "chien" most: the hard alignment a reader would draw.
    dog = first["target_words"].index("dog")
    assert first["source_words"][dict((t, s) for s, t in first["word_alignment"])[dog]] == "chien"
    assert second["moses"]
