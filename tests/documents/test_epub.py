"""EPUB: a book built with ebooklib, its spine documents, table of contents and title
translated as the text API translates each paragraph, every other member byte for byte, the
result read back by ebooklib."""

from __future__ import annotations

import io
import zipfile
from collections import Counter
from functools import partial
from pathlib import Path

import ebooklib
import pytest
from ebooklib import epub
from fastapi.testclient import TestClient
from lxml import etree

from service.documents.formats.base import DocumentLimits, DocumentRefused
from service.documents.formats.epub import EpubFormat
from tests.documents.conftest import SegmentTranslator
from tests.documents.test_html import translate_with_kind

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
CSS = b"p { margin: 0; }"
CHAPTER_ONE = (
    "<h1>Un homme est assis sur un banc.</h1>"
    "<p id='dog'>Un chien <b>noir</b> court dans l'herbe.</p>"
    "<p>Un homme joue de la guitare.<br/>Une femme chante.</p>"
    "<div>Une femme <i>marche</i> dans la rue.<p>Un chat dort.</p></div>"
    "<p>Un enfant <code>x = 1</code> joue.</p>"
    "<p><img src='images/chien.png' alt='un chien'/></p>"
)
CHAPTER_TWO = "<h2>Des gens marchent dans la rue.</h2><ul><li>Un garçon saute dans l'eau.</li></ul>"
CHAPTERS = ("EPUB/chap_01.xhtml", "EPUB/chap_02.xhtml", "EPUB/nav.xhtml")


@pytest.fixture(scope="module")
def book_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    book = epub.EpubBook()
    book.set_identifier("livre-1")
    book.set_title("Un chien dans l'herbe")
    book.set_language("fr")
    book.add_author("Une femme")
    style = epub.EpubItem(
        uid="style", file_name="style/main.css", media_type="text/css", content=CSS
    )
    image = epub.EpubImage(
        uid="photo", file_name="images/chien.png", media_type="image/png", content=PNG
    )
    one = epub.EpubHtml(title="Chapitre un", file_name="chap_01.xhtml", lang="fr")
    one.content = CHAPTER_ONE
    one.add_item(style)
    two = epub.EpubHtml(title="Chapitre deux", file_name="chap_02.xhtml", lang="fr")
    two.content = CHAPTER_TWO
    for item in (style, image, one, two):
        book.add_item(item)
    book.toc = (
        epub.Link("chap_01.xhtml", "Chapitre un", "c1"),
        epub.Link("chap_02.xhtml", "Chapitre deux", "c2"),
    )
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", one, two]
    path = tmp_path_factory.mktemp("epub") / "livre.epub"
    epub.write_epub(str(path), book, {})
    return path.read_bytes()


@pytest.fixture(scope="module")
def translate_html(document_client: TestClient) -> SegmentTranslator:
    return partial(translate_with_kind, document_client)


def read_book(data: bytes, folder: Path) -> epub.EpubBook:
    path = folder / "read.epub"
    path.write_bytes(data)
    return epub.read_epub(str(path), {"ignore_ncx": False})


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def elements(xhtml: bytes) -> Counter:
    """Each element of a document, by name and attributes (the language ones apart)."""
    skip = {"lang", "{http://www.w3.org/XML/1998/namespace}lang"}
    return Counter(
        (e.tag, tuple(sorted((k, v) for k, v in e.attrib.items() if k not in skip)))
        for e in etree.fromstring(xhtml).iter()
    )


def extract(data: bytes, limits: DocumentLimits | None = None):
    return EpubFormat.extract(data, limits or DocumentLimits())


def test_sniff_is_judged_from_content(book_bytes: bytes) -> None:
    assert EpubFormat.sniff(book_bytes)

    def zipped(entries: dict[str, bytes]) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            for name, data in entries.items():
                archive.writestr(name, data)
        return out.getvalue()

    assert not EpubFormat.sniff(zipped({"mimetype": b"application/vnd.oasis.opendocument.text"}))
    assert not EpubFormat.sniff(zipped({"word/document.xml": b"<w/>"}))
    assert not EpubFormat.sniff(b"application/epub+zip")


