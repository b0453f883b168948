"""What the three dialects share, written once (service/http/dialect.py, limits.py, usage.py),
checked in each: one check per limit and each dialect's status for it, the decoding settings
built from any dialect's fields, and the same usage accounted whichever dialect was asked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from service.http import deepl, libretranslate, routes
from service.http.dialect import Decoding, Dialect, search_options
from service.http.limits import Limit
from service.runtime.search import SearchOptions
from service.serving import errors
from service.serving.errors import InvalidInput, ServiceError
from service.serving.settings import Settings
from tests.http.in_process import start

SETTINGS = {
    "max_texts_per_request": 3,
    "max_chars_per_text": 200,
    "max_sentences_per_request": 4,
    "max_tokens_per_sentence": 30,
    "max_body_bytes": 3000,
    "max_alignment_weights": 50,
    "max_beam_size": 4,
    "default_beam_size": 2,
    "max_output_length": 40,
    "threads": 1,
    "cache_entries": 0,
}
DIALECTS = {"native": routes.NATIVE, "libre": libretranslate.LIBRE, "deepl": deepl.DEEPL}
KEYS = {"native": "detail", "libre": "error", "deepl": "message"}

# Each dialect's status for each limit, as its clients know them: the native API's own (422
# for what the request schema used to refuse, 413 for too much work), LibreTranslate's 400 for
# anything wrong with the request, DeepL's 413 for a request too large and 456 for the quota.
# Only the body size is refused before any dialect reads the request: 413 everywhere.
STATUSES = {
    Limit.TEXTS: {"native": 422, "libre": 400, "deepl": 413},
    Limit.CHARACTERS: {"native": 422, "libre": 400, "deepl": 413},
    Limit.SENTENCES: {"native": 413, "libre": 400, "deepl": 413},
    Limit.TOKENS: {"native": 422, "libre": 400, "deepl": 400},
    Limit.ALIGNMENT: {"native": 413, "libre": 400, "deepl": 413},
    Limit.BODY: {"native": 413, "libre": 413, "deepl": 413},
    Limit.QUOTA: {"native": 429, "libre": 429, "deepl": 456},
}

FIVE_SENTENCES = "Un chien court. Il pleut. Une femme lit. Un homme marche. Deux enfants jouent."
LONG_SENTENCE = "Un homme " + "très " * 35 + "grand."  # under 200 characters, over 30 tokens


def ask(client: TestClient, dialect: str, text: str | list[str], **headers: str):
    """The same texts, from fr to en, in a dialect's own request."""
    if dialect == "native":
        body: dict = {"text": text, "source_lang": "fr", "target_lang": "en"}
        return client.post("/v1/translate", json=body, headers=headers)
    if dialect == "libre":
        body = {"q": text, "source": "fr", "target": "en"}
        return client.post("/translate", json=body, headers=headers)
    texts = [text] if isinstance(text, str) else text
    body = {"text": texts, "source_lang": "FR", "target_lang": "EN-GB"}
    return client.post("/v2/translate", json=body, headers=headers)


@pytest.fixture(scope="module")
def client(fr_en_bundle: Path) -> Iterator[TestClient]:
    client = start(Settings(model_dir=fr_en_bundle, **SETTINGS))
    yield client
    client.__exit__(None, None, None)


# One check per limit, each dialect's status


def test_each_dialect_declares_these_statuses_for_every_limit():
    for name, dialect in DIALECTS.items():
        assert dict(dialect.limit_status) == {
            limit: statuses[name] for limit, statuses in STATUSES.items()
        }, name


def test_every_limit_error_names_a_setting_and_every_limit_has_its_error():
    """The errors say which limit they are by their `setting` (a Settings field), the one
    thing a dialect reads to give the status: no limit without an error, none unnamed."""
    named = {
        cls.__name__: cls.setting
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, ServiceError) and cls.setting is not None
    }
    assert set(named.values()) == {limit.value for limit in Limit}, named
    assert set(named.values()) <= set(Settings.model_fields)


