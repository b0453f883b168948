"""Finding a glossary's terms in text: case-insensitive, whole words, longest first, the
earliest start winning an overlap (service/serving/terminology.py)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from service.runtime.bundle import load_bundle
from service.runtime.tokenizer import BundleTokenizer
from service.serving.errors import InvalidInput
from service.serving.terminology import Terminology, kept, sentence_terms


def found(entries: list[tuple[str, str]], text: str) -> list[tuple[str, str]]:
    return [(text[m.start : m.end], m.target) for m in Terminology(entries).find(text)]


def test_terms_match_whole_words_in_any_case() -> None:
    entries = [("chien", "hound"), ("chat", "feline")]
    assert found(entries, "Le Chien et le CHAT.") == [("Chien", "hound"), ("CHAT", "feline")]
    assert found(entries, "Les chiens et les chatons.") == []  # not inside a longer word
    assert found(entries, "Un chien-loup.") == [("chien", "hound")]  # a hyphen ends a word


def test_terms_match_whatever_the_unicode_form() -> None:
    """The tokenizer reads text in its compatibility form (NFKC): so does the matching. A
    combining accent belongs to its word, and so does a Devanagari vowel sign."""
    nfc, nfd = "Un café noir.", unicodedata.normalize("NFD", "Un café noir.")
    assert found([("café", "coffee")], nfd) == [(nfd[3:8], "coffee")]
    assert found([(unicodedata.normalize("NFD", "café"), "coffee")], nfc) == [("café", "coffee")]
    assert found([("cafe", "wrong")], nfd) == []  # "café" is not "cafe" + an accent
    assert found([("chien", "hound")], "Un ｃｈｉｅｎ.") == [("ｃｈｉｅｎ", "hound")]
    hindi = "यह किताबें हैं, यह किताब है।"  # "books", then "book"
    assert found([("किताब", "book")], hindi) == [("किताब", "book")]
    assert hindi.index("किताब है") == found_at([("किताब", "book")], hindi)[0]


def found_at(entries: list[tuple[str, str]], text: str) -> list[int]:
    return [m.start for m in Terminology(entries).find(text)]


def test_elided_articles_do_not_hide_a_term() -> None:
    assert found([("herbe", "turf")], "Il court dans l'herbe.") == [("herbe", "turf")]
    assert found([("herbe", "turf")], "Il court dans l’herbe.") == [("herbe", "turf")]


def test_the_longest_term_wins_and_the_earliest_start_takes_an_overlap() -> None:
    entries = [("chapeau", "hat"), ("chapeau rouge", "crimson hat"), ("rouge vif", "scarlet")]
    assert found(entries, "Un chapeau rouge vif.") == [("chapeau rouge", "crimson hat")]
    assert found(entries, "Un chapeau bleu.") == [("chapeau", "hat")]
    assert found(entries, "Du rouge vif.") == [("rouge vif", "scarlet")]


def test_a_term_found_twice_is_asked_for_twice() -> None:
    assert found([("chien", "hound")], "Un chien voit un chien.") == [
        ("chien", "hound"),
        ("chien", "hound"),
    ]


def test_a_large_glossary_is_looked_up_by_first_word() -> None:
    entries = [(f"mot{i}", f"word{i}") for i in range(100_000)] + [("vélo rouge", "red bike")]
    terminology = Terminology(entries)
    assert len(terminology) == 100_001
    text = "Un vélo rouge et le mot99999."
    assert [m.target for m in terminology.find(text)] == ["red bike", "word99999"]


def test_kept_counts_the_targets_a_translation_contains() -> None:
    assert kept("A Hound runs on the turf.", ["hound", "turf", "feline"]) == 2
    # As the tokenizer writes them: in their compatibility form.
    assert kept("A DžLjdog and a dog in.", ["ǅǈ𝔡𝔬𝔤", "dog\u00a0in"]) == 2


@pytest.fixture(scope="module")
def tokenizer(fr_en_bundle: Path) -> BundleTokenizer:
    return BundleTokenizer(load_bundle(fr_en_bundle))


def test_a_target_term_the_tokenizer_drops_is_refused_naming_the_entry(
    tokenizer: BundleTokenizer,
) -> None:
    # Found by fuzzing: such a term reached the search as zero tokens and it raised (a 500).
    # SentencePiece keeps nothing of a zero-width space, a byte-order mark or its own "▁".
    for target in ("\u200b", "\ufeff", "\u2581\u2581"):
        with pytest.raises(InvalidInput) as refused:
            sentence_terms(tokenizer, Terminology([("ville", target)]), "Un chien en ville.")
        assert refused.value.field == "glossary" and "'ville'" in refused.value.reason
    written = sentence_terms(tokenizer, Terminology([("ville", "town")]), "Un chien en ville.")
    assert written is not None and all(written.constraints)


def test_only_the_terms_the_model_reads_are_asked_for(tokenizer: BundleTokenizer) -> None:
    # A zero-width space ending the text is in no piece the model reads (inside the text it
    # is part of the next word's piece): a term there has no source to be written for.
    glossary = Terminology([("\u200b", "nothing"), ("chien", "hound")])
    terms = sentence_terms(tokenizer, glossary, "Un chien en ville \u200b")
    assert terms is not None and terms.targets == ("hound",)
    assert sentence_terms(tokenizer, Terminology([("\u200b", "x")]), "Un chat \u200b") is None