def test_segments_are_the_paragraphs_and_labels(book_bytes: bytes) -> None:
    assert extract(book_bytes).segments == [
        # nav.xhtml (first in the spine): its title, heading and the table of contents
        "Un chien dans l'herbe",
        "Un chien dans l'herbe",
        '\n          <a href="chap_01.xhtml">Chapitre un</a>\n        ',
        '\n          <a href="chap_02.xhtml">Chapitre deux</a>\n        ',
        # chap_01.xhtml: paragraphs with their inline markup; a div's own text between blocks
        "Chapitre un",
        "Un homme est assis sur un banc.",
        "Un chien <b>noir</b> court dans l'herbe.",
        "Un homme joue de la guitare.<br/>Une femme chante.",
        "Une femme <i>marche</i> dans la rue.",
        "Un chat dort.",
        "Un enfant <code>x = 1</code> joue.",
        # chap_02.xhtml
        "Chapitre deux",
        "Des gens marchent dans la rue.",
        "Un garçon saute dans l'eau.",
        # toc.ncx: the book's title and each navigation label
        "Un chien dans l'herbe",
        "Chapitre un",
        "Chapitre deux",
        # content.opf: dc:title
        "Un chien dans l'herbe",
    ]


def test_translated_as_the_text_api_translates_each_segment(
    book_bytes: bytes, translate_html: SegmentTranslator, tmp_path: Path
) -> None:
    extracted = extract(book_bytes)
    translations = translate_html(extracted.segments, EpubFormat)
    extracted.target_language = "en"
    out = extracted.write(translations)

    # Read back, the book's segments are the translations: each went where its source was.
    assert extract(out).segments == translations
    assert all(t != s for t, s in zip(translations, extracted.segments, strict=True))
    before, after = members(book_bytes), members(out)
    assert list(after) == list(before)
    for name in CHAPTERS:
        assert elements(after[name]) == elements(before[name])  # every element, once
        assert etree.fromstring(after[name]).get("lang") == "en"
    # ebooklib reads the translated book.
    book = read_book(out, tmp_path)
    assert book.get_metadata("DC", "language")[0][0] == "en"
    assert book.get_metadata("DC", "title")[0][0] == translations[-1]
    assert [item.file_name for item in book.get_items_of_type(ebooklib.ITEM_DOCUMENT)] == [
        item.file_name
        for item in read_book(book_bytes, tmp_path).get_items_of_type(ebooklib.ITEM_DOCUMENT)
    ]
    chapter = etree.fromstring(book.get_item_with_href("chap_01.xhtml").get_content())
    paragraphs = ["".join(p.itertext()) for p in chapter.iter("{*}p")]
    assert paragraphs[0] == "".join(etree.fromstring(f"<p>{translations[6]}</p>").itertext())


def test_formatted_word_lands_on_its_translation(
    book_bytes: bytes, translate_html: SegmentTranslator
) -> None:
    extracted = extract(book_bytes)
    out = extracted.write(translate_html(extracted.segments, EpubFormat))
    chapter = etree.fromstring(members(out)["EPUB/chap_01.xhtml"])
    namespaces = {"x": "http://www.w3.org/1999/xhtml"}
    assert chapter.xpath("//x:p[@id='dog']/x:b/text()", namespaces=namespaces) == ["black"]
    italic = chapter.xpath("//x:i/text()", namespaces=namespaces)
    assert italic in (["walking"], ["is walking"])  # "marche"
    assert chapter.xpath("//x:code/text()", namespaces=namespaces) == ["x = 1"]


def test_other_members_are_copied_byte_for_byte(book_bytes: bytes) -> None:
    extracted = extract(book_bytes)
    extracted.target_language = "en"
    out = extracted.write([f"<b>{i}</b> mot" for i in range(len(extracted.segments))])
    before, after = members(book_bytes), members(out)
    for name in ("mimetype", "META-INF/container.xml", "EPUB/style/main.css"):
        assert after[name] == before[name]
    assert after["EPUB/images/chien.png"] == PNG
    with zipfile.ZipFile(io.BytesIO(out)) as archive:
        first = archive.infolist()[0]
        assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED


def test_identity_round_trip_is_byte_for_byte(book_bytes: bytes) -> None:
    extracted = extract(book_bytes)
    assert extracted.write(extracted.segments) == book_bytes


def test_entities_in_a_content_document_are_refused(book_bytes: bytes) -> None:
    entries = members(book_bytes)
    entries["EPUB/chap_02.xhtml"] = (
        b'<?xml version="1.0"?><!DOCTYPE html [<!ENTITY a "aaaaaaaaaa">]>'
        b'<html xmlns="http://www.w3.org/1999/xhtml"><body><p>&a;</p></body></html>'
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    with pytest.raises(DocumentRefused, match="entities"):
        extract(out.getvalue())


def test_more_text_than_the_limit_is_refused(book_bytes: bytes) -> None:
    with pytest.raises(DocumentRefused) as refused:
        extract(book_bytes, DocumentLimits(max_characters=100))
    assert refused.value.status == 413
