"""Word documents: built with python-docx, translated through DocxFormat, read back with
python-docx. What must hold: every paragraph (body, table cells, headers, footers, footnotes)
comes back as the text API translates its segment; a bold, italic or linked word's run is on
its translation; structure and styles are kept; members that hold no text are copied byte for
byte; an identity translation writes the same XML back; macro-enabled files are refused."""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from xml.etree import ElementTree
from xml.sax.saxutils import escape

import docx
import pytest
from docx.document import Document
from docx.opc.constants import CONTENT_TYPE, RELATIONSHIP_TYPE
from docx.opc.packuri import PackURI
from docx.opc.part import Part
from docx.oxml import parse_xml
from docx.oxml.ns import nsdecls, qn
from docx.table import Table
from lxml import etree

from service.documents.formats.base import DocumentLimits, DocumentRefused
from service.documents.formats.docx import DocxFormat
from service.documents.formats.pptx import PptxFormat
from service.documents.formats.xlsx import XlsxFormat
from tests.documents.conftest import SegmentTranslator

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
RELATIONSHIP = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
TEXT_PARTS = {"word/document.xml", "word/header1.xml", "word/footer1.xml", "word/footnotes.xml"}
LINK = "https://example.org/livre"

FOOTNOTES = f"""<w:footnotes {nsdecls("w")}>
<w:footnote w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r></w:p></w:footnote>
<w:footnote w:type="continuationSeparator" w:id="0"><w:p><w:r><w:continuationSeparator/></w:r>
</w:p></w:footnote>
<w:footnote w:id="1"><w:p><w:r><w:rPr><w:vertAlign w:val="superscript"/></w:rPr><w:footnoteRef/>
</w:r><w:r><w:t xml:space="preserve"> Une fille en robe rose saute.</w:t></w:r></w:p></w:footnote>
</w:footnotes>""".replace("\n", "")


def build() -> bytes:
    """A document with what the adapter must handle: a heading, bold and italic words, a
    link, a tab, a bookmark, a footnote, a table (with a number), a header and a footer."""
    document = docx.Document()
    document.add_heading("Un homme joue de la guitare.", level=1)
    paragraph = document.add_paragraph("Un chien ")
    paragraph.add_run("noir").bold = True
    paragraph.add_run(" court dans l'herbe.")
    paragraph = document.add_paragraph("Une ", style="List Bullet")
    paragraph.add_run("femme").italic = True
    paragraph.add_run(" marche dans la rue.")
    paragraph = document.add_paragraph("Un homme lit un ")
    add_link(document, paragraph, "livre")
    paragraph.add_run(".")
    paragraph = document.add_paragraph("Un homme")
    paragraph.add_run().add_tab()
    paragraph.add_run("joue de la guitare.")
    paragraph = document.add_paragraph()
    paragraph._p.append(parse_xml(f'<w:bookmarkStart {nsdecls("w")} w:id="0" w:name="plage"/>'))
    paragraph.add_run("Deux enfants jouent sur la plage.")
    paragraph._p.append(parse_xml(f'<w:bookmarkEnd {nsdecls("w")} w:id="0"/>'))
    reference = paragraph.add_run()
    reference.font.superscript = True
    reference._r.append(parse_xml(f'<w:footnoteReference {nsdecls("w")} w:id="1"/>'))
    table = document.add_table(rows=2, cols=2)
    table.style = "Table Grid"
    table.cell(0, 0).text = "Une femme."
    table.cell(0, 1).text = "42"
    table.cell(1, 0).text = "Un chat"
    table.cell(1, 1).text = "Deux chiens jouent dans la neige."
    section = document.sections[0]
    section.header.paragraphs[0].text = "Un chat"
    section.footer.paragraphs[0].text = "Deux chiens jouent dans la neige."
    notes = Part(
        PackURI("/word/footnotes.xml"),
        CONTENT_TYPE.WML_FOOTNOTES,
        FOOTNOTES.encode(),
        document.part.package,
    )
    document.part.relate_to(notes, RELATIONSHIP_TYPE.FOOTNOTES)
    return save(document)


def add_link(document: Document, paragraph: docx.text.paragraph.Paragraph, text: str) -> None:
    link = parse_xml(
        f'<w:hyperlink {nsdecls("w", "r")} r:id="'
        f'{document.part.relate_to(LINK, RELATIONSHIP_TYPE.HYPERLINK, is_external=True)}">'
        f'<w:r><w:rPr><w:u w:val="single"/></w:rPr><w:t>{text}</w:t></w:r></w:hyperlink>'
    )
    paragraph._p.append(link)


