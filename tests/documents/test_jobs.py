"""The document worker without a model: how a document is cut into chunks, the throughput
behind seconds_remaining, the name a translated file is offered under, and what becomes of a
job whose server cannot translate it now (a real store; the model's side stands in)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import SecretStr

from service.documents import markup
from service.documents.files import result_name
from service.documents.formats.base import DocumentFormat
from service.documents.jobs import DocumentJobs, Throughput, _chunks, _measured
from service.serving.errors import ModelUnavailable, ServiceError, ShuttingDown, UnknownPair
from service.serving.settings import Settings
from service.store import NewDocument, StoreUnavailable, open_store

LAYOUT = markup.MarkupOptions(kind="xml", split="no_newlines", outline_detection=False)


def test_chunks_hold_about_the_sentences_asked_and_never_cut_a_segment():
    segments = [
        "Un chat dort.",  # 1 sentence
        "Un chien court. Il pleut. Le ciel est gris.",  # 3
        "12 345",  # none: no letters
        "Une femme lit.",  # 1
        "Deux enfants jouent. Ils rient.",  # 2
    ]
    measures = _measured(segments, LAYOUT)
    laid_out = markup.read(segments, LAYOUT)  # all at once, as the text API reads them
    assert measures == [(len(d.model_sentences), len(d.plain_text)) for d in laid_out]
    found = [sentences for sentences, _ in measures]
    assert found == [1, 3, 0, 1, 2]
    assert _chunks(found, 0, 2) == [(0, 2), (2, 5)]
    assert _chunks(found, 0, 100) == [(0, 5)]
    assert _chunks(found, 2, 1) == [(2, 4), (4, 5)]  # resumed after segment 2
    assert _chunks(found, 5, 2) == []


def test_seconds_remaining_follow_the_measured_rate():
    throughput = Throughput(weight=0.5)
    assert throughput.seconds_for(0) == 0
    throughput.observe(1000, 2.0)  # 500 characters/s
    assert throughput.seconds_for(5000) == 10
    throughput.observe(1000, 10.0)  # 100/s: the mean moves halfway, to 300/s
    assert throughput.seconds_for(3000) == 10
    throughput.observe(0, 1.0)  # nothing measured: unchanged
    assert throughput.seconds_for(3000) == 10


class _Docx(DocumentFormat):
    name = "docx"
    extensions = (".docx",)
    media_type = "application/octet-stream"

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        return False

    @classmethod
    def extract(cls, data, limits):  # type: ignore[override]
        raise NotImplementedError


def test_the_result_keeps_the_clients_base_name_and_nothing_else():
    assert result_name("rapport.docx", _Docx) == "rapport.docx"
    assert result_name("../../etc/passwd", _Docx) == "passwd.docx"
    assert result_name("C:\\Users\\x\\menu.docx", _Docx) == "menu.docx"
    assert result_name('a"b\x00\nc.docx', _Docx) == "abc.docx"
    assert result_name(None, _Docx) == "document.docx"
    assert result_name(".docx", _Docx) == "document.docx"
    assert result_name("rapport.txt", _Docx) == "rapport.txt.docx"


class _Unavailable:
    """The translation service's side of a server that cannot translate the pair now."""

    def __init__(self, error: ServiceError) -> None:
        self.error = error
        self.metrics = None

    def model_for(self, source_lang: str, target_lang: str) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "passed_over"),
    [
        (ShuttingDown("the drain ran out"), False),  # back to the queue for the next server
        (UnknownPair("fr", "en", []), True),  # unloaded: back, and passed over here till served
        (ModelUnavailable("fr-en"), True),
    ],
)
def test_a_job_the_server_cannot_translate_now_goes_back_to_the_queue(
    tmp_path: Path, error: ServiceError, passed_over: bool
):
    settings = Settings(database_url=SecretStr(f"sqlite:///{tmp_path / 'nmt.db'}"))
    store = open_store(settings)
    document = NewDocument("", "a.txt", "txt", "fr", "en", None, {}, 1, 13, b"Un chat dort.")
    document_id, key = store.documents.create(document, 3600)
    jobs = DocumentJobs(settings, _Unavailable(error), store)  # type: ignore[arg-type]
    job = store.documents.claim("w", lease_seconds=30)
    asyncio.run(jobs._translate_held("w", job))
    assert store.documents.status(document_id, key).status == "queued"
    assert (document_id in jobs._waiting) == passed_over


def test_a_chunk_longer_than_the_lease_keeps_its_job(tmp_path: Path):
    """The lease is renewed while a chunk runs (here: a 2.5 s wait under a 1 s lease, renewed
    every third of a second), so no other worker claims the job meanwhile; once the chunk is
    over, renewing stops."""
    settings = Settings(
        database_url=SecretStr(f"sqlite:///{tmp_path / 'nmt.db'}"), document_lease_seconds=1.0
    )
    store = open_store(settings)
    document = NewDocument("", "a.txt", "txt", "fr", "en", None, {}, 1, 13, b"Un chat dort.")
    store.documents.create(document, 3600)
    jobs = DocumentJobs(settings, _Unavailable(ShuttingDown()), store)  # type: ignore[arg-type]
    job = store.documents.claim("w", lease_seconds=1.0)

    async def chunk() -> None:
        async with jobs._lease_kept(job, "w"):
            await asyncio.sleep(2.5)
            assert await asyncio.to_thread(store.documents.claim, "other", 1.0) is None

    asyncio.run(chunk())
    time.sleep(2.5)  # past the last renewal's lease: the job is claimable again
    taken = store.documents.claim("other", lease_seconds=30)
    assert taken is not None and taken.document_id == job.document_id


class _Served:
    """The translation service's side of a server that serves the pair."""

    metrics = None

    def model_for(self, source_lang: str, target_lang: str) -> object:
        return SimpleNamespace(first_token=None)


def test_a_job_whose_store_stops_answering_is_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The store failing mid-job (here: reading the job's glossary) is the server's trouble,
    not the document's: the job goes back to the queue, not to `error`."""
    settings = Settings(database_url=SecretStr(f"sqlite:///{tmp_path / 'nmt.db'}"))
    store = open_store(settings)
    document = NewDocument("", "a.txt", "txt", "fr", "en", "g1", {}, 1, 13, b"Un chat dort.")
    document_id, key = store.documents.create(document, 3600)

    def unavailable(*args: object) -> None:
        raise StoreUnavailable("the database is unavailable: gone")

    monkeypatch.setattr(store.glossaries, "dictionary", unavailable)
    jobs = DocumentJobs(settings, _Served(), store)  # type: ignore[arg-type]
    job = store.documents.claim("w", lease_seconds=30)
    asyncio.run(jobs._translate_held("w", job))
    assert store.documents.status(document_id, key).status == "queued"