def test_a_dialect_without_a_status_for_some_limit_cannot_be_made():
    statuses = {limit: 400 for limit in Limit if limit is not Limit.QUOTA}
    with pytest.raises(ValueError, match="character_limit"):
        Dialect(
            routes.NativeError,
            paths=frozenset(),
            limit_status=statuses,
            statuses={},
            as_error=lambda error, request, status: routes.NativeError(status, str(error)),
        )


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest.mark.parametrize(
    ("limit", "text", "names"),
    [
        (Limit.TEXTS, ["Un chat."] * 4, {"native": "NMT_MAX_TEXTS", "libre": "(4)", "deepl": "4"}),
        (Limit.CHARACTERS, "x" * 201, {"native": "201", "libre": "(201)", "deepl": "201"}),
        (Limit.SENTENCES, FIVE_SENTENCES, dict.fromkeys(DIALECTS, "NMT_MAX_SENTENCES")),
        (Limit.TOKENS, LONG_SENTENCE, dict.fromkeys(DIALECTS, "NMT_MAX_TOKENS_PER_SENTENCE")),
    ],
    ids=["texts", "characters", "sentences", "tokens"],
)
def test_a_request_past_a_limit_gets_its_dialects_status_and_body(
    client: TestClient, dialect: str, limit: Limit, text: str | list[str], names: dict
):
    response = ask(client, dialect, text)
    assert response.status_code == STATUSES[limit][dialect], response.text
    assert list(response.json()) == [KEYS[dialect]]
    assert names[dialect] in response.text


def test_too_many_texts_in_each_dialect_s_words(client: TestClient):
    """The one check (limits.check_texts) raises one error; each dialect words it as before."""
    texts = ["Un chat."] * 4
    assert ask(client, "native", texts).json() == {
        "detail": [
            {
                "type": "too_many_texts",
                "loc": ["body", "text"],
                "msg": "text has 4 texts; the limit is 3 texts per request "
                "(NMT_MAX_TEXTS_PER_REQUEST)",
                "ctx": {"count": 4, "limit": 3},
            }
        ]
    }
    assert ask(client, "libre", texts).json() == {
        "error": "Invalid request: request (4) exceeds text limit (3)"
    }
    detected = client.post("/detect", json={"q": texts})
    assert detected.status_code == 400
    assert detected.json() == {"error": "Invalid request: request (4) exceeds text limit (3)"}
    assert ask(client, "deepl", texts).json() == {
        "message": "Too many texts: 4; at most 3 per request (NMT_MAX_TEXTS_PER_REQUEST)."
    }


def test_a_text_too_long_in_each_dialect_s_words(client: TestClient):
    """Named by its place where the dialect names it (the native one)."""
    texts = ["Un chat.", "x" * 202]
    (problem,) = ask(client, "native", texts).json()["detail"]
    assert problem["msg"] == (
        "text[1] has 202 characters; the limit is 200 characters per text (NMT_MAX_CHARS_PER_TEXT)"
    )
    assert (problem["loc"], problem["ctx"]) == (
        ["body", "text"],
        {"where": "text[1]", "count": 202, "limit": 200},
    )
    lone = ask(client, "native", "x" * 202).json()["detail"][0]["msg"]
    assert lone.startswith("text has 202 characters")
    assert ask(client, "libre", texts).json() == {
        "error": "Invalid request: request (202) exceeds text limit (200)"
    }
    assert ask(client, "deepl", texts).json() == {
        "message": "A text has 202 characters; at most 200 (NMT_MAX_CHARS_PER_TEXT)."
    }


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_a_body_past_the_limit_is_refused_before_it_is_read_in_the_dialect_s_body(
    client: TestClient, dialect: str
):
    response = ask(client, dialect, "x" * 4000)
    assert response.status_code == STATUSES[Limit.BODY][dialect]
    assert list(response.json()) == [KEYS[dialect]]
    assert "NMT_MAX_BODY_BYTES" in response.json()[KEYS[dialect]]


def test_an_alignment_past_the_limit_is_the_native_413(client: TestClient):
    body = {"text": "Un homme marche dans la rue.", "source_lang": "fr", "target_lang": "en"}
    response = client.post("/v1/translate", json={**body, "return_alignment": True})
    assert response.status_code == STATUSES[Limit.ALIGNMENT]["native"]
    assert "NMT_MAX_ALIGNMENT_WEIGHTS" in response.json()["detail"]


def test_the_quota_gets_each_dialect_s_status(fr_en_bundle: Path):
    quota = start(Settings(model_dir=fr_en_bundle, **SETTINGS, character_limit=5))
    try:
        for dialect in DIALECTS:
            response = ask(quota, dialect, "Un chat dort.")
            assert response.status_code == STATUSES[Limit.QUOTA][dialect], response.text
            assert "NMT_CHARACTER_LIMIT" in response.json()[KEYS[dialect]]
        assert ask(quota, "libre", "Un chat dort.").json()["error"].startswith("Slowdown: ")
        assert ask(quota, "deepl", "Un chat dort.").json()["message"].startswith("Quota Exceeded")
    finally:
        quota.__exit__(None, None, None)


