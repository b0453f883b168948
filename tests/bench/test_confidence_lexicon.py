"""bench.confidence_lexicon: the jackknife's halves and the lexicon's inputs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import sentencepiece

from bench.confidence_lexicon import piece_indicators, split
from tests.conftest import ROOT


def test_the_halves_split_the_training_pairs_without_overlap(tmp_path, monkeypatch, capsys):
    data = tmp_path / "multi30k"
    data.mkdir()
    (data / "train.fr").write_text("".join(f"phrase {i}\n" for i in range(11)))
    (data / "train.en").write_text("".join(f"sentence {i}\n" for i in range(11)))
    for lang in ("fr", "en"):
        (data / f"val.{lang}").write_text("val\n")
    monkeypatch.setenv("NMT_DATA_DIR", str(data))

    split(tmp_path / "jackknife")

    halves = {}
    for half in ("a", "b"):
        folder = tmp_path / "jackknife" / f"data-{half}"
        ids = [int(line) for line in (folder / "train.ids").read_text().split()]
        french = (folder / "train.fr").read_text().splitlines()
        english = (folder / "train.en").read_text().splitlines()
        # each pair stays a pair, in the order of the original lines
        assert french == [f"phrase {i}" for i in ids]
        assert english == [f"sentence {i}" for i in ids]
        assert ids == sorted(ids)
        assert (folder / "val.fr").read_text() == "val\n"
        halves[half] = set(ids)
    assert not halves["a"] & halves["b"]
    assert halves["a"] | halves["b"] == set(range(11))
    assert {len(halves["a"]), len(halves["b"])} == {5, 6}
    # the training commands: one a core, each model trained on its own half
    commands = capsys.readouterr().out.splitlines()
    assert [c.split()[:3] for c in commands] == [["taskset", "-c", "0"], ["taskset", "-c", "1"]]
    assert "--data-dir" in commands[0] and "data-a" in commands[0]
    assert "data-b" in commands[1]


def test_piece_indicators_mark_source_and_translation_pieces_apart():
    tokenizer = sentencepiece.SentencePieceProcessor(
        model_file=str(ROOT / "models" / "fr-en" / "sentencepiece.model")
    )
    vocabulary = tokenizer.get_piece_size()
    first = SimpleNamespace(sources=["un chien un chien"], translations=["a dog"])
    second = SimpleNamespace(sources=["un chat"], translations=["a dog a dog a dog"])

    matrix = piece_indicators([first, second], tokenizer).toarray()

    assert matrix.shape == (2, 2 * vocabulary)
    assert set(np.unique(matrix)) <= {0.0, 1.0}  # held or not, however often
    for row, (source, translation) in enumerate([("un chien", "a dog"), ("un chat", "a dog")]):
        assert set(np.flatnonzero(matrix[row, :vocabulary])) == set(tokenizer.encode(source))
        assert set(np.flatnonzero(matrix[row, vocabulary:])) == set(tokenizer.encode(translation))
