"""PowerPoint presentations: built with python-pptx, translated through PptxFormat, read back
with python-pptx. What must hold: every paragraph (titles, placeholders, text boxes, table
cells, speaker notes) comes back as the text API translates its segment; a bold, italic or
linked word's run is on its translation; slides, shapes, tables and layouts are kept; members
that hold no text are copied byte for byte; an identity translation writes the same XML back;
macro-enabled files are refused."""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from xml.etree import ElementTree

import pytest
from lxml import etree
from pptx import Presentation
from pptx.oxml import parse_xml
from pptx.oxml.ns import nsdecls
from pptx.slide import Slide
from pptx.text.text import TextFrame, _Paragraph
from pptx.util import Inches

from service.documents.formats.base import DocumentLimits, DocumentRefused
from service.documents.formats.docx import DocxFormat
from service.documents.formats.pptx import PptxFormat
from service.documents.formats.xlsx import XlsxFormat
from tests.documents.conftest import SegmentTranslator

LINK = "https://example.org/livre"
TEXT_PARTS = {"ppt/slides/slide1.xml", "ppt/slides/slide2.xml", "ppt/notesSlides/notesSlide1.xml"}


def build() -> bytes:
    """Two slides: a title slide, and a slide with a bulleted body (bold, italic and linked
    words, a line break), a text box, a table (with a number) and speaker notes."""
    presentation = Presentation()
    first = presentation.slides.add_slide(presentation.slide_layouts[0])
    first.shapes.title.text = "Un homme joue de la guitare."
    first.placeholders[1].text = "Un chat"
    second = presentation.slides.add_slide(presentation.slide_layouts[1])
    second.shapes.title.text = "Une femme."
    body = second.placeholders[1].text_frame
    add_runs(body.paragraphs[0], ("Un chien ", {}), ("noir", {"bold": True}), (" court.", {}))
    add_runs(body.add_paragraph(), ("Une ", {}), ("femme", {"italic": True}), (" marche.", {}))
    add_runs(body.add_paragraph(), ("Un homme lit un ", {}), ("livre", {"link": LINK}), (".", {}))
    paragraph = body.add_paragraph()
    add_runs(paragraph, ("Un homme fait du vélo.", {}))
    paragraph.add_line_break()
    add_runs(paragraph, ("Deux enfants jouent sur la plage.", {}))
    box = second.shapes.add_textbox(Inches(1), Inches(5), Inches(4), Inches(1))
    box.text_frame.text = "Deux chiens jouent dans la neige."
    table = second.shapes.add_table(2, 2, Inches(5), Inches(5), Inches(4), Inches(1)).table
    for (row, column), text in {
        (0, 0): "Une femme.",
        (0, 1): "42",
        (1, 0): "Un chat",
        (1, 1): "Un homme joue de la guitare.",
    }.items():
        table.cell(row, column).text = text
    second.notes_slide.notes_text_frame.text = "Une fille en robe rose saute."
    return save(presentation)


def add_runs(paragraph: _Paragraph, *runs: tuple[str, dict]) -> None:
    for text, formatting in runs:
        run = paragraph.add_run()
        run.text = text
        run.font.bold = formatting.get("bold")
        run.font.italic = formatting.get("italic")
        if "link" in formatting:
            run.hyperlink.address = formatting["link"]


def save(presentation: Presentation) -> bytes:
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def frames(slide: Slide) -> Iterator[TextFrame]:
    """A slide's text frames in shape order, table cells row by row, then its notes."""
    for shape in slide.shapes:
        if shape.has_text_frame:
            yield shape.text_frame
        elif shape.has_table:
            for row in shape.table.rows:
                for cell in row.cells:
                    yield cell.text_frame
    if slide.has_notes_slide:
        for shape in slide.notes_slide.shapes:
            if shape.has_text_frame:
                yield shape.text_frame


def paragraphs(data: bytes) -> list[str]:
    presentation = Presentation(io.BytesIO(data))
    return [
        paragraph.text
        for slide in presentation.slides
        for frame in frames(slide)
        for paragraph in frame.paragraphs
    ]


