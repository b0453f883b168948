"""The document worker's arithmetic without a model: how a document is cut into chunks, the
throughput behind seconds_remaining, and the name a translated file is offered under."""

from __future__ import annotations

from service.documents import markup
from service.documents.files import result_name
from service.documents.formats.base import DocumentFormat
from service.documents.jobs import Throughput, _chunks

LAYOUT = markup.MarkupOptions(kind="xml", split="no_newlines", outline_detection=False)


def documents(*segments: str) -> list[markup.Document]:
    return markup.read(list(segments), LAYOUT)


def test_chunks_hold_about_the_sentences_asked_and_never_cut_a_segment():
    found = documents(
        "Un chat dort.",  # 1 sentence
        "Un chien court. Il pleut. Le ciel est gris.",  # 3
        "12 345",  # none: no letters
        "Une femme lit.",  # 1
        "Deux enfants jouent. Ils rient.",  # 2
    )
    assert [len(d.model_sentences) for d in found] == [1, 3, 0, 1, 2]
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
