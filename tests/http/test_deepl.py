"""The DeepL v2 dialect, through the official `deepl` Python client against a real server: the
client's calls work, its exceptions fire where DeepL's would, and raw bodies shaped as other
DeepL clients send them get DeepL's answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import deepl
import httpx
import pytest

from service.runtime.bundle import load_bundle
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from tests.servers import Server, running_server

TEXTS = ["Un homme fait du vélo.", "Deux chiens jouent dans la neige. Il fait froid."]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deepl-logs")


@pytest.fixture(scope="module")
def server(fr_en_bundle: Path, logs: Path) -> Iterator[Server]:
    with running_server(fr_en_bundle, logs, threads=1, default_beam_size=2) as server:
        yield server


@pytest.fixture(scope="module")
def keyed(fr_en_bundle: Path, logs: Path) -> Iterator[Server]:
    settings = {"threads": 1, "api_keys": "key-1:fx", "character_limit": 60}
    with running_server(fr_en_bundle, logs, **settings) as server:
        yield server


def native(server: Server, texts: list[str], beam_size: int = 2) -> list[str]:
    body = {"text": texts, "source_lang": "fr", "target_lang": "en", "beam_size": beam_size}
    answer = httpx.post(f"{server.url}/v1/translate", json=body, timeout=60).json()
    return [t["text"] for t in answer["translations"]]


def client(server: Server, key: str = "any-key") -> deepl.Translator:
    return deepl.Translator(key, server_url=server.url, send_platform_info=False)


def test_the_official_client_translates_like_the_native_api(server: Server):
    translator = client(server)
    results = translator.translate_text(TEXTS, target_lang="EN-GB", source_lang="FR")
    assert [r.text for r in results] == native(server, TEXTS)
    assert {r.detected_source_lang for r in results} == {"FR"}
    one = translator.translate_text(TEXTS[0], target_lang="EN-US")  # source detected
    assert one.text == native(server, TEXTS[:1])[0]
    assert one.detected_source_lang == "FR"


def test_languages_and_usage(server: Server):
    translator = client(server)
    assert [(lang.code, lang.name) for lang in translator.get_source_languages()] == [
        ("FR", "French")
    ]
    targets = {lang.code: lang.supports_formality for lang in translator.get_target_languages()}
    assert targets == {"EN-GB": False, "EN-US": False}
    before = translator.get_usage().character.count
    translator.translate_text("Bonjour.", target_lang="EN-GB")
    usage = translator.get_usage()
    assert usage.character.count == before + len("Bonjour.")
    assert usage.character.valid and not usage.any_limit_reached


def test_an_unknown_language_raises_the_clients_bad_request_error(server: Server):
    with pytest.raises(deepl.DeepLException, match="Bad request") as raised:
        client(server).translate_text("Bonjour.", target_lang="DE")
    assert raised.value.http_status_code == 400


def test_options_the_model_cannot_honour_are_refused_and_hints_accepted(server: Server):
    translator = client(server)
    with pytest.raises(deepl.DeepLException, match="formality"):
        translator.translate_text("Bonjour.", target_lang="EN-GB", formality="more")
    with pytest.raises(deepl.DeepLException, match="Tag handling parsing failed"):
        translator.translate_text("<b>Bonjour.", target_lang="EN-GB", tag_handling="xml")
    hinted = translator.translate_text(
        TEXTS[0], target_lang="EN-GB", formality="prefer_less", context="Un article de sport."
    )
    assert hinted.text == native(server, TEXTS[:1])[0]


def test_the_official_client_with_tag_handling_keeps_the_tags(server: Server):
    translator = client(server)
    xml = translator.translate_text(
        'Un <b>chien</b> court dans la <x id="1"></x> neige.',
        target_lang="EN-GB",
        tag_handling="xml",
        ignore_tags=["x"],
    )
    assert xml.text.count("<b>") == xml.text.count("</b>") == 1
    assert '<x id="1"></x>' in xml.text and "dog" in xml.text
    html = translator.translate_text(
        "<p>Un homme fait du <i>vélo</i>.</p>", target_lang="EN-US", tag_handling="html"
    )
    assert html.text.startswith("<p>") and html.text.endswith("</p>")
    assert html.text.count("<i>") == html.text.count("</i>") == 1


def test_form_bodies_with_repeated_text_and_split_modes(server: Server, fr_en_bundle: Path):
    form = {"text": TEXTS, "target_lang": "EN-GB"}  # `text` repeated, as a form sends a list
    answer = httpx.post(f"{server.url}/v2/translate", data=form, timeout=60)
    assert answer.status_code == 200, answer.text
    assert [t["text"] for t in answer.json()["translations"]] == native(server, TEXTS)
    # split_sentences=0: the whole text is one sentence for the model.
    whole = httpx.post(
        f"{server.url}/v2/translate",
        data={"text": TEXTS[1], "target_lang": "EN-GB", "split_sentences": "0"},
        timeout=60,
    ).json()["translations"][0]["text"]
    translator = Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))
    alone = translator.translate([TEXTS[1]], SearchOptions(beam_size=2, max_repeats=3))
    assert whole == alone[0].text  # one sentence for the model: not what splitting gives
    assert whole != native(server, TEXTS[1:])[0]
    missing = httpx.post(f"{server.url}/v2/translate", data={"target_lang": "EN-GB"}, timeout=60)
    assert missing.status_code == 400
    assert missing.json() == {"message": "Parameter 'text' not specified."}


def test_a_form_is_read_as_utf_8_sent_raw_or_percent_encoded(server: Server):
    """`curl -d 'text=Le café.'` sends the UTF-8 bytes as they are; a browser percent-encodes
    them: both mean the same text. Bytes that are not UTF-8 are refused, not turned into
    U+FFFD and translated."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    url = f"{server.url}/v2/translate"
    raw = httpx.post(url, content="text=Le café.&target_lang=EN-GB".encode(), headers=form)
    encoded = httpx.post(url, data={"text": "Le café.", "target_lang": "EN-GB"})
    assert raw.status_code == encoded.status_code == 200, raw.text
    assert raw.json() == encoded.json()
    assert raw.json()["translations"][0]["text"] == native(server, ["Le café."])[0]
    for body in (b"text=caf%E9&target_lang=EN-GB", b"text=caf\xe9&target_lang=EN-GB"):
        refused = httpx.post(url, content=body, headers=form)
        assert refused.status_code == 400 and "not UTF-8" in refused.json()["message"]


