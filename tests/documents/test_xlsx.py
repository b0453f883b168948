"""Excel workbooks: built with openpyxl (then saved with a shared strings table, as Excel
saves), translated through XlsxFormat, read back with openpyxl. What must hold: the text cells
come back as the text API translates their segments, a shared string once however many cells
use it; formulas and numbers are never touched; a bold word of rich text is on its
translation; sheets and styles are kept; members without text are copied byte for byte; an
identity translation writes the same XML back; macro-enabled workbooks are refused."""

from __future__ import annotations

import io
import re
import zipfile
from xml.etree import ElementTree

import openpyxl
import pytest
from lxml import etree
from openpyxl.cell.rich_text import CellRichText, TextBlock
from openpyxl.cell.text import InlineFont
from openpyxl.styles import Font

from service.documents.formats.base import DocumentLimits, DocumentRefused
from service.documents.formats.docx import DocxFormat
from service.documents.formats.pptx import PptxFormat
from service.documents.formats.xlsx import XlsxFormat
from tests.documents.conftest import SegmentTranslator

S = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
SHARED = "xl/sharedStrings.xml"
TEXT_PARTS = {SHARED, "xl/worksheets/sheet2.xml"}  # sheet2 keeps inline strings


def workbook() -> openpyxl.Workbook:
    book = openpyxl.Workbook()
    animals = book.active
    animals.title = "Animaux"
    animals["A1"] = "Un chat"
    animals["A1"].font = Font(bold=True, color="FF0000")
    animals["A2"] = "Un chat"
    animals["B1"] = 42
    animals["B2"] = 3.5
    animals["B2"].number_format = "0.00"
    animals["C1"] = "=LEN(A1)"
    animals["D1"] = CellRichText(
        ["Un chien ", TextBlock(InlineFont(b=True), "noir"), " court dans l'herbe."]
    )
    animals["E1"] = "Un chien court.\nUn chat dort."
    animals["F1"] = "2024"
    people = book.create_sheet("Gens")
    people["A1"] = "Une femme."
    people["A2"] = "Un homme joue de la guitare."
    people["A3"] = CellRichText(
        ["Une ", TextBlock(InlineFont(i=True), "femme"), " marche dans la rue."]
    )
    return book


def build(keep_inline: frozenset[str] = frozenset({"Gens!A1", "Gens!A3"})) -> bytes:
    out = io.BytesIO()
    workbook().save(out)
    return excel_saved(out.getvalue(), keep_inline)