def save(document: Document) -> bytes:
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def paragraphs(data: bytes) -> list[str]:
    """Every paragraph's text, read with python-docx (footnotes, which it does not read, from
    their part), in document order: body and tables, header, footer, footnotes."""
    document = docx.Document(io.BytesIO(data))
    texts: list[str] = []

    def walk(container: Document | docx.table._Cell) -> None:
        for item in container.iter_inner_content():
            if isinstance(item, Table):
                for row in item.rows:
                    for cell in row.cells:
                        walk(cell)
            else:
                texts.append(item.text)

    walk(document)
    section = document.sections[0]
    texts += [paragraph.text for paragraph in section.header.paragraphs]
    texts += [paragraph.text for paragraph in section.footer.paragraphs]
    return texts + footnotes(data)


def footnotes(data: bytes) -> list[str]:
    root = etree.fromstring(zipfile.ZipFile(io.BytesIO(data)).read("word/footnotes.xml"))
    return ["".join(p.itertext()) for p in root.iter(f"{{{W}}}p")]


def plain(segment: str) -> str:
    """A segment's words without markup or spacing, to compare with what a library reads
    (where a point that was a tab reads as a tab)."""
    return "".join("".join(ElementTree.fromstring(f"<x>{segment}</x>").itertext()).split())


def squeezed(text: str) -> str:
    return "".join(text.split())


@pytest.fixture(scope="module")
def source() -> bytes:
    return build()


@pytest.fixture(scope="module")
def translated(source: bytes, translate_segments: SegmentTranslator) -> tuple[list[str], bytes]:
    extracted = DocxFormat.extract(source, DocumentLimits())
    translations = translate_segments(extracted.segments, DocxFormat)
    return translations, extracted.write(translations)


def test_sniffed_from_content() -> None:
    data = build()
    assert DocxFormat.sniff(data)
    assert not PptxFormat.sniff(data) and not XlsxFormat.sniff(data)
    assert not DocxFormat.sniff(b"PK\x03\x04 not really a zip")
    assert not DocxFormat.sniff(b"Un chien noir court dans l'herbe.")


