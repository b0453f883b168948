"""Whole documents through the API: the official `deepl` client's document round trip and
LibreTranslate's /translate_file against a real server; DeepL's statuses (404 for a wrong key
or a second download, 503 before the result); hostile files refused at once with a clear 4xx;
a server killed mid-document finishing the job after a restart; two servers on one PostgreSQL.

The formats themselves (structure kept, runs on their translations) are tested one by one in
tests/documents/."""

from __future__ import annotations

import io
import signal
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import deepl
import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from service.serving.settings import Settings
from tests.documents.word import paragraphs_of, word_file
from tests.http.in_process import start
from tests.servers import running_server, wait_until

SENTENCES = [
    "Un homme en chemise bleue est assis sur une chaise.",
    "Deux chiens jouent dans la neige.",
    "Une femme lit un livre dans le parc.",
    "Des enfants courent sur la plage.",
]


def subtitles(lines: list[str]) -> str:
    cues = []
    for number, line in enumerate(lines, 1):
        start, end = number * 2, number * 2 + 1
        cues.append(f"{number}\n00:00:{start:02},000 --> 00:00:{end:02},500\n{line}\n")
    return "\n".join(cues)


def text_api(url: str, texts: list[str]) -> list[str]:
    answer = httpx.post(
        f"{url}/v1/translate",
        json={"text": texts, "source_lang": "fr", "target_lang": "en"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return [item["text"] for item in answer.json()["translations"]]


# --- against a real server -------------------------------------------------------------------


def own_database(folder: Path) -> str:
    """A store of the test's own (the session's NMT_DATABASE_URL is every server's, and
    another server's workers would take this one's jobs)."""
    return f"sqlite:///{folder / 'nmt.db'}"


@pytest.fixture(scope="module")
def server(model_dir: Path, logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    state = tmp_path_factory.mktemp("documents-state")
    with running_server(
        model_dir, logs, database_url=own_database(state), document_poll_seconds=0.2
    ) as running:
        yield running


def test_the_official_deepl_client_translates_a_word_document(server, tmp_path: Path):
    source, target = tmp_path / "menu.docx", tmp_path / "menu.en.docx"
    source.write_bytes(word_file(SENTENCES))
    translator = deepl.Translator("any-key", server_url=server.url)
    status = translator.translate_document_from_filepath(
        source, target, source_lang="FR", target_lang="EN-US"
    )
    assert status.done and status.billed_characters == sum(map(len, SENTENCES))
    assert paragraphs_of(target.read_bytes()) == text_api(server.url, SENTENCES)


def test_deepl_statuses_a_wrong_key_and_a_second_download_are_404(server):
    answer = httpx.post(
        f"{server.url}/v2/document",
        data={"target_lang": "EN-GB", "source_lang": "FR"},
        files={"file": ("a.srt", subtitles(SENTENCES[:2]).encode())},
    )
    assert answer.status_code == 200, answer.text
    handle = answer.json()
    assert set(handle) == {"document_id", "document_key"}
    status_url = f"{server.url}/v2/document/{handle['document_id']}"
    wrong = httpx.post(status_url, json={"document_key": "0" * 64})
    assert wrong.status_code == 404 and "message" in wrong.json()
    for missing, message in (({}, "not specified"), ({"document_key": 1}, "expected a string")):
        refused = httpx.post(status_url, json=missing)
        assert refused.status_code == 400 and message in refused.json()["message"], refused.text

    def finished() -> dict | None:
        body = httpx.post(status_url, json={"document_key": handle["document_key"]}).json()
        return body if body["status"] in ("done", "error") else None

    final = wait_until(finished, 120, "the subtitles translated", every=0.2)
    assert final["status"] == "done", final
    assert final["billed_characters"] == sum(map(len, SENTENCES[:2]))
    result = httpx.post(f"{status_url}/result", json={"document_key": handle["document_key"]})
    assert result.status_code == 200
    assert "attachment" in result.headers["content-disposition"]
    translated = result.text
    assert "00:00:02,000 --> 00:00:03,500" in translated
    assert all(line in translated for line in text_api(server.url, SENTENCES[:2]))
    again = httpx.post(f"{status_url}/result", json={"document_key": handle["document_key"]})
    assert again.status_code == 404


def test_a_paragraph_too_long_for_one_sentence_is_translated_in_pieces(server):
    """A paragraph without a sentence end, past NMT_MAX_TOKENS_PER_SENTENCE: the text API
    refuses it, naming the limit, for its client to split; a document has no one to split
    it, so it is cut at spaces and translated (before, the whole file failed)."""
    clause = "un homme en chemise bleue marche dans la rue avec son chien"
    paragraph = ", ".join([clause] * 30) + "."  # about 450 tokens, no sentence end before
    refused = httpx.post(
        f"{server.url}/v1/translate",
        json={"text": paragraph, "source_lang": "fr", "target_lang": "en"},
        timeout=60,
    )
    assert refused.status_code == 422 and "tokens per sentence" in refused.text
    answer = httpx.post(
        f"{server.url}/translate_file",
        data={"source": "fr", "target": "en"},
        files={"file": ("long.txt", f"Un chien dort.\n\n{paragraph}\n".encode())},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    translated = httpx.get(answer.json()["translatedFileUrl"]).text
    first, second = translated.split("\n\n")
    assert first == text_api(server.url, ["Un chien dort."])[0]
    assert "man" in second and "homme" not in second


def test_libretranslate_translate_file_answers_with_a_download_url(server):
    answer = httpx.post(
        f"{server.url}/translate_file",
        data={"source": "fr", "target": "en"},
        files={"file": ("notes.txt", "\n\n".join(SENTENCES[2:]).encode())},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    url = answer.json()["translatedFileUrl"]
    assert url.startswith(server.url + "/download_file/") and url.endswith("notes.txt")
    download = httpx.get(url)
    assert download.status_code == 200
    assert download.text.split("\n\n") == text_api(server.url, SENTENCES[2:])
    settings = httpx.get(f"{server.url}/frontend/settings").json()
    assert settings["filesTranslation"] is True
    assert {".docx", ".srt", ".xlf", ".txt"} <= set(settings["supportedFilesFormat"])
    assert httpx.get(url.replace("/download_file/", "/download_file/0")).status_code == 404


# --- in process: refusals, no worker --------------------------------------------------------


@pytest.fixture(scope="module")
def idle(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A server that takes uploads and translates none (NMT_DOCUMENT_WORKERS=0)."""
    state = tmp_path_factory.mktemp("idle-state")
    client = start(
        Settings(
            model_dir=model_dir,
            database_url=SecretStr(own_database(state)),
            document_workers=0,
            max_document_bytes=200_000,
            max_document_characters=2_000,
        )
    )
    yield client
    client.__exit__(None, None, None)


def deepl_upload(client: TestClient, name: str, data: bytes, **fields: str):
    return client.post(
        "/v2/document",
        data={"target_lang": "EN-US", "source_lang": "FR", **fields},
        files={"file": (name, data)},
    )


def test_a_result_not_ready_is_503_and_its_status_is_queued(idle: TestClient):
    handle = deepl_upload(idle, "a.txt", b"Un chat dort.").json()
    status = idle.post(f"/v2/document/{handle['document_id']}", json=handle | {}).json()
    assert status["status"] == "queued"
    result = idle.post(
        f"/v2/document/{handle['document_id']}/result",
        json={"document_key": handle["document_key"]},
    )
    assert result.status_code == 503 and "not ready" in result.json()["message"]


def zipped(members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def word_file_with(extra: dict[str, bytes]) -> bytes:
    """A real Word file with members added (or replaced)."""
    with zipfile.ZipFile(io.BytesIO(word_file(["Un chat dort."]))) as original:
        members = {name: original.read(name) for name in original.namelist()}
    return zipped(members | extra)


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"><file source-language="fr"
datatype="plaintext" original="x"><body><trans-unit id="1"><source>&lol3;</source></trans-unit>
</body></file></xliff>"""
EXTERNAL_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE x [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"><file source-language="fr"
datatype="plaintext" original="x"><body><trans-unit id="1"><source>&secret;</source>
</trans-unit></body></file></xliff>"""
MACRO_TYPES = b"""<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">
<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>
<Default Extension="xml" ContentType="application/xml"/>
<Default Extension="bin" ContentType="application/vnd.ms-office.vbaProject"/>
<Override PartName="/word/document.xml"
ContentType="application/vnd.ms-word.document.macroEnabled.main+xml"/></Types>"""


@pytest.mark.parametrize(
    ("name", "data", "status", "says"),
    [
        ("bomb.docx", word_file_with({"word/big.xml": b"\0" * 50_000_000}), 413, "zip bomb"),
        ("evil.docx", word_file_with({"../../etc/cron.d/x": b"x"}), 400, "outside the archive"),
        ("evil.docx", word_file_with({"/abs/x": b"x"}), 400, "outside the archive"),
        (
            "macro.docx",
            word_file_with({"[Content_Types].xml": MACRO_TYPES, "word/vbaProject.bin": b"x"}),
            400,
            "macro",
        ),
        ("laughs.xlf", BILLION_LAUGHS, 400, "entities"),
        ("secret.xlf", EXTERNAL_ENTITY, 400, "entities"),
        ("picture.docx", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, 400, "not in a format"),
        ("big.txt", b"Un chat dort. " * 20_000, 413, "NMT_MAX_DOCUMENT_BYTES"),
        ("long.txt", b"Un chat dort. " * 200, 413, "NMT_MAX_DOCUMENT_CHARACTERS"),
        ("empty.txt", b"", 400, "empty"),
    ],
)
def test_hostile_files_are_refused_at_once_with_a_clear_4xx(
    idle: TestClient, name: str, data: bytes, status: int, says: str
):
    answer = deepl_upload(idle, name, data)
    assert answer.status_code == status, answer.text
    assert says in answer.json()["message"]
    libre = idle.post(
        "/translate_file", data={"source": "fr", "target": "en"}, files={"file": (name, data)}
    )
    assert libre.status_code == status and says in libre.json()["error"]


def test_uploads_with_missing_fields_are_400_in_each_dialect(idle: TestClient):
    no_file = idle.post("/v2/document", data={"target_lang": "EN-US"})
    assert no_file.status_code == 400 and "file" in no_file.json()["message"]
    no_target = idle.post("/v2/document", files={"file": ("a.txt", b"Un chat.")})
    assert no_target.status_code == 400 and "target_lang" in no_target.json()["message"]
    unknown = deepl_upload(idle, "a.txt", b"Un chat.", target_lang="JA")
    assert unknown.status_code == 400
    not_multipart = idle.post("/v2/document", json={"target_lang": "EN-US"})
    assert not_multipart.status_code == 400
    two = [("file", ("a.txt", b"Un chat.")), ("file", ("b.txt", b"Un chien."))]
    both = idle.post("/v2/document", data={"target_lang": "EN-US"}, files=two)
    assert both.status_code == 400 and "one file per upload" in both.json()["message"]
    both = idle.post("/translate_file", data={"source": "fr", "target": "en"}, files=two)
    assert both.status_code == 400 and "one file per upload" in both.json()["error"]
    converted = deepl_upload(idle, "a.txt", b"Un chat.", output_format="pdf")
    assert converted.status_code == 400 and "conversion" in converted.json()["message"]
    no_source = idle.post(
        "/translate_file", data={"target": "en"}, files={"file": ("a.txt", b"Un chat.")}
    )
    assert no_source.status_code == 400 and "source" in no_source.json()["error"]


# --- durability ------------------------------------------------------------------------------


def status_of(url: str, handle: dict) -> dict:
    return httpx.post(
        f"{url}/v2/document/{handle['document_id']}", json={"document_key": handle["document_key"]}
    ).json()


@pytest.mark.slow
def test_a_server_killed_mid_document_finishes_it_after_a_restart(
    model_dir: Path, logs: Path, tmp_path: Path
):
    """Chunks of 2 sentences, a lease of 3 s: the server is SIGKILLed once some chunks are
    kept; restarted on the same store, it takes the job over after the lease and finishes.
    The translation cache is off, so that every chunk runs the model: with it, the repeated
    sentences made the job finish on a fast machine between two polls."""
    paragraphs = [SENTENCES[i % len(SENTENCES)] for i in range(120)]
    settings = dict(
        database_url=own_database(tmp_path),
        cache_entries=0,
        document_chunk_sentences=2,
        document_lease_seconds=3,
        document_poll_seconds=0.2,
        threads=1,
    )
    with running_server(model_dir, logs, **settings) as first:
        handle = httpx.post(
            f"{first.url}/v2/document",
            data={"target_lang": "EN-US", "source_lang": "FR"},
            files={"file": ("long.docx", word_file(paragraphs))},
        ).json()

        def part_done() -> bool:
            status = status_of(first.url, handle)
            if status["status"] in ("done", "error"):
                pytest.fail(f"the job ended before the server could be killed: {status}")
            return status["status"] == "translating" and status["progress"] > 0

        wait_until(part_done, 120, "a first chunk kept", every=0.05)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
    with running_server(model_dir, logs, **settings) as second:
        final = wait_until(
            lambda: (s := status_of(second.url, handle))["status"] in ("done", "error") and s,
            180,
            "the job finished after the restart",
        )
        assert final["status"] == "done", final
        result = httpx.post(
            f"{second.url}/v2/document/{handle['document_id']}/result",
            json={"document_key": handle["document_key"]},
        )
        expected = text_api(second.url, SENTENCES)
        assert paragraphs_of(result.content) == [expected[i % 4] for i in range(120)]
        assert '"resumed_at": ' in second.log()  # it went on after the chunks kept


@pytest.mark.slow
def test_a_long_document_takes_turns_with_a_short_one_uploaded_after_it(
    model_dir: Path, logs: Path, tmp_path: Path
):
    """One worker, a turn of half a second: a one-line file uploaded while a 120-paragraph one
    translates is done before it (first come, first served would make it wait for the whole
    file), and the long one then finishes whole, each paragraph once."""
    paragraphs = [SENTENCES[i % len(SENTENCES)] for i in range(120)]
    settings = dict(
        database_url=own_database(tmp_path),
        cache_entries=0,  # every chunk runs the model (see the test above)
        document_chunk_sentences=2,
        document_poll_seconds=0.2,
        document_turn_seconds=0.5,
        document_workers=1,
        threads=1,
    )
    with running_server(model_dir, logs, **settings) as server:

        def upload(name: str, data: bytes) -> dict:
            return httpx.post(
                f"{server.url}/v2/document",
                data={"target_lang": "EN-US", "source_lang": "FR"},
                files={"file": (name, data)},
            ).json()

        def status(handle: dict) -> dict:
            return status_of(server.url, handle)

        long = upload("long.docx", word_file(paragraphs))
        wait_until(lambda: status(long)["progress"] > 0, 120, "the long file begun", every=0.05)
        short = upload("short.txt", SENTENCES[1].encode())
        final = wait_until(
            lambda: (s := status(short))["status"] in ("done", "error") and s, 120, "short done"
        )
        assert final["status"] == "done", final
        assert status(long)["status"] in ("queued", "translating"), status(long)
        finished = wait_until(
            lambda: (s := status(long))["status"] in ("done", "error") and s, 180, "long done"
        )
        assert finished["status"] == "done", finished
        result = httpx.post(
            f"{server.url}/v2/document/{long['document_id']}/result",
            json={"document_key": long["document_key"]},
        )
        expected = text_api(server.url, SENTENCES)
        assert paragraphs_of(result.content) == [expected[i % 4] for i in range(120)]
        assert "document gives up its turn" in server.log()


@pytest.mark.slow
def test_two_servers_on_one_postgresql_share_their_jobs(
    model_dir: Path, logs: Path, postgres_url: str
):
    """Uploaded to one (which translates nothing), translated by the other, polled and
    downloaded from either."""
    with (
        running_server(model_dir, logs, database_url=postgres_url, document_workers=0) as front,
        running_server(
            model_dir, logs, database_url=postgres_url, document_poll_seconds=0.2
        ) as back,
    ):
        handle = httpx.post(
            f"{front.url}/v2/document",
            data={"target_lang": "EN-US", "source_lang": "FR"},
            files={"file": ("shared.docx", word_file(SENTENCES[:2]))},
        ).json()
        final = wait_until(
            lambda: (s := status_of(front.url, handle))["status"] in ("done", "error") and s,
            120,
            "the other server translated it",
        )
        assert final["status"] == "done", final
        result = httpx.post(
            f"{back.url}/v2/document/{handle['document_id']}/result",
            json={"document_key": handle["document_key"]},
        )
        assert paragraphs_of(result.content) == text_api(front.url, SENTENCES[:2])
        assert "document done" in back.log()


def test_a_document_whose_model_is_unloaded_waits_for_it_and_loses_nothing(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
):
    """An admin unloads fr-en while a document is being translated and another waits behind
    it: both go back to the queue (chunks kept) instead of failing, and both finish, as the
    text API translates them, once the model is loaded again."""
    state = tmp_path_factory.mktemp("reload-state")
    settings = Settings(
        model_dir=model_dir,
        threads=1,
        database_url=SecretStr(own_database(state)),
        document_poll_seconds=0.05,
        document_chunk_sentences=2,
    )
    client = start(settings)
    try:
        paragraphs = [f"{sentence} ({n})" for n in range(20) for sentence in SENTENCES]
        handles = [
            deepl_upload(client, f"{name}.txt", "\n\n".join(paragraphs).encode()).json()
            for name in ("first", "second")
        ]

        def status(handle: dict) -> dict:
            return client.post(f"/v2/document/{handle['document_id']}", json=handle).json()

        translating = lambda: status(handles[0])["status"] == "translating"  # noqa: E731
        wait_until(translating, 60, "the first document being translated", every=0.02)
        assert client.post("/v1/models/fr-en/unload").status_code == 200
        for _ in range(10):  # the workers poll 20 times a second
            assert {status(h)["status"] for h in handles} <= {"queued", "translating"}
            time.sleep(0.1)
        assert client.post("/v1/models/fr-en/load").status_code == 200
        done = lambda: all(status(h)["status"] == "done" for h in handles)  # noqa: E731
        wait_until(done, 120, "both documents translated")
        expected = []
        for first in range(0, len(paragraphs), 20):  # (NMT_MAX_TEXTS_PER_REQUEST)
            texts = paragraphs[first : first + 20]
            answer = client.post(
                "/v1/translate", json={"text": texts, "source_lang": "fr", "target_lang": "en"}
            )
            expected += [item["text"] for item in answer.json()["translations"]]
        for handle in handles:
            result = client.post(f"/v2/document/{handle['document_id']}/result", json=handle)
            assert result.status_code == 200, result.text
            assert result.text.split("\n\n") == expected
    finally:
        client.__exit__(None, None, None)


def test_a_status_poll_has_an_ordinary_body_limit_not_the_uploads(idle: TestClient):
    """Only the upload itself may carry a file's bytes: a poll of its status or result with
    a body past NMT_MAX_BODY_BYTES is a 413 (it used to take the upload's limit, and its
    JSON, megabytes of it, was parsed on the event loop)."""
    handle = deepl_upload(idle, "a.txt", b"Un chat dort.").json()
    big = b'{"document_key": "' + b"x" * Settings().max_body_bytes + b'"}'
    headers = {"content-type": "application/json"}
    for path in (
        f"/v2/document/{handle['document_id']}",
        f"/v2/document/{handle['document_id']}/result",
    ):
        answer = idle.post(path, content=big, headers=headers)
        assert answer.status_code == 413, (path, answer.text)
    assert idle.post(f"/v2/document/{handle['document_id']}", json=handle).status_code == 200


def test_a_key_or_a_glossary_id_that_is_not_unicode_finds_nothing(idle: TestClient):
    """Found by fuzzing: a lone surrogate (JSON's "\\ud800") as a document's key, or as the
    glossary of a translation, reached the database driver and failed there (a 500)."""
    handle = deepl_upload(idle, "a.txt", b"Un chat dort.").json()
    headers = {"content-type": "application/json"}
    lone = '{"document_key": "\\ud800"}'
    for path in (
        f"/v2/document/{handle['document_id']}",
        f"/v2/document/{handle['document_id']}/result",
    ):
        answer = idle.post(path, content=lone, headers=headers)
        assert answer.status_code == 404, answer.text
    body = '{"text": ["Bonjour"], "source_lang": "FR", "target_lang": "EN", "glossary_id": '
    body += '"\\ud800"}'
    answer = idle.post("/v2/translate", content=body, headers=headers)
    assert answer.status_code == 404 and answer.json() == {"message": "Glossary not found."}
