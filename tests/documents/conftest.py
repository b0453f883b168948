"""Fixtures for the document formats: the served model in process, and a translator of
segments through the text API (DeepL's /v2/translate with tag_handling=xml), which is what a
document's segments must come back as."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.documents.formats.base import DocumentFormat
from service.serving.settings import Settings
from tests.http.in_process import start

SegmentTranslator = Callable[[list[str], type[DocumentFormat]], list[str]]


@pytest.fixture(scope="module")
def document_client(model_dir: Path) -> Iterator[TestClient]:
    client = start(Settings(model_dir=model_dir))
    yield client
    client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def translate_segments(document_client: TestClient) -> SegmentTranslator:
    """Segments as the text API translates them: XML (or HTML) fragments, cut into
    sentences as the format says (its MarkupOptions), each inline tag carried by alignment."""
    split = {"no_newlines": "nonewlines", "sentences": "1", "none": "0"}

    def translate(segments: list[str], format: type[DocumentFormat]) -> list[str]:
        out: list[str] = []
        for start_at in range(0, len(segments), 50):  # DeepL's 50 texts per request
            answer = document_client.post(
                "/v2/translate",
                data={
                    "text": segments[start_at : start_at + 50],
                    "source_lang": "FR",
                    "target_lang": "EN-US",
                    "tag_handling": format.markup.kind,
                    "outline_detection": "0",
                    "split_sentences": split[format.markup.split],
                },
            )
            assert answer.status_code == 200, answer.text
            out += [item["text"] for item in answer.json()["translations"]]
        return out

    return translate