def excel_saved(
    data: bytes, keep_inline: frozenset[str], cached: dict[str, str] | None = None
) -> bytes:
    """openpyxl writes every string inline (t="inlineStr"); Excel moves them into the shared
    strings table, one entry per distinct string. This does what Excel does, except for the
    cells in `keep_inline` ("Sheet!A1"); `cached` gives formula cells ("Sheet!C1") a cached
    result that is a shared string."""
    old = zipfile.ZipFile(io.BytesIO(data))
    book = etree.fromstring(old.read("xl/workbook.xml"))
    sheets = {
        f"xl/worksheets/sheet{index}.xml": sheet.get("name")
        for index, sheet in enumerate(book.iter(f"{{{S}}}sheet"), start=1)
    }
    strings: dict[bytes, int] = {}
    table = etree.Element(f"{{{S}}}sst", nsmap={None: S})
    changed: dict[str, bytes] = {}

    def index(content: list[etree._Element]) -> int:
        key = b"".join(etree.tostring(child) for child in content)
        if key not in strings:
            strings[key] = len(strings)
            etree.SubElement(table, f"{{{S}}}si").extend(content)
        return strings[key]

    for name, title in sheets.items():
        root = etree.fromstring(old.read(name))
        for cell in root.iter(f"{{{S}}}c"):
            where = f"{title}!{cell.get('r')}"
            if cell.get("t") == "inlineStr" and where not in keep_inline:
                inline = cell.find(f"{{{S}}}is")
                cell.remove(inline)
                cell.set("t", "s")
                etree.SubElement(cell, f"{{{S}}}v").text = str(index(list(inline)))
            elif cached and where in cached:
                text = etree.Element(f"{{{S}}}t")
                text.text = cached[where]
                cell.set("t", "s")
                cell.find(f"{{{S}}}v").text = str(index([text]))
        changed[name] = etree.tostring(root, xml_declaration=True, encoding="UTF-8")
    references = sum(1 for name in sheets for _ in re.finditer(rb't="s"', changed[name]))
    table.set("count", str(references))
    table.set("uniqueCount", str(len(strings)))
    changed[SHARED] = etree.tostring(table, xml_declaration=True, encoding="UTF-8")
    changed["[Content_Types].xml"] = old.read("[Content_Types].xml").replace(
        b"</Types>",
        b'<Override PartName="/xl/sharedStrings.xml" ContentType="application/'
        b'vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>',
    )
    changed["xl/_rels/workbook.xml.rels"] = old.read("xl/_rels/workbook.xml.rels").replace(
        b"</Relationships>",
        b'<Relationship Id="rIdShared" Type="http://schemas.openxmlformats.org/officeDocument/'
        b'2006/relationships/sharedStrings" Target="sharedStrings.xml"/></Relationships>',
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as new:
        for name in old.namelist():
            new.writestr(name, changed.get(name, old.read(name)))
        new.writestr(SHARED, changed[SHARED])
    return out.getvalue()


def cells(data: bytes) -> dict[str, object]:
    """Every cell's value as openpyxl reads it (rich text as CellRichText, a formula as its
    text "=..."), by "Sheet!A1"."""
    book = openpyxl.load_workbook(io.BytesIO(data), rich_text=True)
    return {
        f"{sheet.title}!{cell.coordinate}": cell.value
        for sheet in book.worksheets
        for row in sheet.iter_rows()
        for cell in row
        if cell.value is not None
    }


def squeezed(segment: str) -> str:
    return "".join("".join(ElementTree.fromstring(f"<x>{segment}</x>").itertext()).split())


@pytest.fixture(scope="module")
def source() -> bytes:
    return build()


@pytest.fixture(scope="module")
def translated(source: bytes, translate_segments: SegmentTranslator) -> tuple[list[str], bytes]:
    extracted = XlsxFormat.extract(source, DocumentLimits())
    translations = translate_segments(extracted.segments, XlsxFormat)
    return translations, extracted.write(translations)


def test_sniffed_from_content(source: bytes) -> None:
    assert XlsxFormat.sniff(source)
    assert not DocxFormat.sniff(source) and not PptxFormat.sniff(source)
    assert not XlsxFormat.sniff(b"a,b\n1,2\n")


def test_segments_are_the_text_cells(source: bytes) -> None:
    """Shared strings first (each once, however many cells show it), then inline strings;
    the number-like string "2024", numbers and the formula are not segments."""
    assert XlsxFormat.extract(source, DocumentLimits()).segments == [
        "Un chat",
        "Un chien <s1>noir</s1> court dans l'herbe.",
        "Un chien court.\nUn chat dort.",
        "Un homme joue de la guitare.",
        "Une femme.",
        "Une <s1>femme</s1> marche dans la rue.",
    ]


def test_text_cells_translated_as_the_text_api_does(
    source: bytes, translated: tuple[list[str], bytes]
) -> None:
    translations, output = translated
    segments = XlsxFormat.extract(source, DocumentLimits()).segments
    expected = {squeezed(s): squeezed(t) for s, t in zip(segments, translations, strict=True)}
    before, after = cells(source), cells(output)
    assert after.keys() == before.keys()
    for where, old in before.items():
        new = after[where]
        formula = str(old).startswith("=")
        if isinstance(old, str | CellRichText) and re.search(r"[^\W\d_]", str(old)) and not formula:
            assert "".join(str(new).split()) == expected["".join(str(old).split())], where
        else:
            assert new == old, where
    assert after["Animaux!A1"] == after["Animaux!A2"] == "A cat"
    dog, cat = after["Animaux!E1"].split("\n")  # a line each, kept
    assert dog.startswith("A dog ") and cat == "A cat sleeps."


def test_formulas_numbers_and_styles_untouched(
    source: bytes, translated: tuple[list[str], bytes]
) -> None:
    after = openpyxl.load_workbook(io.BytesIO(translated[1]))
    assert after.sheetnames == ["Animaux", "Gens"]
    animals = after["Animaux"]
    assert animals["C1"].value == "=LEN(A1)"
    assert (animals["B1"].value, animals["B2"].value) == (42, 3.5)
    assert animals["B2"].number_format == "0.00"
    assert animals["F1"].value == "2024"
    assert animals["A1"].font.b and animals["A1"].font.color.rgb == "00FF0000"
    table = etree.fromstring(zipfile.ZipFile(io.BytesIO(translated[1])).read(SHARED))
    original = etree.fromstring(zipfile.ZipFile(io.BytesIO(source)).read(SHARED))
    assert (table.get("count"), table.get("uniqueCount")) == ("6", "5")
    assert len(table) == len(original)


def test_rich_text_words_land_on_their_translation(translated: tuple[list[str], bytes]) -> None:
    after = cells(translated[1])
    bold = [b.text for b in after["Animaux!D1"] if isinstance(b, TextBlock) and b.font.b]
    italic = [b.text for b in after["Gens!A3"] if isinstance(b, TextBlock) and b.font.i]
    assert (bold, italic) == (["black"], ["woman"])


def test_parts_without_text_are_copied_byte_for_byte(
    source: bytes, translated: tuple[list[str], bytes]
) -> None:
    old, new = zipfile.ZipFile(io.BytesIO(source)), zipfile.ZipFile(io.BytesIO(translated[1]))
    assert new.namelist() == old.namelist()
    for name in old.namelist():
        if name not in TEXT_PARTS:
            assert new.read(name) == old.read(name), name


def test_identity_translation_writes_the_same_xml(source: bytes) -> None:
    extracted = XlsxFormat.extract(source, DocumentLimits())
    output = extracted.write(extracted.segments)
    old, new = zipfile.ZipFile(io.BytesIO(source)), zipfile.ZipFile(io.BytesIO(output))
    for name in TEXT_PARTS:
        assert canonical(new.read(name)) == canonical(old.read(name)), name


def canonical(xml: bytes) -> bytes:
    return etree.tostring(etree.fromstring(xml), method="c14n")


def test_a_shared_string_a_formula_shows_is_not_translated() -> None:
    """A formula's cached result must stay what the formula computes: a shared string that
    one formula cell shows is left alone, even where text cells show it too."""
    out = io.BytesIO()
    book = openpyxl.Workbook()
    book.active["A1"] = "Un chat"
    book.active["A2"] = "Une femme."
    book.active["B1"] = "=A1"
    book.save(out)
    data = excel_saved(out.getvalue(), frozenset(), cached={"Sheet!B1": "Un chat"})
    assert XlsxFormat.extract(data, DocumentLimits()).segments == ["Une femme."]


def test_macro_enabled_workbooks_are_refused(source: bytes) -> None:
    old = zipfile.ZipFile(io.BytesIO(source))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as new:
        for name in old.namelist():
            content = old.read(name)
            if name == "[Content_Types].xml":
                content = content.replace(
                    b"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml",
                    b"application/vnd.ms-excel.sheet.macroEnabled.main+xml",
                )
            new.writestr(name, content)
        new.writestr("xl/vbaProject.bin", b"\xd0\xcf\x11\xe0 macros")
    macro = out.getvalue()
    assert XlsxFormat.sniff(macro)
    with pytest.raises(DocumentRefused, match="macro-enabled"):
        XlsxFormat.extract(macro, DocumentLimits())


def test_too_much_text_refused(source: bytes) -> None:
    with pytest.raises(DocumentRefused) as refused:
        XlsxFormat.extract(source, DocumentLimits(max_characters=50))
    assert refused.value.status == 413
