"""The LibreTranslate-compatible routes answer as LibreTranslate does: same fields, same error
bodies and status codes, JSON and form bodies alike."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from service.runtime.search import SearchOptions
from service.runtime.translator import Translator
from service.serving.errors import DetectedLanguageNotServed
from service.serving.language_id import Detection
from service.serving.lifecycle import Lifecycle
from service.serving.requests import TranslationService
from service.serving.settings import Settings
from tests.http.in_process import pair_bundle, start

SETTINGS = {
    "max_texts_per_request": 3,
    "max_chars_per_text": 200,
    "max_tokens_per_sentence": 30,
    "max_beam_size": 4,
    "default_beam_size": 2,
    "max_output_length": 40,
    "max_body_bytes": 3000,
    "threads": 1,
}
# What /translate decodes with when no alternatives are asked for.
DEFAULT = SearchOptions(beam_size=2, max_length=40)


@pytest.fixture(scope="module")
def client(fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("models")
    (folder / "fr-en").symlink_to(fr_en_bundle, target_is_directory=True)
    pair_bundle(fr_en_bundle, folder / "en-de", "en", "de")
    client = start(Settings(model_dir=folder, **SETTINGS))
    yield client
    client.__exit__(None, None, None)


def expected(translator: Translator, texts: list[str], options: SearchOptions = DEFAULT):
    return [t.text for t in translator.translate(texts, options)]


def test_json_string(client: TestClient, translator: Translator):
    response = client.post(
        "/translate", json={"q": "Un chat dort.", "source": "fr", "target": "en"}
    )
    assert response.status_code == 200
    assert response.json() == {"translatedText": expected(translator, ["Un chat dort."])[0]}


def test_json_list_keeps_order(client: TestClient, translator: Translator):
    texts = ["Un chat dort.", "Deux chiens jouent.", "Il pleut."]
    response = client.post(
        "/translate", json={"q": texts, "source": "fr", "target": "en", "format": "text"}
    )
    assert response.json() == {"translatedText": expected(translator, texts)}


def test_urlencoded_form(client: TestClient, translator: Translator):
    response = client.post(
        "/translate", data={"q": "Un chat dort.", "source": "fr", "target": "en", "api_key": ""}
    )
    assert response.status_code == 200
    assert response.json() == {"translatedText": expected(translator, ["Un chat dort."])[0]}


@pytest.mark.parametrize("multipart", [False, True])
def test_a_form_that_repeats_q_translates_every_text(
    client: TestClient, translator: Translator, multipart: bool
):
    """As a JSON list would: each text, in order, none dropped."""
    texts = ["Un chat dort.", "Deux chiens jouent.", "Il pleut."]
    files = {"unused": ("a.txt", b"ignored")} if multipart else None
    response = client.post(
        "/translate", data={"q": texts, "source": "fr", "target": "en"}, files=files
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"translatedText": expected(translator, texts)}


def test_a_form_sent_as_raw_utf_8_reads_as_it_says(client: TestClient, translator: Translator):
    """`curl -d 'q=Le café.'`: UTF-8 not percent-encoded (before, it read "Le cafÃ©.")."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    body = "q=Le café dort.&source=fr&target=en".encode()
    response = client.post("/translate", content=body, headers=form)
    assert response.status_code == 200, response.text
    assert response.json() == {"translatedText": expected(translator, ["Le café dort."])[0]}
    refused = client.post("/translate", content=b"q=%ff%fe&source=fr&target=en", headers=form)
    assert refused.status_code == 400 and "not UTF-8" in refused.json()["error"]


@pytest.mark.parametrize("api_key", [{}, 7, ["k"]])
def test_an_api_key_that_is_not_a_string_is_refused(client: TestClient, api_key):
    body = {"q": "Un chat dort.", "source": "fr", "target": "en", "api_key": api_key}
    response = client.post("/translate", json=body)
    assert response.status_code == 400
    assert response.json() == {"error": "Invalid request: api_key must be a string"}


def test_multipart_form(client: TestClient, translator: Translator):
    response = client.post(
        "/translate",
        data={"q": "Un chat dort.", "source": "fr", "target": "en"},
        files={"unused": ("a.txt", b"ignored")},
    )
    assert response.status_code == 200
    assert response.json() == {"translatedText": expected(translator, ["Un chat dort."])[0]}


