"""LibreTranslate clients against a real server: the `libretranslatepy` library, and request
shapes that connectors send (form-encoded fields, JSON with a `q` list, `api_key`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.error import HTTPError

import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from tests.servers import Server, running_server

KEY = "connector-key"


@pytest.fixture(scope="module")
def server(fr_en_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    logs = tmp_path_factory.mktemp("client-logs")
    with running_server(fr_en_bundle, logs, threads=1, api_keys=KEY) as server:
        yield server


def native(server: Server, text: str) -> str:
    body = {"text": text, "source_lang": "fr", "target_lang": "en"}
    headers = {"x-api-key": KEY}
    answer = httpx.post(f"{server.url}/v1/translate", json=body, headers=headers, timeout=60)
    return answer.json()["translations"][0]["text"]


def test_libretranslatepy_translates_detects_and_lists_languages(server: Server):
    client = LibreTranslateAPI(server.url + "/", api_key=KEY)
    text = "Une femme lit un livre dans le parc."
    assert client.translate(text, source="fr", target="en") == native(server, text)
    detected = client.detect("Deux enfants jouent au ballon sur la plage.")
    assert detected[0]["language"] == "fr"
    assert client.languages() == [{"code": "fr", "name": "French", "targets": ["en"]}]


def test_a_wrong_key_is_refused_as_libretranslate_does(server: Server):
    client = LibreTranslateAPI(server.url + "/", api_key="wrong")
    with pytest.raises(HTTPError) as refused:  # the library lets urllib's error through
        client.translate("Bonjour.", source="fr", target="en")
    assert refused.value.code == 403
    assert json.loads(refused.value.read()) == {"error": "Invalid API key"}


def test_a_form_post_with_format_text_and_the_key(server: Server):
    """The shape of a form-posting connector: q, source, target, format, api_key."""
    form = {"q": "Un chien court.", "source": "fr", "target": "en", "format": "text"}
    answer = httpx.post(f"{server.url}/translate", data={**form, "api_key": KEY}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"translatedText": native(server, "Un chien court.")}


def test_a_json_post_with_a_list_and_auto_source(server: Server):
    texts = ["Un chien court dans la neige.", "Une femme chante sur scène."]
    body = {"q": texts, "source": "auto", "target": "en", "format": "text", "api_key": KEY}
    answer = httpx.post(f"{server.url}/translate", json=body, timeout=60).json()
    assert answer["translatedText"] == [native(server, text) for text in texts]
    assert [d["language"] for d in answer["detectedLanguage"]] == ["fr", "fr"]
