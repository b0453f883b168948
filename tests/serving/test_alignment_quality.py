"""The alignment quality check itself: the gold file is well formed, the alignment error rate
is computed right (on examples worked out by hand), the baselines behave as their models say,
and the forced decoding the benchmark reads attention from gives the weights the service
returns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from bench.alignment_quality import (
    GOLD,
    Counts,
    LexicalAligner,
    aer,
    corpus_aer,
    diagonal_alignment,
    encode_target,
    load_gold,
    shifted,
)
from service.serving.word_alignment import END, group_words
from tests.conftest import ROOT, multi30k_path

GOLD_FILE = ROOT / GOLD


# ----------------------------------------------------------------------------- the gold file


def test_the_gold_file_is_well_formed():
    records = [json.loads(line) for line in GOLD_FILE.read_text(encoding="utf-8").splitlines()]
    assert len(records) >= 60
    assert len({r["id"] for r in records}) == len(records)
    styles = {r["style"] for r in records}
    assert len(styles) >= 4 and "caption" in styles
    assert len({" ".join(r["source_words"]) for r in records}) == len(records)
    for r in records:
        assert set(r) == {"id", "style", "source_words", "target_words", "sure", "possible"}
        n, m = len(r["source_words"]), len(r["target_words"])
        assert n and m, r["id"]
        assert all(w and " " not in w for w in r["source_words"] + r["target_words"]), r["id"]
        sure = [tuple(link) for link in r["sure"]]
        possible = [tuple(link) for link in r["possible"]]
        assert sure, f"{r['id']} has no sure link"
        for s, t in sure + possible:
            assert 0 <= s < n and 0 <= t < m, f"{r['id']}: link {s}-{t} out of range"
        assert len(set(sure)) == len(sure) and len(set(possible)) == len(possible), r["id"]
        assert not set(sure) & set(possible), f"{r['id']}: a link is both sure and possible"
    assert sum(len(r["possible"]) for r in records) >= len(records)  # possible links are used


def test_gold_words_are_the_words_the_service_shows():
    """The service merges SentencePiece pieces into words; the gold words must be the same."""
    processor = spm.SentencePieceProcessor(
        model_file=str(ROOT / "models/fr-en/sentencepiece.model")
    )
    for pair in load_gold(GOLD_FILE):
        for words in (pair.source_words, pair.target_words):
            pieces = [*processor.encode(" ".join(words), out_type=str), END]
            assert group_words(pieces)[0] == words, pair.id


def test_gold_sentences_are_our_own_not_corpus_lines():
    data = multi30k_path()
    if not (data / "train.fr").is_file():
        pytest.skip(f"Multi30k not found at {data} (set NMT_DATA_DIR to its folder)")
    corpus = set()
    for file in data.glob("*.fr"):
        corpus |= {line.strip() for line in file.read_text(encoding="utf-8").splitlines()}
    copied = [p.id for p in load_gold(GOLD_FILE) if p.source in corpus]
    assert not copied, f"gold sentences found verbatim in Multi30k: {copied}"


def test_load_gold_makes_possible_include_sure(tmp_path: Path):
    line = {
        "id": "x", "style": "t", "source_words": ["a", "b"], "target_words": ["c"],
        "sure": [[0, 0]], "possible": [[1, 0]],
    }  # fmt: skip
    (tmp_path / "g.jsonl").write_text(json.dumps(line) + "\n")
    (pair,) = load_gold(tmp_path / "g.jsonl")
    assert pair.sure == {(0, 0)} and pair.possible == {(0, 0), (1, 0)}


# ----------------------------------------------------------------------------- the metric


def test_aer_on_examples_worked_out_by_hand():
    sure = {(0, 0), (1, 1)}
    possible = sure | {(2, 1)}
    # Perfect: A = S.  1 - (2 + 2) / (2 + 2) = 0
    assert aer(sure, sure, possible) == 0.0
    # A = P: the possible link costs nothing.  1 - (2 + 3) / (3 + 2) = 0
    assert aer(possible, sure, possible) == 0.0
    # Nothing found.  1 - 0 / (0 + 2) = 1
    assert aer(set(), sure, possible) == 1.0
    # A = {0-0, 2-1, 2-2}: A∩S = {0-0}, A∩P = {0-0, 2-1}.  1 - (1 + 2) / (3 + 2) = 0.4
    assert aer({(0, 0), (2, 1), (2, 2)}, sure, possible) == pytest.approx(0.4)
    # A = {1-0}: wrong only.  1 - 0 / (1 + 2) = 1
    assert aer({(1, 0)}, sure, possible) == 1.0
    # A = {0-0}: half the sure links.  1 - (1 + 1) / (1 + 2) = 1/3
    assert aer({(0, 0)}, sure, possible) == pytest.approx(1 / 3)


def test_corpus_aer_sums_counts_over_sentences_instead_of_averaging():
    one = load_pair(sure={(0, 0)}, possible=set())
    two = load_pair(sure={(0, 0), (1, 1), (2, 2)}, possible={(2, 1)})
    counts = corpus_aer([{(0, 0)}, {(0, 0), (2, 1)}], [one, two])
    # |A| = 1 + 2, |S| = 1 + 3, |A∩S| = 1 + 1, |A∩P| = 1 + 2:  1 - (2 + 3) / (3 + 4) = 2/7
    assert counts == Counts(found=3, sure=4, found_sure=2, found_possible=3)
    assert counts.aer == pytest.approx(2 / 7)
    assert counts.precision == pytest.approx(3 / 3) and counts.recall == pytest.approx(2 / 4)
    # The mean of the two sentence AERs (0 and 1 - 3/5) would be 0.2, not 2/7.
    assert counts.aer != pytest.approx(0.2)


def load_pair(sure: set, possible: set):
    from bench.alignment_quality import GoldPair

    return GoldPair("x", "t", ["s"] * 3, ["t"] * 3, frozenset(sure), frozenset(sure | possible))


# ----------------------------------------------------------------------------- baselines


def test_the_diagonal_pairs_relative_positions():
    assert diagonal_alignment(3, 3) == {(0, 0), (1, 1), (2, 2)}
    assert diagonal_alignment(2, 4) == {(0, 0), (0, 1), (1, 2), (1, 3)}
    assert diagonal_alignment(4, 2) == {(1, 0), (3, 1)}


def pairs(*lines: str) -> list[tuple[list[str], list[str]]]:
    """ "la maison | the house" -> (["la", "maison"], ["the", "house"])"""
    return [tuple(side.split() for side in line.split("|")) for line in lines]


def test_ibm_model_1_learns_word_translations_from_co_occurrence():
    corpus = pairs(
        "la maison | the house",
        "la fleur | the flower",
        "une maison bleue | a blue house",
        "une fleur | a flower",
        "la maison bleue | the blue house",
    )
    aligner = LexicalAligner(tension=0.0)
    aligner.train(corpus, iterations=10)
    assert aligner.align(*corpus[4]) == {(0, 0), (2, 1), (1, 2)}
    assert aligner.align(*corpus[3]) == {(0, 0), (1, 1)}


def test_the_diagonal_prior_breaks_ties_between_repeated_words():
    corpus = pairs("le chat et le chien | the cat and the dog") * 3
    ibm1, diagonal = LexicalAligner(tension=0.0), LexicalAligner(tension=4.0)
    ibm1.train(corpus)
    diagonal.train(corpus)
    # Both "the"s go to the first "le" under IBM 1 (a tie, broken by position 0) ...
    assert {s for s, t in ibm1.align(*corpus[0]) if t == 3} == {0}
    # ... and to the nearby "le" with fast_align's prior.
    assert diagonal.align(*corpus[0]) == {(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)}


def test_shifted_reads_the_next_step():
    weights = np.arange(6.0).reshape(3, 2)
    assert shifted(weights).tolist() == [[2, 3], [4, 5], [4, 5]]


# ----------------------------------------------------------------------------- forced decoding


def test_forced_decoding_gives_the_weights_the_service_returns(
    committed_model: Path, fr_en_bundle: Path
):
    """The benchmark reads attention from the torch model, teacher-forced with a given English
    sentence; the service returns the ONNX graphs' weights of its own translation. Forced with
    that same translation, the torch model's last layer (mean of heads) must give the service's
    weights: both then measure the same thing."""
    pytest.importorskip("torch")
    from bench.alignment_quality import cross_attention
    from export.checkpoint import load_model_dir
    from service.runtime.bundle import load_bundle
    from service.runtime.search import SearchOptions
    from service.runtime.sessions import EngineOptions
    from service.runtime.translator import Translator

    model, tokenizer = load_model_dir(committed_model)
    translator = Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))
    options = SearchOptions(beam_size=1, alignment=True)
    sentences = ["Un chien noir court dans la neige.", "Deux femmes discutent devant un café."]
    for sentence, found in zip(sentences, translator.translate(sentences, options), strict=True):
        hypothesis = found.hypotheses[0]
        served = np.asarray(hypothesis.alignment)  # [produced tokens (</s> included), source]
        target_ids = hypothesis.tokens
        weights = cross_attention(model, tokenizer.encode(sentence), target_ids)
        layers, heads = model.config.decoder_layers, model.config.n_heads
        assert weights.shape == (
            layers,
            heads,
            len(target_ids) + 1,
            len(tokenizer.encode(sentence)),
        )
        assert np.allclose(weights.sum(-1), 1.0, atol=1e-5)
        assert served.shape == weights.shape[2:]
        assert np.allclose(weights[-1].mean(0), served, atol=2e-3)


def test_target_encoding_gives_the_pieces_the_service_merges(committed_model: Path):
    pytest.importorskip("torch")
    from export.checkpoint import load_tokenizer

    tokenizer = load_tokenizer(committed_model)
    ids, pieces = encode_target(tokenizer, "A man's bicycle.")
    assert tokenizer.decode(ids) == "A man's bicycle."
    assert group_words([*pieces, END])[0] == ["A", "man's", "bicycle."]