def test_alternatives(client: TestClient, translator: Translator):
    response = client.post(
        "/translate", json={"q": "Un chat dort.", "source": "fr", "target": "en", "alternatives": 2}
    )
    body = response.json()
    options = SearchOptions(beam_size=3, n_best=3, max_length=40)
    (best,) = translator.translate(["Un chat dort."], options)
    assert body["translatedText"] == best.text
    assert body["alternatives"] == [
        translator.tokenizer.decode(h.tokens) for h in best.hypotheses[1:]
    ]
    batch = client.post(
        "/translate",
        json={"q": ["Un.", "Deux."], "source": "fr", "target": "en", "alternatives": 1},
    ).json()
    assert len(batch["alternatives"]) == 2 and all(len(a) == 1 for a in batch["alternatives"])


def test_auto_source_detects_the_language(client: TestClient):
    text = "Un homme fait du vélo dans la rue."
    body = client.post("/translate", json={"q": text, "source": "auto", "target": "en"}).json()
    assert body["detectedLanguage"]["language"] == "fr"
    assert 50 < body["detectedLanguage"]["confidence"] <= 100
    given = client.post("/translate", json={"q": text, "source": "fr", "target": "en"}).json()
    assert body["translatedText"] == given["translatedText"]


def test_a_detected_language_no_model_translates_is_a_400_naming_it(client: TestClient):
    german = "Ein Mann fährt mit dem Fahrrad durch die Stadt."
    answer = client.post("/translate", json={"q": german, "source": "auto", "target": "en"})
    assert answer.status_code == 400
    assert "'de'" in answer.json()["error"] and "fr" in answer.json()["error"]


@pytest.mark.parametrize("text", ["Un homme.", "Merci !"])
def test_auto_on_short_french_answers_from_the_only_source_with_its_confidence(
    client: TestClient, text: str
):
    """Detection misreads short texts ("Un homme." looks like Northern Sotho, at 7%). French is
    the only source into English here: it is used, and detectedLanguage says so, with the
    detector's own (low) confidence in French rather than a made-up one."""
    body = client.post("/translate", json={"q": text, "source": "auto", "target": "en"}).json()
    assert body["detectedLanguage"]["language"] == "fr"
    assert 0 <= body["detectedLanguage"]["confidence"] < 50
    detected = client.post("/detect", json={"q": text}).json()
    assert detected[0]["language"] != "fr"  # what detection alone says
    given = client.post("/translate", json={"q": text, "source": "fr", "target": "en"}).json()
    assert body["translatedText"] == given["translatedText"]


def test_an_unsure_detection_is_refused_when_several_sources_could_be_meant():
    """With two source languages into English, "Un homme." (Northern Sotho, at 7%) has no
    honest answer: the 400 that names what was detected stays."""

    def registry(*sources: str) -> SimpleNamespace:
        models = [SimpleNamespace(pairs=lambda s=s: [(s, "en")]) for s in sources]
        return SimpleNamespace(models=models)

    def detect(*sources: str) -> Detection:
        service = TranslationService(Settings(), registry(*sources), Lifecycle())  # type: ignore[arg-type]
        return asyncio.run(service.detect_source(["Un homme."], "en"))

    with pytest.raises(DetectedLanguageNotServed, match=r"'nso'.*from: de, fr"):
        detect("de", "fr")
    assert detect("fr", "fr") == Detection("fr", 6.9)  # two versions of one source: one source


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("Deux enfants jouent au ballon sur la plage.", "fr"),
        ("Zwei Kinder spielen am Strand mit einem Ball.", "de"),
        ("Two children are playing with a ball on the beach.", "en"),
    ],
)
def test_detect_names_the_language_first(client: TestClient, text: str, language: str):
    found = client.post("/detect", data={"q": text}).json()
    assert found[0]["language"] == language
    assert found[0]["confidence"] >= found[-1]["confidence"]
    listed = client.post("/detect", json={"q": [text, text]}).json()
    assert [candidates[0]["language"] for candidates in listed] == [language, language]
    assert client.post("/detect", json={}).status_code == 400


def test_frontend_settings_describe_this_server(client: TestClient):
    settings = client.get("/frontend/settings").json()
    assert settings["charLimit"] == SETTINGS["max_chars_per_text"]
    assert settings["keyRequired"] is False
    assert settings["language"]["source"]["code"] in ("en", "fr")


