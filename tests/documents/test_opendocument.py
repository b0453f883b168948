"""OpenDocument text and presentations: built with odfpy, translated through OdtFormat and
OdpFormat, read back with odfpy. What must hold: every paragraph (body, heading, table cells,
notes, text boxes, header and footer, slides and speaker notes) comes back as the text API
translates its segment; a bold or linked word's span is on its translation; tabs, line
breaks, notes and frames are kept; comments are not translated; the mimetype member stays
first and stored; an identity translation writes the same XML back."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from odf import draw, office, presentation, table, teletype, text
from odf.element import Element
from odf.opendocument import OpenDocument, OpenDocumentPresentation, OpenDocumentText, load
from odf.style import (
    Footer,
    GraphicProperties,
    Header,
    MasterPage,
    PageLayout,
    Style,
    TextProperties,
)

from service.documents.formats.base import DocumentLimits, DocumentRefused
from service.documents.formats.opendocument import OdpFormat, OdtFormat
from service.documents.formats.text import plain_text
from tests.documents.conftest import SegmentTranslator

LINK = "https://example.org/rue"
TEXT_NS = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"


def _styles(document: OpenDocument) -> tuple[Style, Style]:
    bold = Style(name="Gras", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    italic = Style(name="Italique", family="text")
    italic.addElement(TextProperties(fontstyle="italic"))
    document.automaticstyles.addElement(bold)
    document.automaticstyles.addElement(italic)
    return bold, italic


def _save(document: OpenDocument) -> bytes:
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


def build_odt() -> bytes:
    """A document with what the adapter must handle: a heading, a bold word, an italic word
    in a link, a tab, a line break, leading spaces, a footnote, a text box in a frame, a
    comment, a table (with a number), a space between two spans, an empty paragraph, a header
    and a footer."""
    document = OpenDocumentText()
    bold, italic = _styles(document)
    layout = PageLayout(name="Mise")
    document.automaticstyles.addElement(layout)
    master = MasterPage(name="Standard", pagelayoutname=layout)
    header, footer = Header(), Footer()
    header.addElement(text.P(text="Un chat"))
    footer.addElement(text.P(text="Deux chiens"))
    master.addElement(header)
    master.addElement(footer)
    document.masterstyles.addElement(master)

    body = document.text
    body.addElement(text.H(outlinelevel=1, text="Un garçon saute dans l'eau."))
    paragraph = text.P(text="Un chien ")
    paragraph.addElement(text.Span(stylename=bold, text="noir"))
    paragraph.addText(" court dans l'herbe.")
    body.addElement(paragraph)
    paragraph = text.P(text="Un homme ")
    link = text.A(href=LINK, type="simple")
    link.addElement(text.Span(stylename=italic, text="marche"))
    paragraph.addElement(link)
    paragraph.addText(" dans la rue avec son chien.")
    body.addElement(paragraph)
    paragraph = text.P(text="Un chat")
    paragraph.addElement(text.Tab())
    paragraph.addText("Un chien")
    paragraph.addElement(text.LineBreak())
    paragraph.addText("Deux hommes jouent au football.")
    note = text.Note(id="ftn1", noteclass="footnote")
    note.addElement(text.NoteCitation(text="1"))
    note_body = text.NoteBody()
    note_body.addElement(text.P(text="Une femme chante."))
    note.addElement(note_body)
    paragraph.addElement(note)
    body.addElement(paragraph)
    paragraph = text.P()
    paragraph.addElement(text.S(c=2))
    paragraph.addText("Une femme en robe ")
    paragraph.addElement(text.Span(stylename=bold, text="rouge"))
    paragraph.addText(" chante.")
    frame = draw.Frame(anchortype="as-char", width="4cm", height="1cm")
    box = draw.TextBox()
    box.addElement(text.P(text="Un homme marche dans la rue."))
    frame.addElement(box)
    paragraph.addElement(frame)
    body.addElement(paragraph)
    paragraph = text.P(text="Deux enfants jouent dans le parc.")
    comment = office.Annotation()
    comment.addElement(text.P(text="Un commentaire de relecture"))
    paragraph.addElement(comment)
    body.addElement(paragraph)
    grid = table.Table(name="Tableau")
    grid.addElement(table.TableColumn(numbercolumnsrepeated=2))
    for row_texts in (("Un chat", "42"), ("Un chien", "Une petite fille joue avec un ballon.")):
        row = table.TableRow()
        for cell_text in row_texts:
            cell = table.TableCell()
            cell.addElement(text.P(text=cell_text))
            row.addElement(cell)
        grid.addElement(row)
    body.addElement(grid)
    body.addElement(_spans(bold, italic))
    body.addElement(text.P())
    return _save(document)


def _spans(bold: Style, italic: Style) -> text.P:
    paragraph = text.P()
    paragraph.addElement(text.Span(stylename=bold, text="Un grand chien"))
    paragraph.addText(" ")  # read inside the bold span (see attach_spaces), written back here
    paragraph.addElement(text.Span(stylename=italic, text="noir"))
    paragraph.addText(" court.")
    return paragraph


def build_odp() -> bytes:
    """Two slides (text boxes, a bold word, a table) with speaker notes, and a master page
    showing a text of its own on every slide."""
    document = OpenDocumentPresentation()
    bold, _ = _styles(document)
    frame_style = Style(name="Cadre", family="graphic")
    frame_style.addElement(GraphicProperties())
    document.automaticstyles.addElement(frame_style)
    layout = PageLayout(name="Diapo")
    document.automaticstyles.addElement(layout)
    master = MasterPage(name="Principal", pagelayoutname=layout)
    master.addElement(_box(text.P(text="Un chat"), frame_style))
    document.masterstyles.addElement(master)

    slide = draw.Page(name="Une", masterpagename=master)
    paragraph = text.P(text="Un chien ")
    paragraph.addElement(text.Span(stylename=bold, text="noir"))
    paragraph.addText(" court dans l'herbe.")
    slide.addElement(_box(paragraph, frame_style))
    notes = presentation.Notes()
    notes.addElement(_box(text.P(text="Un homme marche dans la rue avec son chien."), frame_style))
    slide.addElement(notes)
    document.presentation.addElement(slide)

    slide = draw.Page(name="Deux", masterpagename=master)
    slide.addElement(_box(text.P(text="Deux hommes jouent au football."), frame_style))
    frame = draw.Frame(width="10cm", height="3cm", x="1cm", y="5cm")
    grid = table.Table()
    grid.addElement(table.TableColumn(numbercolumnsrepeated=2))
    row = table.TableRow()
    for cell_text in ("Une femme chante.", "2024"):
        cell = table.TableCell()
        cell.addElement(text.P(text=cell_text))
        row.addElement(cell)
    grid.addElement(row)
    frame.addElement(grid)
    slide.addElement(frame)
    document.presentation.addElement(slide)
    return _save(document)


def _box(paragraph: Element, style: Style) -> draw.Frame:
    frame = draw.Frame(stylename=style, width="20cm", height="2cm", x="1cm", y="1cm")
    box = draw.TextBox()
    box.addElement(paragraph)
    frame.addElement(box)
    return frame


# --- Reading back with odfpy -------------------------------------------------------------


def _elements(document: OpenDocument, kind: object) -> list[Element]:
    """Elements of a kind in document order: content, then the master pages."""
    return document.body.getElementsByType(kind) + document.masterstyles.getElementsByType(kind)


def _own_text(element: Element) -> str:
    """A paragraph's text as a reader sees it, without what its notes, frames and comments
    hold (those are paragraphs of their own)."""
    parts: list[str] = []
    for child in element.childNodes:
        if child.nodeType == child.TEXT_NODE:
            parts.append(re.sub(r"[ \t\r\n]+", " ", child.data))
        elif child.qname == (TEXT_NS, "s"):
            parts.append(" " * int(child.getAttribute("c") or 1))
        elif child.qname == (TEXT_NS, "tab"):
            parts.append("\t")
        elif child.qname == (TEXT_NS, "line-break"):
            parts.append("\n")
        elif child.qname in ((TEXT_NS, "span"), (TEXT_NS, "a")):
            parts.append(_own_text(child))
    return "".join(parts)


def _paragraph_texts(document: OpenDocument) -> list[str]:
    return [
        _own_text(paragraph) for kind in (text.H, text.P) for paragraph in _elements(document, kind)
    ]


def _counts(document: OpenDocument) -> dict[str, int]:
    kinds = {
        "p": text.P,
        "h": text.H,
        "a": text.A,
        "tab": text.Tab,
        "line-break": text.LineBreak,
        "note": text.Note,
        "frame": draw.Frame,
        "annotation": office.Annotation,
        "cell": table.TableCell,
        "page": draw.Page,
        "notes": presentation.Notes,
    }
    return {name: len(_elements(document, kind)) for name, kind in kinds.items()}


def _span_styles(document: OpenDocument) -> set[str]:
    """The text styles spans carry (how many spans carry them may change: a bold run whose
    words the translation splits around another word is two spans)."""
    return {str(span.getAttribute("stylename")) for span in _elements(document, text.Span)}


def _normal(segment_or_text: str) -> str:
    """Text compared as a reader sees it: runs of spaces are one, and a tab reads as one
    (the adapter writes no spaces next to a tab)."""
    return re.sub(r" *\t *", "\t", re.sub(r" +", " ", segment_or_text)).strip()


def _styled(document: OpenDocument, style: str) -> list[str]:
    return [
        teletype.extractText(span)
        for span in _elements(document, text.Span)
        if span.getAttribute("stylename") == style
    ]


# --- Tests --------------------------------------------------------------------------------


def test_sniff_by_mimetype_member() -> None:
    odt, odp = build_odt(), build_odp()
    assert OdtFormat.sniff(odt) and not OdpFormat.sniff(odt)
    assert OdpFormat.sniff(odp) and not OdtFormat.sniff(odp)
    renamed = io.BytesIO()
    with zipfile.ZipFile(renamed, "w") as archive:
        archive.writestr("mimetype", "application/vnd.oasis.opendocument.spreadsheet")
        archive.writestr("content.xml", "<x/>")
    assert not OdtFormat.sniff(renamed.getvalue()) and not OdpFormat.sniff(renamed.getvalue())
    assert not OdtFormat.sniff(b"Un chien noir court dans l'herbe.")


def test_odt_segments() -> None:
    segments = OdtFormat.extract(build_odt(), DocumentLimits()).segments
    assert segments == [
        "Un garçon saute dans l'eau.",
        "Un chien <s1>noir</s1> court dans l'herbe.",
        "Un homme <s1>marche</s1> dans la rue avec son chien.",
        "Un chat\n<p0/>Un chien\nDeux hommes jouent au football.<p1/>",
        "Une femme chante.",
        "  Une femme en robe <s1>rouge</s1> chante.<p0/>",
        "Un homme marche dans la rue.",
        "Deux enfants jouent dans le parc.<p0/>",
        "Un chat",
        "Un chien",
        "Une petite fille joue avec un ballon.",
        "Un grand chien <s1>noir</s1><s2> court.</s2>",
        "Un chat",  # the header, in styles.xml
        "Deux chiens",  # the footer
    ]


def test_odt_translated_as_the_text_api_translates(
    translate_segments: SegmentTranslator,
) -> None:
    data = build_odt()
    extracted = OdtFormat.extract(data, DocumentLimits())
    translations = translate_segments(extracted.segments, OdtFormat)
    out = extracted.write(translations)

    before, after = load(io.BytesIO(data)), load(io.BytesIO(out))
    assert _counts(after) == _counts(before)
    assert _span_styles(after) == _span_styles(before)
    # Every paragraph reads as its segment's translation; those not translated are unchanged.
    again = OdtFormat.extract(out, DocumentLimits()).segments
    assert [_normal(plain_text(s)) for s in again] == [_normal(plain_text(t)) for t in translations]
    texts = _paragraph_texts(after)
    assert "42" in texts and "" in texts
    # The bold word's span holds its translation; the link keeps its target and its italic.
    assert _styled(after, "Gras")[0] == "black"
    links = _elements(after, text.A)
    assert [link.getAttribute("href") for link in links] == [LINK]
    italic = [teletype.extractText(span) for span in links[0].getElementsByType(text.Span)]
    assert italic in (["walking"], ["is walking"])  # "marche"
    # The note keeps its citation and its body is translated; the comment is not.
    (note,) = _elements(after, text.Note)
    assert teletype.extractText(note.getElementsByType(text.NoteCitation)[0]) == "1"
    assert _own_text(note.getElementsByType(text.P)[0]) == plain_text(translations[4])
    (comment,) = _elements(after, office.Annotation)
    assert teletype.extractText(comment) == "Un commentaire de relecture"
    # Header and footer (styles.xml) are translated too.
    (header,) = _elements(after, Header)
    assert _own_text(header.getElementsByType(text.P)[0]) == plain_text(translations[-2])
    # Paragraph and text styles are the source's.
    assert [p.getAttribute("stylename") for p in _elements(after, text.P)] == [
        p.getAttribute("stylename") for p in _elements(before, text.P)
    ]
    assert zipfile.ZipFile(io.BytesIO(out)).read("meta.xml") == zipfile.ZipFile(
        io.BytesIO(data)
    ).read("meta.xml")


def test_odt_tab_line_break_and_spaces_written_as_odf_wants() -> None:
    extracted = OdtFormat.extract(build_odt(), DocumentLimits())
    translations = list(extracted.segments)
    translations[3] = "A cat <p0/>\n A dog\nTwo men  play.<p1/>"
    translations[5] = "  A woman in a <s1>red</s1> dress sings.<p0/>"
    after = load(io.BytesIO(extracted.write(translations)))
    paragraphs = _elements(after, text.P)
    tabbed = next(p for p in paragraphs if p.getElementsByType(text.Tab))
    assert _own_text(tabbed) == "A cat\tA dog\nTwo men  play."
    assert len(tabbed.getElementsByType(text.S)) == 1  # the second space of "men  play"
    assert tabbed.getElementsByType(text.Note)  # the note citation is still in it
    spaced = next(p for p in paragraphs if p.getElementsByType(draw.Frame))
    assert _own_text(spaced) == "  A woman in a red dress sings."
    assert _styled(after, "Gras")[1] == "red"


def test_odt_identity_translation_writes_the_same_xml() -> None:
    data = build_odt()
    extracted = OdtFormat.extract(data, DocumentLimits())
    out = extracted.write(extracted.segments)
    source, written = zipfile.ZipFile(io.BytesIO(data)), zipfile.ZipFile(io.BytesIO(out))
    assert written.namelist() == source.namelist()
    for name in source.namelist():
        if name in ("content.xml", "styles.xml"):  # rewritten: same tree, same text
            assert _without_declaration(written.read(name)) == _without_declaration(
                source.read(name)
            )
        else:
            assert written.read(name) == source.read(name)
    first = written.infolist()[0]
    assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED
    assert _paragraph_texts(load(io.BytesIO(out))) == _paragraph_texts(load(io.BytesIO(data)))


def _without_declaration(xml: bytes) -> bytes:
    return re.sub(rb"^<\?xml[^>]*\?>\s*", b"", xml)


def test_odp_translated_as_the_text_api_translates(
    translate_segments: SegmentTranslator,
) -> None:
    data = build_odp()
    extracted = OdpFormat.extract(data, DocumentLimits())
    assert extracted.segments == [
        "Un chien <s1>noir</s1> court dans l'herbe.",
        "Un homme marche dans la rue avec son chien.",  # the first slide's notes
        "Deux hommes jouent au football.",
        "Une femme chante.",  # a table cell ("2024" is not translated)
        "Un chat",  # the master page
    ]
    translations = translate_segments(extracted.segments, OdpFormat)
    out = extracted.write(translations)
    before, after = load(io.BytesIO(data)), load(io.BytesIO(out))
    assert _counts(after) == _counts(before)
    assert _counts(after)["page"] == 2 and _counts(after)["cell"] == 2
    again = OdpFormat.extract(out, DocumentLimits()).segments
    assert [_normal(plain_text(s)) for s in again] == [_normal(plain_text(t)) for t in translations]
    assert _styled(after, "Gras") == ["black"]
    (notes,) = _elements(after, presentation.Notes)
    assert _own_text(notes.getElementsByType(text.P)[0]) == plain_text(translations[1])
    assert "2024" in _paragraph_texts(after)
    assert [page.getAttribute("name") for page in _elements(after, draw.Page)] == ["Une", "Deux"]
    first = zipfile.ZipFile(io.BytesIO(out)).infolist()[0]
    assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED


def test_odp_identity_round_trip() -> None:
    data = build_odp()
    extracted = OdpFormat.extract(data, DocumentLimits())
    out = extracted.write(extracted.segments)
    assert _paragraph_texts(load(io.BytesIO(out))) == _paragraph_texts(load(io.BytesIO(data)))
    assert _without_declaration(
        zipfile.ZipFile(io.BytesIO(out)).read("content.xml")
    ) == _without_declaration(zipfile.ZipFile(io.BytesIO(data)).read("content.xml"))


def test_write_twice_starts_from_the_file() -> None:
    extracted = OdtFormat.extract(build_odt(), DocumentLimits())
    upper = extracted.write([segment.upper() for segment in extracted.segments])
    same = extracted.write(extracted.segments)
    assert OdtFormat.extract(same, DocumentLimits()).segments == extracted.segments
    assert "UN CHIEN" in plain_text(OdtFormat.extract(upper, DocumentLimits()).segments[1])


def test_refusals() -> None:
    data = build_odt()
    with pytest.raises(DocumentRefused) as refused:
        OdtFormat.extract(data, DocumentLimits(max_characters=100))
    assert refused.value.status == 413
    encrypted = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as source,
        zipfile.ZipFile(encrypted, "w") as archive,
    ):
        for info in source.infolist():
            content = source.read(info)
            if info.filename == "META-INF/manifest.xml":
                content = content.replace(
                    b"</manifest:manifest>",
                    b"<manifest:file-entry manifest:full-path='x'>"
                    b"<manifest:encryption-data/></manifest:file-entry></manifest:manifest>",
                )
            archive.writestr(info, content)
    with pytest.raises(DocumentRefused, match="password-protected"):
        OdtFormat.extract(encrypted.getvalue(), DocumentLimits())
    with pytest.raises(DocumentRefused, match="entities"):
        OdtFormat.extract(
            _with_content(data, b'<!DOCTYPE x [<!ENTITY a "b">]><x/>'), DocumentLimits()
        )


def _with_content(data: bytes, content: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            archive.writestr(info, content if info.filename == "content.xml" else source.read(info))
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("soffice") is None, reason="LibreOffice (soffice) is not on PATH")
def test_libreoffice_converts_the_translation_to_pdf(
    translate_segments: SegmentTranslator, tmp_path: Path
) -> None:
    """LibreOffice itself opens the translated file, lays it out and reads its text."""
    soffice = shutil.which("soffice")
    assert soffice is not None
    extracted = OdtFormat.extract(build_odt(), DocumentLimits())
    translations = translate_segments(extracted.segments, OdtFormat)
    source = tmp_path / "traduit.odt"
    source.write_bytes(extracted.write(translations))
    for target in ("pdf", "txt:Text (encoded):UTF8"):
        subprocess.run(
            [soffice, "--headless", f"-env:UserInstallation=file://{tmp_path}/profile",
             "--convert-to", target, "--outdir", str(tmp_path), str(source)],
            check=True, timeout=180, capture_output=True,
        )  # fmt: skip
    assert (tmp_path / "traduit.pdf").read_bytes().startswith(b"%PDF")
    read = (tmp_path / "traduit.txt").read_text(encoding="utf-8-sig")
    assert plain_text(translations[1]) in read and "Un chien noir" not in read
