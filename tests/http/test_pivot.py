"""Translating through English: fr -> de with only fr-en and en-de served. The "en-de" model is
mostly the fr-en model served under another pair (only the chaining is tested), so the answer
must be exactly the two models applied one after the other by hand, sentence by sentence; one
test serves a different model with its own tokenizers as en-de."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.runtime.bundle import load_bundle
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from service.serving.pivot import piece_overlap
from service.serving.settings import Settings
from tests.http.in_process import pair_bundle, start

TEXTS = ["Un homme fait du vélo. Il pleut.", "Deux chiens jouent dans la neige.", "", "!!"]


@pytest.fixture(scope="module")
def client(fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("pivot")
    (folder / "fr-en").symlink_to(fr_en_bundle, target_is_directory=True)
    pair_bundle(fr_en_bundle, folder / "en-de", "en", "de")
    client = start(Settings(model_dir=folder, threads=1, warmup=False, cache_entries=0))
    yield client
    client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def translator(fr_en_bundle: Path) -> Translator:
    return Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))


def by_hand(translator: Translator, sentences: list[str], beam: int) -> list[str]:
    options = SearchOptions(beam_size=beam)
    return [t.text for t in translator.translate(sentences, options)]


@pytest.mark.parametrize("beam", [1, 3])
def test_fr_de_equals_the_two_models_chained_by_hand(
    client: TestClient, translator: Translator, beam: int
):
    answer = client.post(
        "/v1/translate",
        json={"text": TEXTS, "source_lang": "fr", "target_lang": "de", "beam_size": beam},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["pivot"] == "en" and body["model"] == "fr-en+en-de"
    # By hand, sentence by sentence (the service splits the first text in two).
    english = by_hand(translator, ["Un homme fait du vélo.", "Il pleut."], beam)
    german = by_hand(translator, english, beam)
    assert body["translations"][0]["text"] == " ".join(german)
    (english,) = by_hand(translator, ["Deux chiens jouent dans la neige."], beam)
    assert body["translations"][1]["text"] == by_hand(translator, [english], beam)[0]
    assert [t["text"] for t in body["translations"][2:]] == ["", "!!"]


def test_the_alignment_through_english_is_the_product_of_the_two(client: TestClient):
    text = "Deux chiens jouent dans la neige."
    through = client.post(
        "/v1/translate",
        json={"text": text, "source_lang": "fr", "target_lang": "de", "return_alignment": True},
    ).json()
    first = client.post(
        "/v1/translate",
        json={"text": text, "source_lang": "fr", "target_lang": "en", "return_alignment": True},
    ).json()
    english = first["translations"][0]["text"]
    second = client.post(
        "/v1/translate",
        json={"text": english, "source_lang": "en", "target_lang": "de", "return_alignment": True},
    ).json()
    (a1,) = first["translations"][0]["alignment"]
    (a2,) = second["translations"][0]["alignment"]
    (composed,) = through["translations"][0]["alignment"]
    assert composed["source_tokens"] == a1["source_tokens"]
    assert composed["target_tokens"] == a2["target_tokens"]
    # One tokenizer on both legs: the English pieces are the same, so the bridge matches
    # piece to piece (and </s> to </s>), by position.
    w1, w2 = np.array(a1["weights"]), np.array(a2["weights"])
    assert a2["source_tokens"][:-1] == a1["target_tokens"][: len(a2["source_tokens"]) - 1]
    bridge = np.zeros((w2.shape[1], w1.shape[0]))
    for i in range(w2.shape[1] - 1):
        bridge[i, i] = 1.0
    bridge[-1, -1] = 1.0  # </s> of the second leg's source: </s> of the first leg's output
    expected = w2 @ bridge @ w1
    assert np.allclose(np.array(composed["weights"]), expected, atol=2e-3)
    # Words and the hard alignment from the composed weights, as for a direct pair.
    assert composed["source_words"] == a1["source_words"]
    assert composed["target_words"] == a2["target_words"]
    assert len(composed["word_alignment"]) == len(composed["target_words"])


def test_a_sentence_the_first_leg_leaves_empty_has_an_empty_alignment(client: TestClient):
    """With no length penalty, beam 2 ranks ending at once (-8.2) above this sentence's
    translation (-12.4): the English is "", which the second leg has no sentence of; its
    alignment through the pivot is empty, not a failure."""
    text = "Une fille regarde la mer dans la neige avec une voiture grande et 59314 ballons."
    options = {"beam_size": 2, "length_penalty": 0.0, "return_alignment": True}
    first = client.post(
        "/v1/translate", json={"text": text, "source_lang": "fr", "target_lang": "en", **options}
    )
    assert first.status_code == 200 and first.json()["translations"][0]["text"] == ""
    through = client.post(
        "/v1/translate", json={"text": text, "source_lang": "fr", "target_lang": "de", **options}
    )
    assert through.status_code == 200, through.text
    (translation,) = through.json()["translations"]
    assert translation["text"] == ""
    (alignment,) = translation["alignment"]
    assert alignment["target_tokens"] == [] and alignment["weights"] == []


def test_pieces_of_two_tokenizers_are_bridged_by_shared_characters():
    # "▁chiens" vs "▁chi" "ens": two cuts of one text.
    overlap = piece_overlap(["▁chi", "ens", "▁noirs", "</s>"], ["▁chiens", "▁noir", "s", "</s>"])
    expected = [[1, 0, 0, 0], [1, 0, 0, 0], [0, 0.8, 0.2, 0], [0, 0, 0, 1]]
    assert np.allclose(overlap, expected)
    # A lone word-start mark (SentencePiece cuts "▁snow" as "▁" "snow" when "▁s..." is rare)
    # belongs to the word it starts: no attention is lost on it.
    overlap = piece_overlap(["▁", "s", "now", "</s>"], ["▁snow", "</s>"])
    assert np.allclose(overlap, [[1, 0], [1, 0], [1, 0], [0, 1]])


def test_pivot_pairs_are_listed_and_refused_pairs_name_them(client: TestClient):
    listed = client.get("/languages").json()
    languages = {entry["code"]: entry["targets"] for entry in listed}
    assert languages == {"fr": ["de", "en"], "en": ["de"]}
    # The pair only a pivot translates says which language it goes through.
    assert {entry["code"]: entry.get("pivot") for entry in listed} == {
        "fr": {"de": "en"},
        "en": None,
    }
    unknown = client.post(
        "/v1/translate", json={"text": "x", "source_lang": "de", "target_lang": "fr"}
    )
    assert unknown.status_code == 404
    assert "supported pairs: en-de, fr-de, fr-en" in unknown.json()["detail"]


def test_libretranslate_and_markup_go_through_the_pivot_too(
    client: TestClient, translator: Translator
):
    plain = client.post("/translate", json={"q": "Il pleut.", "source": "fr", "target": "de"})
    assert plain.status_code == 200
    expected = by_hand(translator, by_hand(translator, ["Il pleut."], 4), 4)[0]
    assert plain.json()["translatedText"] == expected
    html = client.post(
        "/translate",
        json={"q": "Un <b>chien</b> court.", "source": "fr", "target": "de", "format": "html"},
    )
    assert html.status_code == 200, html.text
    assert html.json()["translatedText"].count("<b>") == 1


def test_a_glossary_cannot_be_applied_through_a_pivot(client: TestClient):
    answer = client.post(
        "/v1/translate",
        json={
            "text": "Un chien.",
            "source_lang": "fr",
            "target_lang": "de",
            "glossary": [{"source": "chien", "target": "Hund"}],
        },
    )
    assert answer.status_code == 422
    assert "goes through en" in answer.text


def test_a_second_leg_with_its_own_model_and_tokenizers_is_chained_as_by_hand(
    fr_en_bundle: Path, translator: Translator, tmp_path_factory: pytest.TempPathFactory
):
    """The en-de leg a different model: a random-weight Marian with a vocabulary per side
    (tests/export/hf_families.py, imported by nmt import-hf), served as en-de. Its answers are
    noise, but through the pivot they must be exactly what it gives the first leg's English,
    and the alignment must bridge two tokenizers' cuts of the same English."""
    pytest.importorskip("transformers", reason="needs the bench extra")
    from tests.export.hf_families import bundle_dir

    second = bundle_dir("marian-separate", tmp_path_factory.getbasetemp() / "hf-families")
    folder = tmp_path_factory.mktemp("pivot-two-models")
    (folder / "fr-en").symlink_to(fr_en_bundle, target_is_directory=True)
    pair_bundle(second, folder / "en-de", "en", "de")
    second_translator = Translator(load_bundle(folder / "en-de"), EngineOptions(intra_op_threads=1))
    text = "Deux chiens jouent dans la neige."
    # Random weights repeat themselves: the server's repetition stop off, as by hand.
    settings = Settings(model_dir=folder, threads=1, warmup=False, cache_entries=0, max_repeats=0)
    client = start(settings)
    try:
        answer = client.post(
            "/v1/translate",
            json={"text": text, "source_lang": "fr", "target_lang": "de", "beam_size": 2,
                  "return_alignment": True},
        )  # fmt: skip
        first = client.post(
            "/v1/translate",
            json={"text": text, "source_lang": "fr", "target_lang": "en", "beam_size": 2,
                  "return_alignment": True},
        ).json()  # fmt: skip
    finally:
        client.__exit__(None, None, None)
    assert answer.status_code == 200, answer.text
    (english,) = by_hand(translator, [text], 2)
    (german,) = by_hand(second_translator, [english], 2)
    (translation,) = answer.json()["translations"]
    assert translation["text"] == german
    (composed,) = translation["alignment"]
    (a1,) = first["translations"][0]["alignment"]
    assert composed["source_tokens"] == a1["source_tokens"]
    weights = np.array(composed["weights"])  # [German pieces, French pieces]
    assert weights.shape == (len(composed["target_tokens"]), len(a1["source_tokens"]))
    # Each German piece's attention is carried to the French pieces whole: the bridge between
    # the two English tokenizations loses none of it (weights come rounded to 3 decimals).
    assert np.allclose(weights.sum(axis=1), 1.0, atol=0.01)
