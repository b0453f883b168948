"""Model control over HTTP, in process: /v1/models with versions and states, a load that
switches versions, a broken version refused with its reason (409) while the old one answers,
a rollback, an unload, per-model readiness, and admin keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.serving.settings import Settings
from tests.http.in_process import start
from tests.serving.test_registry import add_version, break_version

NATIVE = {"text": "Un chien court.", "source_lang": "fr", "target_lang": "en", "beam_size": 1}


@pytest.fixture
def repository(fr_en_bundle: Path, tmp_path: Path) -> Path:
    add_version(tmp_path, "fr-en", 1, fr_en_bundle)
    return tmp_path


@pytest.fixture
def client(repository: Path):
    client = start(Settings(model_dir=repository, threads=1, warmup=False, cache_entries=0))
    yield client
    client.__exit__(None, None, None)


def translated_by(client: TestClient) -> tuple[str, int | None]:
    answer = client.post("/v1/translate", json=NATIVE)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return body["model"], body.get("model_version")


def test_versions_load_switch_roll_back_and_unload(
    client: TestClient, repository: Path, fr_en_bundle: Path
):
    (model,) = client.get("/v1/models").json()["models"]
    assert (model["name"], model["version"], model["state"]) == ("fr-en", 1, "ready")
    assert model["pairs"] == ["fr-en"] and model["max_tokens_per_sentence"] > 0
    assert [v["state"] for v in model["versions"]] == ["ready"]
    assert translated_by(client) == ("fr-en", 1)

    add_version(repository, "fr-en", 2, fr_en_bundle)
    loaded = client.post("/v1/models/fr-en/load")
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["version"] == 2
    assert translated_by(client) == ("fr-en", 2)

    break_version(add_version(repository, "fr-en", 3, fr_en_bundle))
    refused = client.post("/v1/models/fr-en/load")
    assert refused.status_code == 409
    assert "version 3" in refused.json()["detail"] and "checksum" in refused.json()["detail"]
    assert "version 2 serves it now" in refused.json()["detail"]
    assert translated_by(client) == ("fr-en", 2)
    (model,) = client.get("/v1/models").json()["models"]
    failed = [v for v in model["versions"] if v["state"] == "failed"]
    assert [v["version"] for v in failed] == [3] and "checksum" in failed[0]["reason"]

    rolled_back = client.post("/v1/models/fr-en/load", json={"version": 1})
    assert rolled_back.status_code == 200 and rolled_back.json()["version"] == 1
    assert translated_by(client) == ("fr-en", 1)
    assert client.post("/v1/models/fr-en/load", json={"version": 8}).status_code == 404
    assert client.post("/v1/models/fr-en/load", json={"version": "2"}).status_code == 422

    assert client.get("/v1/models/fr-en/ready").json() == {
        "name": "fr-en",
        "version": 1,
        "state": "ready",
        "ready": True,
    }
    assert client.get("/readyz").status_code == 200
    unloaded = client.post("/v1/models/fr-en/unload")
    assert unloaded.status_code == 200
    assert client.post("/v1/translate", json=NATIVE).status_code == 404
    not_ready = client.get("/v1/models/fr-en/ready")
    assert not_ready.status_code == 503 and not_ready.json()["ready"] is False
    assert not_ready.json()["state"] in ("unloading", "unloaded")
    assert client.get("/readyz").status_code == 503
    # Unloading it again: it is unloaded already, as its readiness says; not an unknown model.
    again = client.post("/v1/models/fr-en/unload")
    assert again.status_code == 200 and again.json()["state"] in ("unloading", "unloaded")
    assert client.get("/v1/models/de-en/ready").status_code == 404
    assert client.post("/v1/models/de-en/unload").status_code == 404
    assert client.post("/v1/models/de-en/load").status_code == 404

    # Back by the policy: the newest that loads. Version 3 is still broken, and said to be.
    again = client.post("/v1/models/fr-en/load")
    assert again.status_code == 409 and "version 2 serves it now" in again.json()["detail"]
    assert translated_by(client) == ("fr-en", 2)
    assert client.get("/readyz").status_code == 200


def test_a_request_may_name_a_loaded_version(
    client: TestClient, repository: Path, fr_en_bundle: Path
):
    add_version(repository, "fr-en", 2, fr_en_bundle)
    client.post("/v1/models/fr-en/load")  # latest:1 -> version 1 unloaded
    named = client.post("/v1/translate", json={**NATIVE, "model_version": 1})
    assert named.status_code == 404 and "its versions: 2" in named.json()["detail"]
    assert client.post("/v1/translate", json={**NATIVE, "model_version": 2}).status_code == 200


def test_the_version_is_in_the_metric_labels(client: TestClient):
    translated_by(client)
    samples = [
        (sample.name, sample.labels)
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
    ]
    request = {"route": "/v1/translate", "model": "fr-en", "version": "1", "status": "200"}
    assert ("nmt_requests_total", request) in samples
    assert ("nmt_decode_steps_total", {"model": "fr-en", "version": "1"}) in samples
    loaded = {"model": "fr-en", "version": "1", "outcome": "loaded"}
    assert ("nmt_model_loads_total", loaded) in samples


def test_the_access_log_names_the_version(client: TestClient, caplog: pytest.LogCaptureFixture):
    from service.http.logs import JsonFormatter

    with caplog.at_level("INFO", logger="nmt.access"):
        client.post("/v1/translate", json=NATIVE, headers={"X-Request-ID": "versioned"})
    (record,) = [r for r in caplog.records if getattr(r, "request_id", None) == "versioned"]
    line = json.loads(JsonFormatter().format(record))
    assert (line["model"], line["model_version"]) == ("fr-en", 1)


@pytest.mark.parametrize(
    ("settings", "headers", "status"),
    [
        ({"admin_keys": "root-1"}, {}, 401),
        ({"admin_keys": "root-1"}, {"x-api-key": "other"}, 403),
        ({"admin_keys": "root-1"}, {"authorization": "Bearer root-1"}, 200),
        # API keys on, no admin key configured: refused, even with a good API key.
        ({"api_keys": "user-1"}, {"x-api-key": "user-1"}, 403),
        ({"api_keys": "user-1", "admin_keys": "root-1"}, {"x-api-key": "user-1"}, 403),
        ({"api_keys": "user-1", "admin_keys": "root-1"}, {"x-api-key": "root-1"}, 200),
    ],
)
def test_loading_needs_an_admin_key(repository: Path, settings: dict, headers: dict, status: int):
    client = start(Settings(model_dir=repository, threads=1, warmup=False, **settings))
    try:
        answer = client.post("/v1/models/fr-en/load", headers=headers)
        assert answer.status_code == status, answer.text
        unload = client.post("/v1/models/fr-en/unload", headers=headers)
        assert unload.status_code == status
    finally:
        client.__exit__(None, None, None)


def test_a_load_body_that_is_not_json_gets_the_documented_400(client: TestClient):
    # Found by schemathesis (status-code conformance): the 400 was answered, not documented.
    answer = client.post(
        "/v1/models/fr-en/load", content=b"\xff\xfe", headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["detail"]
    documented = client.get("/openapi.json").json()["paths"]["/v1/models/{name}/load"]["post"]
    assert {"400", "413"} <= set(documented["responses"])
    assert translated_by(client) == ("fr-en", 1)  # nothing was loaded or lost


@pytest.mark.parametrize("name", ["m" * 300, "%00", "%2e%2e"])
def test_a_name_no_folder_can_have_is_an_unknown_model(client: TestClient, name: str):
    # Found by fuzzing: a name longer than the file system allows (255 bytes) made the
    # repository's folder check raise, and the answer was a 500.
    for answer in (
        client.get(f"/v1/models/{name}/ready"),
        client.post(f"/v1/models/{name}/load"),
        client.post(f"/v1/models/{name}/unload"),
    ):
        assert answer.status_code == 404, answer.text
        assert "fr-en" in answer.json()["detail"]  # the models there are
    assert translated_by(client) == ("fr-en", 1)


def test_loads_waiting_on_each_other_hold_no_thread_a_translation_needs(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
):
    """Twelve loads stuck at once (here: until released) used to take every thread of the
    default pool, where a long text is split and prepared: the translation waited for them.
    Loads run on threads of their own."""
    import threading

    release = threading.Event()
    registry = client.app.state.service.registry
    real_load = registry.load

    def slow_load(name: str, version: int | None = None) -> None:
        release.wait(60)
        real_load(name, version)

    monkeypatch.setattr(registry, "load", slow_load)
    statuses: list[int] = []
    loads = [
        threading.Thread(
            target=lambda: statuses.append(client.post("/v1/models/fr-en/load").status_code)
        )
        for _ in range(12)
    ]
    for thread in loads:
        thread.start()
    try:
        answers = []
        long_text = " ".join(["Un homme marche dans la rue."] * 80)  # past 2,000 characters
        translating = threading.Thread(
            target=lambda: answers.append(
                client.post("/v1/translate", json={**NATIVE, "text": long_text})
            )
        )
        translating.start()
        translating.join(30)
        assert answers and answers[0].status_code == 200, "the translation waited for the loads"
        assert not release.is_set() and statuses == []  # every load still waiting
    finally:
        release.set()
        for thread in loads:
            thread.join(60)
    assert statuses == [200] * 12
