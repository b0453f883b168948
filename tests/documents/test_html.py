"""A whole HTML page: each run of text translated as the text API's tag_handling=html
translates it, in place; every element, script and style kept; the page read by html.parser and
lxml.html afterwards; its encoding read and kept."""

from __future__ import annotations

from collections import Counter
from functools import partial
from html.parser import HTMLParser

import lxml.html
import pytest
from fastapi.testclient import TestClient

from service.documents.formats.base import DocumentFormat, DocumentLimits, DocumentRefused
from service.documents.formats.html import HtmlFormat
from service.documents.formats.xliff import XliffFormat
from tests.documents.conftest import SegmentTranslator

PAGE = """<!DOCTYPE html>
<html lang="fr">
<head>
  <meta charset="utf-8">
  <title>Un chien dans l'herbe</title>
  <style>p { color: red; } /* Un chat */</style>
  <script>var texte = "Un chat dort." && 1 < 2;</script>
</head>
<body>
  <!-- Un commentaire -->
  <h1 class="titre">Un homme est assis sur un banc.</h1>
  <p id="dog">Un chien <b>noir</b> court dans l'herbe.</p>
  <p>Un homme joue de la guitare.<br>Une femme chante.</p>
  <ul>
    <li>Une femme <i>marche</i> dans la rue.
    <li>Un enfant <code>x = 1</code> joue.
  </ul>
  <p translate="no">Ne pas traduire.</p>
  <p class="notranslate">Rien ici.</p>
  <table><tr><td>Un chat dort.</td><td>42</td></tr></table>
  <p>Des gens marchent dans la rue.</span></p>
</body>
</html>
"""


def translate_with_kind(
    client: TestClient, segments: list[str], format: type[DocumentFormat]
) -> list[str]:
    """Segments as the text API translates them with the format's tag handling (html here:
    conftest's translate_segments always asks for xml)."""
    answer = client.post(
        "/v2/translate",
        data={
            "text": segments,
            "source_lang": "FR",
            "target_lang": "EN-US",
            "tag_handling": format.markup.kind,
            "outline_detection": "0",
            "split_sentences": "nonewlines",
        },
    )
    assert answer.status_code == 200, answer.text
    return [item["text"] for item in answer.json()["translations"]]


@pytest.fixture(scope="module")
def translate_html(document_client: TestClient) -> SegmentTranslator:
    return partial(translate_with_kind, document_client)