def plain(segment: str) -> str:
    return "".join("".join(ElementTree.fromstring(f"<x>{segment}</x>").itertext()).split())


@pytest.fixture(scope="module")
def source() -> bytes:
    return build()


@pytest.fixture(scope="module")
def translated(source: bytes, translate_segments: SegmentTranslator) -> tuple[list[str], bytes]:
    extracted = PptxFormat.extract(source, DocumentLimits())
    translations = translate_segments(extracted.segments, PptxFormat)
    return translations, extracted.write(translations)


def test_sniffed_from_content() -> None:
    data = build()
    assert PptxFormat.sniff(data)
    assert not DocxFormat.sniff(data) and not XlsxFormat.sniff(data)
    assert not PptxFormat.sniff(b"Un chien noir court.")


def test_segments_are_paragraphs_in_slide_order(source: bytes) -> None:
    assert PptxFormat.extract(source, DocumentLimits()).segments == [
        "Un homme joue de la guitare.",
        "Un chat",
        "Une femme.",
        "Un chien <s1>noir</s1> court.",
        "Une <s1>femme</s1> marche.",
        "Un homme lit un <s1>livre</s1>.",
        "Un homme fait du vélo. <p0/>Deux enfants jouent sur la plage.",
        "Deux chiens jouent dans la neige.",
        "Une femme.",
        "Un chat",
        "Un homme joue de la guitare.",
        "Une fille en robe rose saute.",
    ]


def test_every_paragraph_translated_as_the_text_api_does(
    source: bytes, translated: tuple[list[str], bytes]
) -> None:
    translations, output = translated
    before, after = paragraphs(source), paragraphs(output)
    assert len(after) == len(before)
    expected = iter(translations)
    for old, new in zip(before, after, strict=True):
        if re.search(r"[^\W\d_]", old):
            assert "".join(new.split()) == plain(next(expected))
        else:
            assert new == old
    assert next(expected, None) is None
    assert after[0] == "A man is playing a guitar."


def test_formatted_words_land_on_their_translation(translated: tuple[list[str], bytes]) -> None:
    slide = Presentation(io.BytesIO(translated[1])).slides[1]
    bold, italic, linked, broken = slide.placeholders[1].text_frame.paragraphs
    assert [run.text for run in bold.runs if run.font.bold] == ["black"]
    assert [run.text for run in italic.runs if run.font.italic] == ["woman"]
    assert [run.text for run in linked.runs if run.hyperlink.address] == ["book"]
    assert [run.hyperlink.address for run in linked.runs if run.hyperlink.address] == [LINK]
    # The line break stays between the two sentences, with no space left beside it.
    assert broken.text == "A man is riding a bicycle.\vTwo children are playing on the beach."


def test_structure_kept(source: bytes, translated: tuple[list[str], bytes]) -> None:
    before = Presentation(io.BytesIO(source))
    after = Presentation(io.BytesIO(translated[1]))
    assert len(after.slides) == len(before.slides) == 2
    for old, new in zip(before.slides, after.slides, strict=True):
        assert new.slide_layout.name == old.slide_layout.name
        assert [(s.name, s.shape_type, s.left, s.top) for s in new.shapes] == [
            (s.name, s.shape_type, s.left, s.top) for s in old.shapes
        ]
        assert [len(frame.paragraphs) for frame in frames(new)] == [
            len(frame.paragraphs) for frame in frames(old)
        ]
    (table,) = [shape.table for shape in after.slides[1].shapes if shape.has_table]
    assert (len(table.rows), len(table.columns)) == (2, 2)
    assert table.cell(0, 1).text == "42"
    assert after.slides[1].has_notes_slide


def test_parts_without_text_are_copied_byte_for_byte(
    source: bytes, translated: tuple[list[str], bytes]
) -> None:
    old, new = zipfile.ZipFile(io.BytesIO(source)), zipfile.ZipFile(io.BytesIO(translated[1]))
    assert new.namelist() == old.namelist()
    for name in old.namelist():
        if name not in TEXT_PARTS:
            assert new.read(name) == old.read(name), name


