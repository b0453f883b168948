"""A document's trees are freed by reference counting, not left to the cycle collector.

Reading a large document with the collector running held the GIL for up to a second at a time
(its full passes walk every object the parse made), which stood the event loop still; the
document work now runs with the collector paused (collection.py), which is only sound if that
work leaves no cyclic garbage behind: each format is read, re-read, laid out and written here
with the collector off, and nothing may be left for it to find."""

from __future__ import annotations

import gc
import io
from collections.abc import Callable

import openpyxl
import pytest

from service.documents import markup
from service.documents.collection import collector_paused
from service.documents.files import limits_of, read_upload, reopen
from service.documents.formats import DocumentRefused, format_named
from service.serving.settings import Settings
from tests.documents.test_opendocument import build_odt
from tests.documents.test_pptx import build as build_pptx
from tests.documents.word import word_file

LINES = ["Un homme <marche> dans la rue.", "Une femme & son chien courent.", "Il pleut."] * 20


def workbook() -> bytes:
    book = openpyxl.Workbook()
    for row, line in enumerate(LINES, 1):
        book.active.cell(row=row, column=1, value=line)
    data = io.BytesIO()
    book.save(data)
    return data.getvalue()


def subtitles() -> bytes:
    cues = [
        f"{i}\n00:00:{i:02d},000 --> 00:00:{i:02d},500\n{line}\n" for i, line in enumerate(LINES, 1)
    ]
    return "\n".join(cues).encode()


def page() -> bytes:
    paragraphs = "".join(
        f"<p>{line.replace('<', '&lt;').replace('&', '&amp;')} <b>Vite</b>, <i>vite</i>.</p>"
        for line in LINES
    )
    return f"<html><body><h1>Titre</h1>{paragraphs}</body></html>".encode()


FILES: dict[str, Callable[[], bytes]] = {
    "a.txt": lambda: "\n\n".join(LINES).encode(),
    "a.srt": subtitles,
    "a.html": page,
    "a.docx": lambda: word_file(LINES),
    "a.xlsx": workbook,
    "a.pptx": build_pptx,
    "a.odt": build_odt,
}


def cyclic_garbage_of(work: Callable[[], object]) -> int:
    """How many objects `work` leaves that only the cycle collector could free."""
    work()  # imports and caches first
    gc.collect()
    gc.disable()
    try:
        work()
        return gc.collect()
    finally:
        gc.enable()


@pytest.mark.parametrize("name", sorted(FILES))
def test_reading_and_writing_a_document_leaves_no_cycles(name: str) -> None:
    data, limits = FILES[name](), limits_of(Settings())
    kind = read_upload(data, name, None, limits).format.name
    extracted = reopen(kind, data, limits)
    layout = format_named(kind).markup
    assert cyclic_garbage_of(lambda: read_upload(data, name, None, limits)) == 0
    assert cyclic_garbage_of(lambda: reopen(kind, data, limits)) == 0
    assert cyclic_garbage_of(lambda: markup.read(extracted.segments, layout)) == 0
    assert cyclic_garbage_of(lambda: extracted.write(list(extracted.segments))) == 0


def test_the_collector_is_paused_while_any_document_work_runs_and_resumed_after() -> None:
    seen: list[bool] = []

    def inner() -> None:
        seen.append(gc.isenabled())

    def outer() -> None:
        seen.append(gc.isenabled())
        collector_paused(inner)
        seen.append(gc.isenabled())  # the inner call's end does not resume it

    assert gc.isenabled()
    collector_paused(outer)
    assert seen == [False, False, False] and gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        collector_paused(lambda: 1 / 0)
    assert gc.isenabled()


def test_a_refused_document_holds_nothing_while_its_refusal_is_answered() -> None:
    """A page refused after reading (too much text) used to be held by its error's traceback
    when the collector came back on, which then walked all of it (1.5 s for 3 MB of HTML, the
    event loop waiting): the failed call's frames are cleared first."""
    limits = limits_of(Settings(max_document_characters=1_000))
    page = b"<html><body>" + b"<p>Bonjour <b>le</b> monde.</p>\n" * 5_000 + b"</body></html>"
    gc.collect()
    before = len(gc.get_objects())
    try:
        collector_paused(read_upload, page, "a.html", None, limits)
    except DocumentRefused as refusal:
        held = len(gc.get_objects()) - before
        assert refusal.__traceback__ is not None  # still says where it failed
    else:
        pytest.fail("the page was not refused")
    assert held < 1_000, f"{held} objects of the refused page still alive"