def test_keys_are_checked_and_the_quota_ends_in_456(keyed: Server):
    with pytest.raises(deepl.AuthorizationException):
        client(keyed, "wrong-key").translate_text("Bonjour.", target_lang="EN-GB")
    translator = client(keyed, "key-1:fx")
    assert translator.translate_text("Bonjour.", target_lang="EN-GB").text
    usage = translator.get_usage()
    assert usage.character.limit == 60
    with pytest.raises(deepl.QuotaExceededException):
        for _ in range(10):
            translator.translate_text("Un homme fait du vélo.", target_lang="EN-GB")


@pytest.mark.parametrize("text", ["Un homme.", "Merci !"])
def test_short_french_without_source_lang_is_read_as_the_only_source(server: Server, text: str):
    """DeepL clients usually omit source_lang, and detection misreads short texts ("Un homme."
    as Northern Sotho, "Merci !" as Czech, each below 10%). The only source language that
    translates into English here is French: the answer is French's, and says so."""
    result = client(server).translate_text(text, target_lang="EN-GB")
    assert result.detected_source_lang == "FR"
    assert result.text == native(server, [text])[0]


def test_a_sure_detection_of_an_unserved_language_is_still_refused(server: Server):
    german = "Ein Mann fährt mit dem Fahrrad durch die Stadt."  # 99.9% German: not a guess
    with pytest.raises(deepl.DeepLException, match="'de'") as raised:
        client(server).translate_text(german, target_lang="EN-GB")
    assert raised.value.http_status_code == 400


# Bodies a client can get wrong, each a 400 with DeepL's {"message"} (FastAPI's {"detail"}
# answered the form ones before).
UNREADABLE = [
    ("multipart/form-data", b"--x\r\ntext=Bonjour\r\n--x--\r\n"),  # no boundary
    (
        "multipart/form-data; boundary=x",
        b"--x\r\nContent-Disposition: form-data\r\n\r\nBonjour\r\n--x--\r\n",  # a part, no name
    ),
    ("application/json", b'{"text": ["Bonjour'),  # truncated
    ("application/json", b'{"text": ["\xff"], "target_lang": "EN-GB"}'),  # not UTF-8
    ("application/json", b'["Bonjour"]'),  # not an object
]


@pytest.mark.parametrize("path", ["/v2/translate", "/v2/languages", "/v2/usage"])
@pytest.mark.parametrize(("content_type", "body"), UNREADABLE)
def test_a_body_that_cannot_be_read_is_deepls_400(
    server: Server, path: str, content_type: str, body: bytes
):
    headers = {"content-type": content_type, "authorization": "DeepL-Auth-Key any-key"}
    answer = httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=60)
    assert answer.status_code == 400, answer.text
    assert list(answer.json()) == ["message"], answer.text


def test_a_wrong_content_type_and_a_wrong_method_answer_in_deepls_body(server: Server):
    form = b"text=Bonjour&target_lang=EN-GB"  # a form, sent as text
    answer = httpx.post(
        f"{server.url}/v2/translate", content=form, headers={"content-type": "text/plain"}
    )
    assert answer.status_code == 400
    assert answer.json() == {"message": "Parameter 'text' not specified."}
    answer = httpx.put(f"{server.url}/v2/translate", data={"text": "Bonjour"})
    assert answer.status_code == 405 and answer.json() == {"message": "Method Not Allowed"}


def test_with_a_key_configured_an_unreadable_body_without_one_is_403(keyed: Server):
    """The key is answered before the body: DeepL's 403, whatever the body holds."""
    for content_type, body in UNREADABLE:
        answer = httpx.post(
            f"{keyed.url}/v2/translate", content=body, headers={"content-type": content_type}
        )
        assert answer.status_code == 403, answer.text
        assert answer.json() == {"message": "Authorization failure, check auth_key."}