def test_segments_are_paragraphs_with_spans_and_points(source: bytes) -> None:
    """One segment a paragraph: formatting that holds few characters is a span, what holds
    no text a point (a tab gets a space so the model reads two words); the number cell and
    the footnote separators hold nothing to translate."""
    assert DocxFormat.extract(source, DocumentLimits()).segments == [
        "Un homme joue de la guitare.",
        "Un chien <s1>noir</s1> court dans l'herbe.",
        "Une <s1>femme</s1> marche dans la rue.",
        "Un homme lit un <s1>livre</s1>.",
        "Un homme <p0/>joue de la guitare.",
        "<p0/>Deux enfants jouent sur la plage.<p1/><p2/>",
        "Une femme.",
        "Un chat",
        "Deux chiens jouent dans la neige.",
        "Un chat",
        "Deux chiens jouent dans la neige.",
        "<p0/> Une fille en robe rose saute.",
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
            assert squeezed(new) == plain(next(expected))
        else:
            assert new == old  # "42", empty paragraphs, footnote separators
    assert next(expected, None) is None
    assert after[0] == "A man is playing a guitar."


def test_formatted_words_land_on_their_translation(translated: tuple[list[str], bytes]) -> None:
    document = docx.Document(io.BytesIO(translated[1]))
    body = document.paragraphs
    assert [run.text for run in body[1].runs if run.bold] == ["black"]
    assert [run.text for run in body[2].runs if run.italic] == ["woman"]
    (link,) = body[3].hyperlinks
    assert (link.text, link.address) == ("book", LINK)
    assert [run.underline for run in link.runs] == [True]
    # The space the tab was given for the model is gone again: the tab is the space.
    assert [run.text for run in body[4].runs] == ["A man", "\t", "is playing a guitar."]


def test_structure_and_styles_kept(source: bytes, translated: tuple[list[str], bytes]) -> None:
    before, after = docx.Document(io.BytesIO(source)), docx.Document(io.BytesIO(translated[1]))
    assert [p.style.name for p in after.paragraphs] == [p.style.name for p in before.paragraphs]
    assert [p.paragraph_format.alignment for p in after.paragraphs] == [
        p.paragraph_format.alignment for p in before.paragraphs
    ]
    (old_table,), (new_table,) = before.tables, after.tables
    assert (len(new_table.rows), len(new_table.columns)) == (2, 2)
    assert new_table.style.name == old_table.style.name
    assert new_table.cell(0, 1).text == "42"
    body = etree.fromstring(zipfile.ZipFile(io.BytesIO(translated[1])).read("word/document.xml"))
    for kept in ("bookmarkStart", "bookmarkEnd", "footnoteReference", "tab", "sectPr"):
        assert len(body.findall(f".//{{{W}}}{kept}")) == 1, kept
    reference = body.find(f".//{{{W}}}footnoteReference/..")
    assert reference is not None and reference.find(f"{{{W}}}rPr/{{{W}}}vertAlign") is not None


def test_parts_without_text_are_copied_byte_for_byte(
    source: bytes, translated: tuple[list[str], bytes]
) -> None:
    old, new = zipfile.ZipFile(io.BytesIO(source)), zipfile.ZipFile(io.BytesIO(translated[1]))
    assert new.namelist() == old.namelist()
    for name in old.namelist():
        if name not in TEXT_PARTS:
            assert new.read(name) == old.read(name), name


def test_identity_translation_writes_the_same_xml(source: bytes) -> None:
    """Writing the segments themselves back gives the same paragraphs, run for run: the
    mapping loses nothing (and writing twice writes alike)."""
    extracted = DocxFormat.extract(source, DocumentLimits())
    output = extracted.write(extracted.segments)
    assert extracted.write(extracted.segments) == output
    old, new = zipfile.ZipFile(io.BytesIO(source)), zipfile.ZipFile(io.BytesIO(output))
    for name in TEXT_PARTS:
        assert canonical(new.read(name)) == canonical(old.read(name)), name
    assert paragraphs(output) == paragraphs(source)


def canonical(xml: bytes) -> bytes:
    return etree.tostring(etree.fromstring(xml), method="c14n")


def test_a_field_is_one_point_kept_whole(translate_segments: SegmentTranslator) -> None:
    """A complex field (here the page number) is instruction and result together: one point,
    which the model never reads, written back as the same runs in the same order."""
    document = docx.Document()
    paragraph = document.add_paragraph("Un homme fait du vélo. ")
    for part in (
        '<w:fldChar w:fldCharType="begin"/>',
        '<w:instrText xml:space="preserve"> PAGE </w:instrText>',
        '<w:fldChar w:fldCharType="separate"/>',
        "<w:t>1</w:t>",
        '<w:fldChar w:fldCharType="end"/>',
    ):
        paragraph._p.append(parse_xml(f"<w:r {nsdecls('w')}>{part}</w:r>"))
    source = save(document)
    extracted = DocxFormat.extract(source, DocumentLimits())
    assert extracted.segments == ["Un homme fait du vélo. <p0/>"]
    output = extracted.write(translate_segments(extracted.segments, DocxFormat))
    (paragraph,) = docx.Document(io.BytesIO(output)).paragraphs
    assert paragraph.text == "A man is riding a bicycle. 1"
    runs = paragraph._p.findall(qn("w:r"))
    assert [etree.tostring(run) for run in runs[-5:]] == [
        etree.tostring(run) for run in document.paragraphs[0]._p.findall(qn("w:r"))[-5:]
    ]


def test_inline_containers_are_copied_around_the_words_they_land_on() -> None:
    """Tracked insertions, links and smart tags hold runs: the translated words each lands
    on are written inside a copy of it (a link whose words are parted becomes two links to
    the same target); a deletion, a simple field and a text box are points; the text box's
    own paragraph is a segment. The translation here is written by hand, spans moved."""
    document = docx.Document()
    vml = 'xmlns:v="urn:schemas-microsoft-com:vml"'
    revision = 'w:author="A" w:date="2024-01-01T00:00:00Z"'
    paragraph = parse_xml(
        f'<w:p {nsdecls("w", "r")} {vml}><w:pPr><w:jc w:val="center"/></w:pPr>'
        '<w:r><w:t xml:space="preserve">Un homme </w:t></w:r>'
        f'<w:ins w:id="5" {revision}><w:r><w:rPr><w:b/></w:rPr><w:t>en</w:t></w:r></w:ins>'
        '<w:r><w:t xml:space="preserve"> chemise </w:t></w:r>'
        '<w:hyperlink r:id="rId1" w:history="1"><w:r><w:rPr><w:i/></w:rPr><w:t>bleue</w:t>'
        '</w:r><w:r><w:t xml:space="preserve"> lit</w:t></w:r></w:hyperlink>'
        f'<w:del w:id="6" {revision}><w:r><w:delText>pas</w:delText></w:r></w:del>'
        '<w:smartTag w:uri="u" w:element="e"><w:smartTagPr><w:attr w:name="n" w:val="v"/>'
        '</w:smartTagPr><w:r><w:t xml:space="preserve"> un livre</w:t></w:r></w:smartTag>'
        "<w:r><w:t>.</w:t><w:br/><w:pict><v:shape><v:textbox><w:txbxContent><w:p><w:r>"
        "<w:t>Un chat</w:t></w:r></w:p></w:txbxContent></v:textbox></v:shape></w:pict></w:r>"
        '<w:fldSimple w:instr="PAGE"><w:r><w:t>1</w:t></w:r></w:fldSimple></w:p>'
    )
    document.element.body.insert(0, paragraph)
    extracted = DocxFormat.extract(save(document), DocumentLimits())
    assert extracted.segments == [
        "Un homme <s1>en</s1> chemise <s2>bleue</s2><s3> lit</s3><p0/><s5> un livre</s5>. "
        "<p1/><p2/><p3/>",
        "Un chat",
    ]
    output = extracted.write(
        [
            "A man <s1>in</s1> a <s2>blue</s2> shirt <s3>reads</s3><p0/> <s5>a book</s5>. "
            "<p1/><p2/><p3/>",
            "A cat",
        ]
    )
    body = etree.fromstring(zipfile.ZipFile(io.BytesIO(output)).read("word/document.xml"))
    p = body.find(f"{{{W}}}body/{{{W}}}p")

    def texts(name: str) -> list[tuple[dict[str, str], str]]:
        return [(dict(e.attrib), "".join(e.itertext())) for e in p.findall(f"{{{W}}}{name}")]

    link = {f"{{{RELATIONSHIP}}}id": "rId1", f"{{{W}}}history": "1"}
    assert texts("hyperlink") == [(link, "blue"), (link, "reads")]
    assert p.find(f"{{{W}}}hyperlink/{{{W}}}r/{{{W}}}rPr/{{{W}}}i") is not None
    insertion = {f"{{{W}}}id": "5", f"{{{W}}}author": "A", f"{{{W}}}date": "2024-01-01T00:00:00Z"}
    assert texts("ins") == [(insertion, "in")]
    assert [text for _, text in texts("del")] == ["pas"]
    assert [text for _, text in texts("smartTag")] == ["a book"]
    assert p.find(f"{{{W}}}smartTag/{{{W}}}smartTagPr/{{{W}}}attr") is not None
    assert [text for _, text in texts("fldSimple")] == ["1"]
    assert p.find(f"{{{W}}}pPr/{{{W}}}jc") is p[0][0]
    box = p.find(f".//{{{W}}}txbxContent/{{{W}}}p")
    assert "".join(box.itertext()) == "A cat"
    assert "".join(t.text for t in p.iter(f"{{{W}}}t")) == (
        "A man in a blue shirt reads a book.A cat1"
    )


def test_an_inline_content_control_is_a_container() -> None:
    """A content control inside a paragraph (w:sdt, its properties, w:sdtContent) holds runs
    like a link does: its words are translated and stay inside it."""
    document = docx.Document()
    document.element.body.insert(
        0,
        parse_xml(
            f'<w:p {nsdecls("w")}><w:r><w:t xml:space="preserve">Un homme lit un </w:t></w:r>'
            "<w:sdt>"
            '<w:sdtPr><w:id w:val="7"/></w:sdtPr><w:sdtContent><w:r><w:t>livre</w:t>'
            "</w:r></w:sdtContent></w:sdt><w:r><w:t>.</w:t></w:r></w:p>"
        ),
    )
    source = save(document)
    extracted = DocxFormat.extract(source, DocumentLimits())
    assert extracted.segments == ["Un homme lit un <s1>livre</s1>."]
    output = extracted.write(["A man reads a <s1>book</s1>."])
    control = etree.fromstring(part(output, "word/document.xml")).find(f".//{qn('w:sdt')}")
    assert control.find(f"{qn('w:sdtPr')}/{qn('w:id')}").get(qn("w:val")) == "7"
    assert "".join(control.find(qn("w:sdtContent")).itertext()) == "book"
    identity = extracted.write(extracted.segments)
    assert canonical(part(identity, "word/document.xml")) == canonical(
        part(source, "word/document.xml")
    )


def part(data: bytes, name: str) -> bytes:
    return zipfile.ZipFile(io.BytesIO(data)).read(name)


def test_a_run_of_spaces_joins_the_text_before_and_empty_containers_stay() -> None:
    """A space formatted alone (here underlined) would be a span of spaces, which the model
    reads as no space: it goes with the text before. A link with no text is a point."""
    document = docx.Document()
    paragraph = document.add_paragraph("Un chien")
    paragraph.add_run(" ").underline = True
    paragraph.add_run("noir court.")
    paragraph._p.append(parse_xml(f'<w:hyperlink {nsdecls("w", "r")} r:id="rId1"/>'))
    extracted = DocxFormat.extract(save(document), DocumentLimits())
    assert extracted.segments == ["Un chien noir court.<p0/>"]
    output = extracted.write(["A black dog runs.<p0/>"])
    body = etree.fromstring(part(output, "word/document.xml"))
    assert [e.get(f"{{{RELATIONSHIP}}}id") for e in body.iter(qn("w:hyperlink"))] == ["rId1"]
    assert "".join(body.itertext()) == "A black dog runs."


def test_whatever_order_tags_come_back_in_the_file_is_whole(source: bytes) -> None:
    """The markup layer may put spans and points in any order: the file still opens, and
    every bookmark, tab, link and footnote mark is there once."""
    extracted = DocxFormat.extract(source, DocumentLimits())
    rng = random.Random(34)
    for _ in range(5):
        output = extracted.write([scrambled(segment, rng) for segment in extracted.segments])
        document = docx.Document(io.BytesIO(output))
        assert len(document.paragraphs) == len(docx.Document(io.BytesIO(source)).paragraphs)
        body = etree.fromstring(part(output, "word/document.xml"))
        for kept in ("bookmarkStart", "bookmarkEnd", "footnoteReference", "tab", "hyperlink"):
            assert len(body.findall(f".//{{{W}}}{kept}")) == 1, kept
        assert paragraphs(output)[0] == "Un homme joue de la guitare."


def scrambled(segment: str, rng: random.Random) -> str:
    """The segment with its elements (and what they hold) in a random order among its text."""
    root = ElementTree.fromstring(f"<x>{segment}</x>")
    elements, tails = list(root), [child.tail or "" for child in root]
    rng.shuffle(elements)
    out = [escape(root.text or "")]
    for element, tail in zip(elements, tails, strict=True):
        element.tail = None
        out += [ElementTree.tostring(element, encoding="unicode"), escape(tail)]
    return "".join(out)


def test_macro_enabled_documents_are_refused() -> None:
    source = build()
    macro = rewrite(
        source,
        {
            "[Content_Types].xml": lambda xml: xml.replace(
                b"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml",
                b"application/vnd.ms-word.document.macroEnabled.main+xml",
            )
        },
        add={"word/vbaProject.bin": b"\xd0\xcf\x11\xe0 macros"},
    )
    assert DocxFormat.sniff(macro)  # so that the refusal says why
    with pytest.raises(DocumentRefused, match="macro-enabled"):
        DocxFormat.extract(macro, DocumentLimits())
    # A macro project slipped into a .docx is refused alike.
    with pytest.raises(DocumentRefused, match="macro-enabled"):
        DocxFormat.extract(rewrite(source, {}, add={"word/vbaProject.bin": b"x"}), DocumentLimits())


def test_limits_and_hostile_xml_refused() -> None:
    source = build()
    with pytest.raises(DocumentRefused) as refused:
        DocxFormat.extract(source, DocumentLimits(max_characters=100))
    assert refused.value.status == 413
    entities = rewrite(
        source,
        {
            "word/document.xml": lambda xml: xml.replace(
                b"?>", b'?><!DOCTYPE w:document [<!ENTITY e "Un chat">]>', 1
            )
        },
    )
    with pytest.raises(DocumentRefused, match="entities"):
        DocxFormat.extract(entities, DocumentLimits())


def rewrite(data: bytes, change: dict, add: dict[str, bytes] | None = None) -> bytes:
    """The zip with some members changed (name -> function of their bytes) or added."""
    old = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as new:
        for name in old.namelist():
            content = old.read(name)
            new.writestr(name, change[name](content) if name in change else content)
        for name, content in (add or {}).items():
            new.writestr(name, content)
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("soffice") is None, reason="LibreOffice (soffice) is not on PATH")
def test_libreoffice_converts_the_translation_to_pdf(
    translated: tuple[list[str], bytes], tmp_path: Path
) -> None:
    """The translated file is a Word document another office suite reads and lays out."""
    soffice = shutil.which("soffice") or "soffice"
    document = tmp_path / "translated.docx"
    document.write_bytes(translated[1])
    subprocess.run(
        [soffice, "--headless", "--convert-to", "pdf", "--outdir", str(tmp_path), str(document)],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "HOME": str(tmp_path)},  # its profile in the test folder
    )
    pdf = (tmp_path / "translated.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and len(pdf) > 1000
