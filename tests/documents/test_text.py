"""Plain text: which bytes are text, how paragraphs, hard-wrapped lines and line breaks become
segments, and that everything around the translated words (blank lines, indentation, line
endings, byte order mark, encoding) is written back as it was."""

from __future__ import annotations

import codecs

import pytest

from service.documents.formats import detect
from service.documents.formats.base import DocumentLimits, DocumentRefused
from service.documents.formats.text import TxtFormat, plain_text
from tests.documents.conftest import SegmentTranslator

WRAPPED = (
    "Un homme marche dans la rue avec son chien noir. Une femme chante dans le\n"
    "parc et deux enfants jouent au ballon sur la pelouse verte pendant que leur\n"
    "mère lit un livre.\n"
)
DOCUMENT = (
    "Un rapport sur les chiens\n"
    "\n" + WRAPPED + "\n"
    "  - Un chien noir court dans l'herbe.\n"
    "  - Une femme chante.\n"
    "\n"
    "\x0c\n"
    "2024\n"
    "\n"
    "Deux hommes jouent au football."
)


def _extract(text: str, encoding: str = "utf-8") -> tuple[bytes, list[str]]:
    data = text.encode(encoding)
    return data, TxtFormat.extract(data, DocumentLimits()).segments


def test_sniff_takes_text_and_leaves_binary() -> None:
    assert TxtFormat.sniff(b"Un chien noir.")
    assert TxtFormat.sniff(codecs.BOM_UTF8 + b"Un chien noir.")
    assert TxtFormat.sniff(codecs.BOM_UTF16_LE + "Un chien noir.".encode("utf-16-le"))
    assert TxtFormat.sniff(codecs.BOM_UTF16_BE + "Un chien noir.".encode("utf-16-be"))
    assert not TxtFormat.sniff(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    assert not TxtFormat.sniff("Un chien noir, été.".encode("cp1252"))
    assert not TxtFormat.sniff("Un chien".encode("utf-16-le"))  # no byte order mark


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ("Un été chaud.".encode("cp1252"), "not UTF-8"),
        (b"PK\x03\x04\x00\x00binary", "NUL"),
        ("Un chien".encode("utf-16-le"), "byte order mark"),
        (codecs.BOM_UTF32_LE + "Un chien".encode("utf-32-le"), "UTF-32"),
        (codecs.BOM_UTF16_LE + b"\x00\xd8", "not valid utf-16-le"),
    ],
)
def test_other_encodings_refused_clearly(data: bytes, reason: str) -> None:
    with pytest.raises(DocumentRefused, match=reason):
        TxtFormat.extract(data, DocumentLimits())


def test_paragraphs_wraps_and_breaks() -> None:
    _, segments = _extract(DOCUMENT)
    assert segments == [
        "Un rapport sur les chiens",
        # A hard-wrapped paragraph is one text; a list keeps its items apart, markers out.
        " ".join(WRAPPED.split()),
        "Un chien noir court dans l'herbe.\nUne femme chante.",
        "Deux hommes jouent au football.",
    ]


def test_short_lines_are_breaks_not_wraps() -> None:
    _, segments = _extract("Titre\nUn homme marche dans la rue avec son chien noir.\n")
    assert segments == ["Titre\nUn homme marche dans la rue avec son chien noir."]
    verse = "Un chat dort\nsur le toit\nde la maison\n"
    assert _extract(verse)[1] == ["Un chat dort\nsur le toit\nde la maison"]


def test_escaped_for_xml() -> None:
    assert _extract("Deux hommes & une femme <3\n")[1] == ["Deux hommes &amp; une femme &lt;3"]


@pytest.mark.parametrize(
    ("text", "encoding", "bom"),
    [
        (DOCUMENT, "utf-8", b""),
        (DOCUMENT.replace("\n", "\r\n"), "utf-8", b""),
        (DOCUMENT, "utf-8", codecs.BOM_UTF8),
        (DOCUMENT.replace("\n", "\r\n") + "\r\n", "utf-16-le", codecs.BOM_UTF16_LE),
        (DOCUMENT, "utf-16-be", codecs.BOM_UTF16_BE),
        ("Un chien.\r\nUne femme.\nUn chat.\r\rDeux hommes.", "utf-8", b""),
    ],
)
def test_identity_translation_writes_the_same_bytes(text: str, encoding: str, bom: bytes) -> None:
    data = bom + text.encode(encoding)
    extracted = TxtFormat.extract(data, DocumentLimits())
    assert extracted.write(extracted.segments) == data


def test_translation_rewrapped_at_the_source_width_and_line_endings_kept() -> None:
    data = DOCUMENT.replace("\n", "\r\n").encode()
    extracted = TxtFormat.extract(data, DocumentLimits())
    long = "A man is walking down the street with his black dog " * 6
    translations = ["A report on dogs", long.strip(), "A black dog.\nA woman sings.", "End."]
    out = extracted.write(translations).decode()
    assert "\n" not in out.replace("\r\n", "")  # every line ends as the file's do
    lines = out.split("\r\n")
    width = max(len(line) for line in WRAPPED.splitlines())
    paragraph = lines[2 : lines.index("", 2)]
    assert len(paragraph) > 4 and all(len(line) <= width for line in paragraph)
    assert " ".join(paragraph) == long.strip()
    assert lines[lines.index("", 2) + 1 : lines.index("", 2) + 3] == [
        "  - A black dog.",
        "  - A woman sings.",
    ]
    assert "\x0c" in lines and "2024" in lines and lines[-1] == "End."


def test_translated_as_the_text_api_translates(translate_segments: SegmentTranslator) -> None:
    data, segments = _extract(DOCUMENT)
    extracted = TxtFormat.extract(data, DocumentLimits())
    translations = translate_segments(segments, TxtFormat)
    out = extracted.write(translations).decode()
    paragraphs = [part for part in out.split("\n\n") if part.strip() not in ("", "\x0c", "2024")]
    assert len(paragraphs) == len(translations)
    for index, (written, translation) in enumerate(zip(paragraphs, translations, strict=True)):
        expected = [line.strip() for line in plain_text(translation).split("\n")]
        got = written.strip("\n").split("\n")
        if index == 1:  # the wrapped paragraph: wrapped again
            assert " ".join(got) == " ".join(expected)
        elif index == 2:  # the list: its items' indentation and markers kept
            assert got == [f"  - {line}" for line in expected]
        else:
            assert got == expected
    assert not out.startswith("Un rapport") and "2024" in out  # the title translated too


def test_character_limit() -> None:
    with pytest.raises(DocumentRefused) as refused:
        TxtFormat.extract(DOCUMENT.encode(), DocumentLimits(max_characters=50))
    assert refused.value.status == 413


FRENCH = "Le café est très chaud, n'est-ce pas ? Le chat dort.\n" * 20


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (FRENCH.encode("latin-1"), "not UTF-8 text"),
        (FRENCH.encode("cp1252"), "not UTF-8 text"),
        (FRENCH.encode("utf-16-le"), "UTF-16 text without a byte order mark"),
        (FRENCH.encode("utf-16-be"), "UTF-16 text without a byte order mark"),
        (FRENCH.replace("dort", "do\x00rt").encode(), "NUL characters"),
    ],
)
def test_text_no_format_takes_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    """Text that is not in an encoding read is told what to do, not that its format is not
    read (what a picture is told)."""
    with pytest.raises(DocumentRefused, match=reason) as refused:
        detect(data)
    assert refused.value.status == 400
    picture = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    with pytest.raises(DocumentRefused, match="not in a format") as refused:
        detect(picture)
    assert refused.value.status == 415
