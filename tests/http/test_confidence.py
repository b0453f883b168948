"""return_confidence: the native API's confidence object, the dialects' extension field, the
metric, and a bundle without a calibration."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from nmt_contract import CONFIDENCE_FILE
from service.runtime.search import SearchOptions
from service.runtime.translator import Translator
from service.serving.settings import Settings
from tests.http.in_process import start

SENTENCES = ["Deux chiens jouent dans la neige.", "Un homme en chemise bleue est assis."]


@pytest.fixture(scope="module")
def model_dir(fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed model (calibrated: models/fr-en/confidence.json, copied by the export),
    and the same model without its calibration, as en-fr... served under another name."""
    folder = tmp_path_factory.mktemp("models")
    (folder / "fr-en").symlink_to(fr_en_bundle, target_is_directory=True)
    bare = folder / "bare" / "fr-de"
    bare.mkdir(parents=True)
    for file in fr_en_bundle.iterdir():
        if file.name not in ("bundle.json", CONFIDENCE_FILE):
            (bare / file.name).symlink_to(file)
    manifest = json.loads((fr_en_bundle / "bundle.json").read_text())
    manifest.update(name="fr-de", target_lang="de")
    (bare / "bundle.json").write_text(json.dumps(manifest))
    (folder / "fr-de").symlink_to(bare, target_is_directory=True)
    return folder


@pytest.fixture(scope="module")
def client(model_dir: Path) -> Iterator[TestClient]:
    client = start(Settings(model_dir=model_dir, threads=1, cache_entries=0))
    yield client
    client.__exit__(None, None, None)


def native(client: TestClient, text, target: str = "en", **fields) -> dict:
    response = client.post(
        "/v1/translate",
        json={"text": text, "source_lang": "fr", "target_lang": target, **fields},
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_confidence_is_there_when_asked_and_changes_no_translation(
    client: TestClient, translator: Translator
):
    plain = native(client, SENTENCES, beam_size=1)
    asked = native(client, SENTENCES, beam_size=1, return_confidence=True)
    assert "confidence" not in plain["translations"][0]
    assert [t["text"] for t in asked["translations"]] == [t["text"] for t in plain["translations"]]
    hypotheses = translator.translate_ids(
        translator.tokenizer.encode(SENTENCES, "fr"), SearchOptions(beam_size=1)
    )
    for translation, (best,) in zip(asked["translations"], hypotheses, strict=True):
        confidence = translation["confidence"]
        assert 0.0 <= confidence["sentence"] <= 1.0
        assert confidence["label"].startswith("sentence chrF >= ")
        # raw: the mean log-prob of the produced tokens, </s> included
        assert confidence["raw"] == pytest.approx(best.log_prob / (len(best.tokens) + 1), abs=1e-3)
        words = confidence["words"]
        assert [w["word"] for w in words] == translation["text"].split()
        assert all(0.0 < w["confidence"] <= 1.0 and isinstance(w["doubtful"], bool) for w in words)
        # a word's probability is the product of its pieces': at least the sentence's
        assert np.prod([w["confidence"] for w in words]) >= np.exp(best.log_prob) * 0.99


def test_a_text_of_several_sentences_has_their_mean_and_all_their_words(client: TestClient):
    each = native(client, SENTENCES, return_confidence=True)["translations"]
    joined = native(client, " ".join(SENTENCES), return_confidence=True)["translations"][0]
    mean = np.mean([t["confidence"]["sentence"] for t in each])
    assert joined["confidence"]["sentence"] == pytest.approx(mean, abs=1e-3)
    assert len(joined["confidence"]["words"]) == sum(len(t["confidence"]["words"]) for t in each)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_translation_the_length_limit_cut_has_confidence_zero(client: TestClient, beam_size):
    """ "A man in" for a sentence of fifteen words is not its translation, however sure the
    decoder was of those three (before: 0.9)."""
    long = "Un homme en chemise bleue est assis sur une chaise devant une maison rouge."
    cut = native(client, long, max_length=3, beam_size=beam_size, return_confidence=True)
    cut_confidence = cut["translations"][0]["confidence"]
    assert len(cut["translations"][0]["text"].split()) <= 3
    assert cut_confidence["truncated"] is True and cut_confidence["sentence"] == 0.0
    whole = native(client, long, beam_size=beam_size, return_confidence=True)
    assert whole["translations"][0]["confidence"]["truncated"] is False
    assert whole["translations"][0]["confidence"]["sentence"] > 0.0
    # A text holding a cut sentence says so; its confidence is the mean of its sentences'.
    text = native(client, f"Un chien dort. {long}", max_length=3, return_confidence=True)
    assert text["translations"][0]["confidence"]["truncated"] is True


def test_a_model_without_a_calibration_gives_the_raw_score_only(client: TestClient):
    found = native(client, SENTENCES[0], target="de", return_confidence=True)["translations"][0]
    confidence = found["confidence"]
    assert "sentence" not in confidence and "label" not in confidence
    assert confidence["raw"] < 0
    assert all("doubtful" not in w for w in confidence["words"])


def test_return_confidence_must_be_a_boolean(client: TestClient):
    response = client.post(
        "/v1/translate",
        json={"text": "Bonjour", "source_lang": "fr", "target_lang": "en", "return_confidence": 1},
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][-1] == "return_confidence"


def test_the_dialects_answer_as_before_unless_asked(client: TestClient):
    libre = {"q": SENTENCES[0], "source": "fr", "target": "en"}
    assert set(client.post("/translate", json=libre).json()) == {"translatedText"}
    asked = client.post("/translate", json={**libre, "return_confidence": True}).json()
    assert 0 <= asked["confidence"]["sentence"] <= 1
    form = client.post("/translate", data={**libre, "return_confidence": "true"}).json()
    assert form["confidence"] == asked["confidence"]
    batch = client.post("/translate", json={**libre, "q": SENTENCES, "return_confidence": True})
    assert len(batch.json()["confidence"]) == 2

    deepl = {"text": [SENTENCES[0]], "target_lang": "EN-US", "source_lang": "FR"}
    plain = client.post("/v2/translate", json=deepl).json()["translations"][0]
    assert set(plain) == {"detected_source_language", "text", "billed_characters"}
    asked = client.post("/v2/translate", json={**deepl, "return_confidence": True}).json()
    assert asked["translations"][0]["confidence"]["words"]


@pytest.mark.parametrize(
    "path, body, status",
    [
        ("/translate", {"q": "Bonjour", "source": "fr", "target": "en"}, 400),
        ("/v2/translate", {"text": ["Bonjour"], "target_lang": "EN-US"}, 400),
    ],
)
def test_the_dialects_refuse_a_flag_they_cannot_read(client: TestClient, path, body, status):
    response = client.post(path, json={**body, "return_confidence": "perhaps"})
    assert response.status_code == status
    assert "return_confidence" in response.text
    html = {**body, "format": "html"} if path == "/translate" else {**body, "tag_handling": "html"}
    response = client.post(path, json={**html, "return_confidence": True})
    assert response.status_code == 400 and "return_confidence" in response.text


def test_sentence_confidence_is_a_histogram_per_model(client: TestClient):
    def count() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith('nmt_translation_confidence_count{model="fr-en"'):
                return float(line.split()[-1])
        return 0.0

    before = count()
    native(client, SENTENCES, return_confidence=True)
    assert count() == before + 2
    native(client, SENTENCES)  # not asked: not computed, not counted
    assert count() == before + 2