def test_identity_translation_writes_the_same_xml(source: bytes) -> None:
    extracted = PptxFormat.extract(source, DocumentLimits())
    output = extracted.write(extracted.segments)
    old, new = zipfile.ZipFile(io.BytesIO(source)), zipfile.ZipFile(io.BytesIO(output))
    for name in TEXT_PARTS:
        assert canonical(new.read(name)) == canonical(old.read(name)), name


def canonical(xml: bytes) -> bytes:
    return etree.tostring(etree.fromstring(xml), method="c14n")


def test_a_field_is_a_point_kept_whole(translate_segments: SegmentTranslator) -> None:
    """A slide number (a:fld) is a point: the model never reads its text, and it is written
    back as it was, where the alignment puts it."""
    presentation = Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[6])
    box = slide.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1))
    paragraph = box.text_frame.paragraphs[0]
    add_runs(paragraph, ("Un homme fait du vélo. ", {}))
    field = (
        f'<a:fld {nsdecls("a")} id="{{B6F15528-21DE-4FAA-801E-634DDDAF4B2B}}" type="slidenum">'
        '<a:rPr lang="fr-FR"/><a:t>1</a:t></a:fld>'
    )
    paragraph._p.append(parse_xml(field))
    extracted = PptxFormat.extract(save(presentation), DocumentLimits())
    assert extracted.segments == ["Un homme fait du vélo. <p0/>"]
    output = extracted.write(translate_segments(extracted.segments, PptxFormat))
    (shape,) = Presentation(io.BytesIO(output)).slides[0].shapes
    assert shape.text_frame.text == "A man is riding a bicycle. 1"
    written = shape.text_frame.paragraphs[0]._p
    assert [exclusive(f) for f in written.iter("{*}fld")] == [exclusive(parse_xml(field))]


def exclusive(element: etree._Element) -> bytes:
    """An element's XML, whichever namespaces its ancestors declare."""
    return etree.tostring(element, method="c14n", exclusive=True)


def test_runs_split_only_by_proofing_are_one_formatting() -> None:
    """PowerPoint splits runs where it marks a spelling error (err="1") or text not checked
    yet (dirty="0"): no formatting, so no span, and not carried to the translation."""
    presentation = Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[6])
    box = slide.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1))
    add_runs(box.text_frame.paragraphs[0], ("Un chien ", {}), ("noir", {}), (" court.", {}))
    runs = box.text_frame.paragraphs[0].runs
    runs[0]._r.get_or_add_rPr().set("dirty", "0")
    runs[1]._r.get_or_add_rPr().set("err", "1")
    extracted = PptxFormat.extract(save(presentation), DocumentLimits())
    assert extracted.segments == ["Un chien noir court."]
    output = extracted.write(["A black dog runs."])
    (shape,) = Presentation(io.BytesIO(output)).slides[0].shapes
    (run,) = shape.text_frame.paragraphs[0].runs
    assert run.text == "A black dog runs."
    assert run._r.rPr is None or not {"err", "dirty"} & set(run._r.rPr.attrib)


def test_macro_enabled_presentations_are_refused() -> None:
    old = zipfile.ZipFile(io.BytesIO(build()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as new:
        for name in old.namelist():
            content = old.read(name)
            if name == "[Content_Types].xml":
                content = content.replace(
                    b"application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml",
                    b"application/vnd.ms-powerpoint.presentation.macroEnabled.main+xml",
                )
            new.writestr(name, content)
        new.writestr("ppt/vbaProject.bin", b"\xd0\xcf\x11\xe0 macros")
    macro = out.getvalue()
    assert PptxFormat.sniff(macro)
    with pytest.raises(DocumentRefused, match="macro-enabled"):
        PptxFormat.extract(macro, DocumentLimits())


def test_too_much_text_refused(source: bytes) -> None:
    with pytest.raises(DocumentRefused) as refused:
        PptxFormat.extract(source, DocumentLimits(max_characters=50))
    assert refused.value.status == 413
