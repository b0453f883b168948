"""The fields /openapi.json documents for the LibreTranslate and DeepL calls (translation,
detection, documents) are the fields they read: a request built from the document alone is
answered, as JSON and as a form where both are documented, and leaving out any field the
document calls required is a 400 that names it. (Found by schemathesis: these calls read their
fields by hand, and their bodies were documented as any object, or not at all.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from service.serving.settings import Settings
from tests.http.in_process import start
from tests.http.openapi_examples import body_schema, example_of, operation_at

# A document to upload where a schema asks for a file.
UPLOAD = ("chat.txt", b"Un chat dort.")


@pytest.fixture(scope="module")
def client(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    state = tmp_path_factory.mktemp("openapi-state")
    settings = Settings(
        model_dir=model_dir,
        threads=1,
        warmup=False,
        database_url=SecretStr(f"sqlite:///{state / 'nmt.db'}"),
        document_poll_seconds=0.1,
    )
    client = start(settings)
    yield client
    client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def spec(client: TestClient) -> dict:
    return client.get("/openapi.json").json()


def send(client: TestClient, path: str, content_type: str, fields: dict[str, Any]):
    """POST the fields in the body as this content type says."""
    if content_type == "application/json":
        return client.post(path, json=fields)
    if content_type == "application/x-www-form-urlencoded":
        return client.post(path, data=fields)
    assert content_type == "multipart/form-data"
    files = {name: UPLOAD for name, value in fields.items() if value is UPLOAD}
    data = {name: value for name, value in fields.items() if value is not UPLOAD}
    return client.post(path, data=data, files=files)


def fields_of(schema: dict) -> dict[str, Any]:
    return example_of(schema, file=UPLOAD)


CALLS = [
    ("/translate", "application/json"),
    ("/translate", "application/x-www-form-urlencoded"),
    ("/detect", "application/json"),
    ("/detect", "application/x-www-form-urlencoded"),
    ("/v2/translate", "application/json"),
    ("/v2/translate", "application/x-www-form-urlencoded"),
    ("/v2/document", "multipart/form-data"),
    ("/translate_file", "multipart/form-data"),
]


@pytest.mark.parametrize(("path", "content_type"), CALLS)
def test_a_request_made_from_the_document_is_answered_and_each_required_field_is_needed(
    client: TestClient, spec: dict, path: str, content_type: str
):
    schema = body_schema(operation_at(spec, "POST", path), content_type)
    assert schema["required"], schema
    fields = fields_of(schema)
    answer = send(client, path, content_type, fields)
    assert answer.status_code == 200, answer.text
    for name in schema["required"]:
        left_out = send(client, path, content_type, {k: v for k, v in fields.items() if k != name})
        assert left_out.status_code == 400, (name, left_out.text)
        assert name in left_out.text, (name, left_out.text)


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_a_document_s_status_and_result_take_the_documented_key(
    client: TestClient, spec: dict, content_type: str
):
    upload = body_schema(operation_at(spec, "POST", "/v2/document"), "multipart/form-data")
    handle = send(client, "/v2/document", "multipart/form-data", fields_of(upload)).json()
    for path in ("/v2/document/{document_id}", "/v2/document/{document_id}/result"):
        schema = body_schema(operation_at(spec, "POST", path), content_type)
        assert schema["required"] == ["document_key"]
        url = path.format(document_id=handle["document_id"])
        left_out = send(client, url, content_type, {})
        assert left_out.status_code == 400 and "document_key" in left_out.text
    status = send(client, f"/v2/document/{handle['document_id']}", content_type, handle)
    assert status.status_code == 200 and status.json()["document_id"] == handle["document_id"]


def test_the_answers_schemathesis_found_undocumented_are_documented(client: TestClient, spec: dict):
    """An unknown glossary_id is a 404 on translation and upload; the v2 entries are TSV."""
    for path, content_type in (
        ("/v2/translate", "application/json"),
        ("/v2/document", "multipart/form-data"),
    ):
        fields = fields_of(body_schema(operation_at(spec, "POST", path), content_type))
        answer = send(
            client, path, content_type, fields | {"source_lang": "FR", "glossary_id": "x"}
        )
        assert answer.status_code == 404, answer.text
        assert "404" in operation_at(spec, "POST", path)["responses"]

    made = client.post(
        "/v2/glossaries",
        json={"name": "a", "source_lang": "FR", "target_lang": "EN", "entries": "chien\tdog"},
    )
    assert made.status_code == 201, made.text
    entries = client.get(f"/v2/glossaries/{made.json()['glossary_id']}/entries")
    documented = operation_at(spec, "GET", "/v2/glossaries/{glossary_id}/entries")
    media_type = entries.headers["content-type"].split(";")[0]
    assert entries.status_code == 200 and entries.text == "chien\tdog"
    assert list(documented["responses"]["200"]["content"]) == [media_type]