class _Elements(HTMLParser):
    """The page's elements (name and attributes) and whether anything was left unread."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: Counter = Counter()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements[(tag, tuple(sorted(attrs)))] += 1

    handle_startendtag = handle_starttag


def elements(page: str, without_lang: bool = True) -> Counter:
    reader = _Elements()
    reader.feed(page)
    reader.close()
    if without_lang:
        return Counter(
            {
                (tag, tuple(a for a in attrs if a[0] != "lang")): n
                for (tag, attrs), n in reader.elements.items()
            }
        )
    return reader.elements


def extract(page: str | bytes, limits: DocumentLimits | None = None):
    data = page.encode() if isinstance(page, str) else page
    return HtmlFormat.extract(data, limits or DocumentLimits())


def test_sniff_is_judged_from_content() -> None:
    assert HtmlFormat.sniff(PAGE.encode())
    assert HtmlFormat.sniff(b"\n<!-- made by hand -->\n<HTML><body>Un chat.</body></HTML>")
    assert HtmlFormat.sniff(
        b'<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n<html xmlns="x"></html>'
    )
    assert HtmlFormat.sniff(PAGE.encode("utf-16"))
    assert not HtmlFormat.sniff(b"Un chat dort. <html> est une balise.")
    assert not HtmlFormat.sniff(b"<p>Un fragment, pas une page.</p>")
    assert not XliffFormat.sniff(PAGE.encode())


def test_a_segment_for_each_run_with_text() -> None:
    """Title, heading, paragraphs, list items, cells: one segment each, as the source writes
    them; what is script, style, untranslated or has no letters is not a segment."""
    assert extract(PAGE).segments == [
        "Un chien dans l'herbe",
        "Un homme est assis sur un banc.",
        "Un chien <b>noir</b> court dans l'herbe.",
        "Un homme joue de la guitare.<br>Une femme chante.",
        "Une femme <i>marche</i> dans la rue.\n    ",
        "Un enfant <code>x = 1</code> joue.\n  ",
        "Un chat dort.",
        "Des gens marchent dans la rue.",
    ]


def test_translated_as_the_text_api_translates_each_segment(
    translate_html: SegmentTranslator,
) -> None:
    extracted = extract(PAGE)
    translations = translate_html(extracted.segments, HtmlFormat)
    extracted.target_language = "en"
    out = extracted.write(translations).decode()

    # Read back, the page's segments are the translations: each went where its source was.
    assert extract(out).segments == translations
    assert all(t != s for t, s in zip(translations, extracted.segments, strict=True))
    assert elements(out) == elements(PAGE)  # every element, with its attributes, once
    assert '<html lang="en">' in out
    # Script, style, comments and what is not to be translated stay as they were.
    for kept in (
        "<style>p { color: red; } /* Un chat */</style>",
        '<script>var texte = "Un chat dort." && 1 < 2;</script>',
        "<!-- Un commentaire -->",
        '<p translate="no">Ne pas traduire.</p>',
        '<p class="notranslate">Rien ici.</p>',
        "<td>42</td>",
        "</span>",  # an end tag that closes nothing is copied too
    ):
        assert kept in out
    assert "<code>x = 1</code>" in out
    # lxml.html reads it: the title and the paragraphs say the translations.
    tree = lxml.html.fromstring(out)
    assert tree.findtext(".//title") == translations[0]
    assert (
        tree.get_element_by_id("dog").text_content()
        == lxml.html.fromstring(f"<p>{translations[2]}</p>").text_content()
    )


def test_formatted_word_lands_on_its_translation(translate_html: SegmentTranslator) -> None:
    extracted = extract(PAGE)
    out = extracted.write(translate_html(extracted.segments, HtmlFormat)).decode()
    tree = lxml.html.fromstring(out)
    assert tree.get_element_by_id("dog").find("b").text == "black"
    assert [i.text for i in tree.iter("i")] in (["walking"], ["is walking"])  # "marche"


def test_identity_round_trip_is_byte_for_byte() -> None:
    data = PAGE.encode()
    extracted = extract(data)
    assert extracted.write(extracted.segments) == data


def test_sloppy_html_round_trips_byte_for_byte() -> None:
    """Unclosed elements, entities, unquoted attributes, stray end tags: as they were."""
    page = (
        "<!doctype html><html><body><p>Un chien&nbsp;<b>noir</p></div><p class=x>Un chat"
        "<li>Une femme &amp; un homme</body></html>"
    )
    extracted = extract(page)
    assert extracted.segments == [
        "Un chien&nbsp;<b>noir</b>",
        "Un chat",
        "Une femme &amp; un homme",
    ]
    assert extracted.write(extracted.segments) == page.encode()
    out = extracted.write(["A dog <b>black</b>", "A cat", "A woman &amp; a man"]).decode()
    assert out == (
        "<!doctype html><html><body><p>A dog <b>black</b></p></div><p class=x>A cat"
        "<li>A woman &amp; a man</body></html>"
    )


def test_html_lang_is_added_where_the_page_has_none() -> None:
    extracted = extract("<!DOCTYPE html><html><body><p>Un chat dort.</p></body></html>")
    extracted.target_language = "en"
    assert extracted.write(["A cat sleeps."]) == (
        b'<!DOCTYPE html><html lang="en"><body><p>A cat sleeps.</p></body></html>'
    )
    extracted = extract('<html xml:lang="fr" lang=fr><p>Un chat dort.</p></html>')
    extracted.target_language = "en"
    assert extracted.write(["A cat sleeps."]).startswith(b'<html xml:lang="en" lang="en">')


def test_declared_charset_is_read_and_kept(translate_html: SegmentTranslator) -> None:
    page = PAGE.replace('charset="utf-8"', 'charset="windows-1252"').replace(
        "Un chat dort.</td>", "Le café est chaud.</td>"
    )
    data = page.encode("cp1252")
    extracted = extract(data)
    assert "Le café est chaud." in extracted.segments
    assert extracted.write(extracted.segments) == data
    out = extracted.write(translate_html(extracted.segments, HtmlFormat))
    out.decode("cp1252")  # still in the page's encoding
    assert elements(out.decode("cp1252")) == elements(page)


def test_byte_order_mark_is_read_and_kept() -> None:
    data = b"\xff\xfe" + PAGE.replace('<meta charset="utf-8">', "").encode("utf-16-le")
    extracted = extract(data)
    assert extracted.segments == extract(PAGE).segments
    assert extracted.write(extracted.segments) == data


def test_undecodable_text_is_refused() -> None:
    with pytest.raises(DocumentRefused, match="not valid utf-8"):
        extract(b"<!DOCTYPE html><html><p>Caf\xe9 noir</p></html>")
    with pytest.raises(DocumentRefused, match="web browsers do not read"):
        extract(b'<!DOCTYPE html><html><meta charset="klingon"><p>Un chat.</p></html>')


@pytest.mark.parametrize(
    "label",
    # Python codecs no browser has: what is text to a browser would be read as markup
    # (utf-7's +ADw-script+AD4-), or byte transforms, or a text codec no page is in (EBCDIC);
    # and the Encoding Standard's own non-encodings.
    [
        *("utf-7", "unicode_escape", "raw_unicode_escape", "base64", "zlib", "rot13", "hex"),
        *("uu", "punycode", "idna", "undefined", "cp037", "utf-32", "x-user-defined"),
        "iso-2022-kr",
    ],
)
def test_an_encoding_browsers_do_not_read_pages_in_is_refused(label: str) -> None:
    script = "+ADw-script+AD4-alert(1)+ADw-/script+AD4- \\x3cscript\\x3e"
    page = f'<!DOCTYPE html><html><meta charset="{label}"><p>Un chat. {script}</p></html>'
    with pytest.raises(DocumentRefused, match="web browsers do not read"):
        extract(page.encode("ascii"))


def test_a_label_is_read_as_browsers_read_it() -> None:
    """`latin1` and `iso-8859-1` mean windows-1252 to a browser (0x80 is the euro sign)."""
    for label in ("latin1", "ISO-8859-1", " windows-1252"):
        page = f'<!DOCTYPE html><html><meta charset="{label.strip()}"><p>Un café à 5 \x80.</p>'
        assert extract(page.encode("latin-1")).segments == ["Un café à 5 €."]


def test_unclosed_script_is_refused() -> None:
    with pytest.raises(DocumentRefused, match="never closed"):
        extract("<!DOCTYPE html><html><script>var a = 1;<p>Un chat.</p></html>")


def test_more_text_than_the_limit_is_refused() -> None:
    with pytest.raises(DocumentRefused) as refused:
        extract(PAGE, DocumentLimits(max_characters=100))
    assert refused.value.status == 413
