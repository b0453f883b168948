"""The committed SentencePiece model: round trips, and no unknown characters."""

from __future__ import annotations

import unicodedata

import pytest

from export.tokenizer import EOS_ID, UNK_ID, Tokenizer
from tests.conftest import COMMITTED_MODEL


@pytest.fixture(scope="module")
def tokenizer(committed_model) -> Tokenizer:
    return Tokenizer(COMMITTED_MODEL / "sentencepiece.model")


@pytest.mark.parametrize(
    "text",
    [
        "Élève à l'école, où l'on mange des crêpes ; « Ça va ? » — oui !",
        "Naïve cœur, façade, Noël, maïs, hôpital, garçon, âgé, août.",
        "Un homme (40 ans) dit : « 3,5 % ? » [sic] {ok} #1 @2 & 100 $ / 20 €",
        "Deux chiens jouent dans l'herbe.",
    ],
)
def test_round_trip_of_accented_french_and_punctuation(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert ids[-1] == EOS_ID
    assert UNK_ID not in ids
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize("text", ["漢字 et 🙂 avec Ω", "ʕ•ᴥ•ʔ", "Ǆemal ŋ ð þ"])
def test_unknown_characters_round_trip_through_bytes(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert UNK_ID not in ids  # byte fallback: a character never seen is spelled as its bytes
    assert tokenizer.decode(ids) == unicodedata.normalize("NFKC", text)


def test_compatibility_characters_are_normalized(tokenizer: Tokenizer) -> None:
    # SentencePiece's NFKC normalization: an ellipsis becomes three dots, a ligature two letters.
    assert tokenizer.decode(tokenizer.encode("Il dit… ﬁn")) == "Il dit... fin"


def test_empty_text_is_just_end_of_sentence(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("") == [EOS_ID]
    assert tokenizer.decode([EOS_ID]) == ""