def test_languages(client: TestClient):
    # fr -> de has no model of its own: it goes through English (fr-en, then en-de).
    assert client.get("/languages").json() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "fr", "name": "French", "targets": ["de", "en"], "pivot": {"de": "en"}},
    ]


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"source": "fr", "target": "en"}, 400, "Invalid request: missing q parameter"),
        ({"q": [], "source": "fr", "target": "en"}, 400, "Invalid request: missing q parameter"),
        ({"q": "a", "target": "en"}, 400, "Invalid request: missing source parameter"),
        ({"q": "a", "source": "fr"}, 400, "Invalid request: missing target parameter"),
        ({"q": "a", "source": "zz", "target": "en"}, 400, "zz is not supported"),
        ({"q": "a", "source": "fr", "target": "zz"}, 400, "zz is not supported"),
        (
            {"q": "a", "source": "en", "target": "en"},
            400,
            "en is not available as a target language from en",
        ),
        (
            {"q": "a", "source": "fr", "target": "en", "format": "xml"},
            400,
            "xml format is not supported",
        ),
        (
            {"q": "a", "source": "fr", "target": "en", "alternatives": "abc"},
            400,
            "Invalid request: alternatives parameter is not a number",
        ),
        (
            {"q": ["a"] * 4, "source": "fr", "target": "en"},
            400,
            "Invalid request: request (4) exceeds text limit (3)",
        ),
        (
            {"q": "x" * 201, "source": "fr", "target": "en"},
            400,
            "Invalid request: request (201) exceeds text limit (200)",
        ),
    ],
)
def test_errors_are_libretranslate_errors(client: TestClient, body: dict, status: int, error: str):
    response = client.post("/translate", json=body)
    assert response.status_code == status
    assert response.json() == {"error": error}
    form = {k: v for k, v in body.items() if isinstance(v, str)}
    if form == body:  # the same through a form body
        assert client.post("/translate", data=form).json() == {"error": error}


@pytest.mark.parametrize("raw", [b"[1, 2]", b"{broken", b'"q"'])
def test_a_json_body_that_is_not_an_object_is_invalid_json_format(client: TestClient, raw: bytes):
    response = client.post("/translate", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json() == {"error": "Invalid JSON format"}


# Bodies a client can get wrong: each a 400 in LibreTranslate's {"error"} body (the form ones
# were FastAPI's {"detail"} before).
UNREADABLE = [
    ("multipart/form-data", b"--x\r\nq=Bonjour\r\n--x--\r\n", "Missing boundary in multipart."),
    (
        "multipart/form-data; boundary=x",
        b"--x\r\nContent-Disposition: form-data\r\n\r\nBonjour\r\n--x--\r\n",  # no name
        '"name" must be provided',
    ),
    ("application/json", b'{"q": "Bonjour', "Invalid JSON format"),  # truncated
    ("application/json", b'{"q": "\xff", "source": "fr", "target": "en"}', "Invalid JSON format"),
]


@pytest.mark.parametrize("path", ["/translate", "/detect"])
@pytest.mark.parametrize(("content_type", "body", "error"), UNREADABLE)
def test_a_body_that_cannot_be_read_is_a_libretranslate_400(
    client: TestClient, path: str, content_type: str, body: bytes, error: str
):
    response = client.post(path, content=body, headers={"content-type": content_type})
    assert response.status_code == 400, response.text
    assert list(response.json()) == ["error"] and error in response.json()["error"]


def test_a_wrong_content_type_or_method_answers_in_libretranslate_s_body(client: TestClient):
    form = b"q=Bonjour&source=fr&target=en"  # a form, sent as text: its fields are not read
    response = client.post("/translate", content=form, headers={"content-type": "text/plain"})
    assert response.json() == {"error": "Invalid request: missing q parameter"}
    response = client.get("/translate")
    assert response.status_code == 405 and response.json() == {"error": "Method Not Allowed"}
    response = client.post("/detect", data={"q": "x" * 4000})
    assert response.status_code == 413 and "3000 bytes" in response.json()["error"]


def test_too_many_tokens_in_a_sentence_is_a_400(client: TestClient):
    text = "Un " + "très " * 35 + "grand chat."
    response = client.post("/translate", json={"q": text, "source": "fr", "target": "en"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith("Invalid request: text[0], sentence 1, has ")
    assert "limit is 30 tokens" in error


def test_an_oversized_body_is_413_with_an_error_field(client: TestClient):
    response = client.post("/translate", data={"q": "x" * 4000, "source": "fr", "target": "en"})
    assert response.status_code == 413
    assert "3000 bytes" in response.json()["error"]


def test_a_non_string_language_is_a_400(client: TestClient):
    response = client.post("/translate", json={"q": "Un chat.", "source": 7, "target": "en"})
    assert response.json() == {"error": "Invalid request: source must be a string"}
