"""bench/terminology.py: its helpers on made-up words and alignments, the committed test set's
shape, and its measures computed on a few lines with the committed model (a benchmark: the
numbers are not held to the issue's targets, only taken and reported)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.terminology import (
    SPLITS,
    Quality,
    SetLine,
    build_set,
    linked_words,
    main,
    measure_quality,
    measure_speed,
    plain_word,
    read_set,
    read_terms,
    replace_linked,
    rest_chrf,
    source_words_of,
    still_there,
    without_terms,
    write_set,
)
from service.runtime.bundle import load_bundle
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from service.serving.terminology import Terminology
from service.serving.word_alignment import WordAlignment

ROOT = Path(__file__).resolve().parents[2]
SET_DIR = ROOT / "tests" / "data" / "terminology"


# The helpers.


def test_the_first_linked_word_becomes_the_term_and_the_others_go() -> None:
    words = ["A", "dog", "runs", "on", "the", "beach."]
    replaced = replace_linked(words, [([1], "canine"), ([4, 5], "seashore")])
    assert replaced == "A canine runs on seashore."


def test_a_replaced_word_keeps_its_capital_and_its_punctuation() -> None:
    assert replace_linked(["Dogs", "run."], [([0], "canine")]) == "Canine run."
    assert replace_linked(["Two", "dogs,", "running."], [([1], "canine")]) == "Two canine, running."
    # a deleted word's punctuation stays, on the word before it
    assert replace_linked(["A", "little", "girl."], [([1, 2], "young lass")]) == "A young lass."


def test_a_term_with_no_linked_word_is_missing_and_nothing_changes() -> None:
    assert replace_linked(["A", "man", "walks."], [([], "gentleman")]) == "A man walks."


def test_target_terms_are_cut_out_case_insensitively() -> None:
    assert (
        without_terms("A Canine runs on the seashore.", ["canine", "seashore"]) == "A runs on the ."
    )
    assert without_terms("A ball cap.", ["ball cap"]) == "A ."


def test_the_words_linked_to_a_terms_source_tokens() -> None:
    # Source tokens: ▁Un ▁chien ▁cour t . </s>; words Un, chien, court.
    pieces = ["▁Un", "▁chien", "▁cour", "t", ".", "</s>"]
    assert source_words_of(pieces, (1, 2)) == {1}
    assert source_words_of(pieces, (2, 4)) == {2}
    assert source_words_of(pieces, (5, 6)) == set()  # </s> is no word
    alignment = WordAlignment(
        source_words=["Un", "chien", "court."],
        target_words=["A", "dog", "runs,", "dog."],
        weights=[[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.0, 0.1, 0.9], [0.1, 0.6, 0.3]],
        pairs=[(0, 0), (1, 1), (2, 2), (1, 3)],
    )
    assert linked_words(alignment, {1}) == [1, 3]
    assert linked_words(alignment, set()) == []
    # the plain word for the term: the linked word attending to it most, bare and casefolded
    assert plain_word(alignment, {1}, [1, 3]) == "dog"
    assert plain_word(alignment, {2}, [2]) == "runs"
    assert plain_word(alignment, {1}, []) == ""


def test_the_plain_word_is_left_when_it_is_as_frequent_as_in_the_plain_translation() -> None:
    plain = "A dog and a Dog."
    assert still_there("dog", plain, "A canine dog and a dog.")
    assert not still_there("dog", plain, "A canine and a dog.")
    assert not still_there("", plain, plain)


def test_rest_chrf_is_100_when_only_the_term_changed() -> None:
    score = rest_chrf(["A canine runs in the park."], [["canine"]], ["A runs in the park."])
    assert score == pytest.approx(100.0)
    assert rest_chrf(["A canine sprints away."], [["canine"]], ["A runs in the park."]) < 50


def test_the_set_file_round_trips(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "test_2016_flickr.fr").write_text("Un chien.\nUne femme.\n")
    lines = [SetLine("test_2016_flickr", 2, "control"), SetLine("test_2016_flickr", 1, "term")]
    write_set(tmp_path / "sentences.tsv", lines)
    found = read_set(tmp_path / "sentences.tsv", data)
    assert [(x.id, x.kind, x.text) for x in found] == [
        ("test_2016_flickr:2", "control", "Une femme."),
        ("test_2016_flickr:1", "term", "Un chien."),
    ]


# The committed test set.


def test_the_committed_glossary_has_single_and_multi_word_terms() -> None:
    terms = read_terms(SET_DIR / "terms.tsv")
    assert len(terms) >= 15
    sources = [source for source, _ in terms]
    assert len(set(sources)) == len(sources)
    assert sum(" " in source for source in sources) >= 3
    assert all(source and target for source, target in terms)
    assert set(terms) <= set(read_terms(SET_DIR / "candidates.tsv"))


def test_the_committed_lines_are_numbers_with_as_many_controls_as_term_lines() -> None:
    rows = [line.split("\t") for line in (SET_DIR / "sentences.tsv").read_text().splitlines()]
    assert rows[0] == ["split", "line", "kind"]
    body = rows[1:]
    assert all(len(row) == 3 and row[0] in SPLITS and row[1].isdigit() for row in body)
    assert len({(row[0], row[1]) for row in body}) == len(body)
    kinds = [row[2] for row in body]
    assert kinds.count("control") == kinds.count("term") >= 100
    assert set(kinds) == {"term", "control"}


def test_term_lines_hold_a_term_and_controls_none(multi30k: Path) -> None:
    terminology = Terminology(read_terms(SET_DIR / "terms.tsv"))
    for line in read_set(SET_DIR / "sentences.tsv", multi30k):
        assert bool(terminology.find(line.text)) == (line.kind == "term"), line.id


# The measures, on a few lines with the committed model.


@pytest.fixture(scope="module")
def few_lines(multi30k: Path) -> list[SetLine]:
    """The set's first 8 term lines and 24 controls (a speed batch's worth), and its first
    line with veste -> blazer (a one-token target)."""
    lines = read_set(SET_DIR / "sentences.tsv", multi30k)
    terms = [x for x in lines if x.kind == "term"]
    blazer = next(x for x in terms if Terminology([("veste", "blazer")]).find(x.text))
    return [*terms[:7], blazer, *[x for x in lines if x.kind == "control"][:24]]


@pytest.fixture(scope="module")
def translator(fr_en_bundle: Path) -> Translator:
    return Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))


@pytest.fixture(scope="module")
def quality(translator: Translator, few_lines: list[SetLine]) -> Quality:
    terminology = Terminology(read_terms(SET_DIR / "terms.tsv"))
    return measure_quality(translator, terminology, few_lines, "fp32")


def test_a_known_term_is_kept_by_both_methods(quality: Quality) -> None:
    blazer = next(s for s in quality.sentences if "blazer" in s.terms.targets)
    assert "blazer" in blazer.constrained.casefold()
    assert "blazer" in blazer.replaced.casefold()
    assert "blazer" not in blazer.plain.casefold()


def test_every_measure_is_taken(quality: Quality) -> None:
    assert len(quality.sentences) == 8 and quality.controls == 24
    assert quality.pairs >= 8
    assert quality.batches == 1 and quality.mixed_batches == 1
    for method in ("constrained", "replaced"):
        assert 0 < quality.kept(method) <= quality.pairs
        assert 0 <= quality.left(method) <= quality.pairs
        assert 0 <= quality.run_on(method) <= len(quality.sentences)
        assert 0 < quality.rest_chrf(method) <= 100
        assert 0 < quality.whole_chrf(method) <= 100
    for s in quality.sentences:
        assert s.plain and s.constrained and s.replaced
        assert len(s.plain_words) == len(s.terms.targets)


def test_controls_come_out_identical_in_fp32(quality: Quality) -> None:
    """The constrained rows share the controls' batch; fp32 rows do not depend on their
    batch mates, so nothing may change (int8's dynamic quantization scales are per batch)."""
    assert quality.controls_same == quality.controls
    assert quality.controls_alone_same == quality.controls


def test_speed_is_timed_with_and_without_terms(
    translator: Translator, few_lines: list[SetLine]
) -> None:
    terminology = Terminology(read_terms(SET_DIR / "terms.tsv"))
    speed = measure_speed(translator, terminology, few_lines, "fp32", batches=1, repeats=2)
    assert speed.batches == 1
    assert len(speed.plain) == len(speed.constrained) == 2
    assert all(value > 0 for value in [*speed.plain, *speed.constrained])


def test_the_script_writes_its_section(fr_en_bundle: Path, tmp_path: Path, multi30k: Path) -> None:
    out = tmp_path / "benchmarks.md"
    out.write_text("# Before\n\n<!-- terminology:start -->\nstale text\n<!-- terminology:end -->\n")
    arguments = ["--bundle", str(fr_en_bundle), "--data", str(multi30k), "--out", str(out)]
    main([*arguments, "--lines", "3", "--speed-batches", "0"])
    text = out.read_text()
    assert text.startswith("# Before") and "stale text" not in text
    for name in ("terms kept, constrained decoding", "controls identical"):
        row = re.search(rf"^\| {name} \| ([0-9.]+)% \(\d+/\d+\) \| ([0-9.]+)% ", text, re.M)
        assert row, name
    assert re.search(
        r"^\| chrF of the rest, replacement by alignment \| [0-9.]+ \| [0-9.]+ \|$", text, re.M
    )
    assert "| test_2016_flickr:" in text  # an example


def test_building_the_set_keeps_only_terms_the_model_does_not_write(
    fr_en_bundle: Path, tmp_path: Path
) -> None:
    """On a corpus of two made-up lines: "chien -> dog" is what the model writes (dropped;
    its second choice takes its place), "chat -> feline" is in no line (dropped)."""
    data = tmp_path / "data"
    data.mkdir()
    for split in SPLITS:
        (data / f"{split}.fr").write_text("Un chien court.\nUne femme marche.\n")
    candidates = [("chien", "dog"), ("chien", "canine"), ("chat", "feline")]
    built = build_set(candidates, data, fr_en_bundle, threads=1, min_controls=1)
    assert built.terms == [("chien", "canine")]
    assert [(source, target) for source, target, _ in built.dropped] == [
        ("chien", "dog"),
        ("chat", "feline"),
    ]
    expected = [(split, n, kind) for split in SPLITS for n, kind in ((1, "term"), (2, "control"))]
    assert [(x.split, x.line, x.kind) for x in built.lines] == expected