@pytest.mark.parametrize(
    ("path", "dialect"),
    [("/v1/translate", "native"), ("/translate", "libre"), ("/v2/translate", "deepl")],
)
def test_the_openapi_document_lists_every_status_a_limit_gets(
    client: TestClient, path: str, dialect: str
):
    documented = client.get("/openapi.json").json()["paths"][path]["post"]["responses"]
    for limit, statuses in STATUSES.items():
        assert str(statuses[dialect]) in documented, (limit, statuses[dialect])


# The decoding settings, from any dialect's fields


def fake_model(layers: int = 3) -> SimpleNamespace:
    return SimpleNamespace(name="fr-en", decoder_layers=layers, first_token=None)


def test_a_request_that_asks_nothing_decodes_with_the_server_defaults():
    settings = Settings(default_beam_size=3, default_length_penalty=0.8, max_output_length=50)
    options = search_options(Decoding(), settings, fake_model())  # type: ignore[arg-type]
    assert options == SearchOptions(
        beam_size=3,
        length_penalty=0.8,
        n_best=1,
        max_length=50,
        max_repeats=settings.max_repeats,
        alignment_layer=-1,
    )
    # Alternatives (LibreTranslate's) widen the default beam to hold them.
    wide = search_options(Decoding(n_best=5), settings, fake_model())  # type: ignore[arg-type]
    assert (wide.beam_size, wide.n_best) == (5, 5)
    asked = Decoding(beam_size=1, max_length=7, length_penalty=0.0, alignment=True)
    given = search_options(asked, settings, fake_model())  # type: ignore[arg-type]
    assert (given.beam_size, given.max_length, given.length_penalty) == (1, 7, 0.0)
    assert given.alignment


@pytest.mark.parametrize(("layer", "valid"), [(0, True), (2, True), (3, False), (-1, False)])
def test_the_alignment_layer_is_checked_once_against_the_model(layer: int, valid: bool):
    decoding = Decoding(alignment_layer=layer)
    if valid:
        options = search_options(decoding, Settings(), fake_model(3))  # type: ignore[arg-type]
        assert options.alignment_layer == layer
        return
    with pytest.raises(InvalidInput) as refused:
        search_options(decoding, Settings(), fake_model(3))  # type: ignore[arg-type]
    assert refused.value.field == "alignment_layer"
    assert refused.value.reason == f"is {layer}; fr-en has 3 decoder layers: 0 to 2"


def test_a_negative_alignment_layer_is_a_native_422_naming_the_model_s_layers(client: TestClient):
    body = {"text": "Un chat.", "source_lang": "fr", "target_lang": "en", "alignment_layer": -1}
    response = client.post("/v1/translate", json=body)
    assert response.status_code == 422
    (problem,) = response.json()["detail"]
    assert problem["loc"] == ["body", "alignment_layer"]
    assert "decoder layers: 0 to" in problem["msg"]


# Usage, accounted once


def test_the_same_text_is_accounted_alike_in_every_dialect(
    client: TestClient, caplog: pytest.LogCaptureFixture
):
    texts = ["Un chien court dans la neige. Il fait froid.", "Une femme lit."]
    with caplog.at_level("INFO", logger="nmt.access"):
        answers = {
            dialect: ask(client, dialect, texts, **{"x-request-id": f"usage-{dialect}"})
            for dialect in DIALECTS
        }
    by_id = {getattr(record, "request_id", None): record for record in caplog.records}
    lines = {dialect: by_id[f"usage-{dialect}"] for dialect in DIALECTS}
    for dialect, answer in answers.items():
        assert answer.status_code == 200, answer.text
        line = lines[dialect]
        assert (line.texts, line.sentences, line.model) == (2, 3, "fr-en"), dialect
    usage = answers["native"].json()["usage"]
    for line in lines.values():
        assert (line.input_tokens, line.output_tokens) == (
            usage["input_tokens"],
            usage["output_tokens"],
        )


def test_deepl_bills_what_its_usage_then_counts(client: TestClient):
    def used() -> int:
        return client.get("/v2/usage").json()["character_count"]

    before = used()
    texts = ["Un chien court.", "Une femme lit un livre."]
    answer = ask(client, "deepl", texts).json()
    billed = [t["billed_characters"] for t in answer["translations"]]
    assert billed == [len(text) for text in texts]
    assert used() == before + sum(billed)
    assert json.loads(client.get("/v2/usage").text)["character_limit"] == 10**12  # no limit
