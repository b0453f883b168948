"""Excel workbooks (.xlsx): the text of text cells, nothing else.

A text cell holds either an index into the shared strings (`t="s"`, sharedStrings.xml) or an
inline string (`t="inlineStr"`). A shared string is one segment however many cells use it (so
it is translated once); it is translated only if no formula cell refers to it, since a formula's
cached result must stay what the formula computes. Formulas, numbers, booleans, errors, sheet
names and comments are never touched. Rich text (`r` runs with `rPr` font properties) is a
Paragraph like a Word paragraph: a bold word stays on its translation.

Phonetic guides (`rPh`, furigana) index characters of the source text, so they are dropped
from a translated string; its `phoneticPr` is kept.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable
from typing import ClassVar

from lxml import etree

from service.documents.formats.base import (
    DocumentFormat,
    DocumentLimits,
    DocumentRefused,
    Extracted,
)
from service.documents.formats.inline import Paragraph, Piece
from service.documents.formats.ooxml import (
    Flavour,
    Package,
    Unit,
    extract_package,
    set_text,
    tag,
    text_style,
    worth_translating,
)
from service.documents.markup import MarkupOptions

_S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"

_FLAVOUR = Flavour(
    label="Excel",
    extension=".xlsx",
    macro_extension=".xlsm",
    main_types=frozenset(
        {
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml",
            "application/vnd.openxmlformats-officedocument.spreadsheetml.template.main+xml",
            "application/vnd.ms-excel.sheet.macroEnabled.main+xml",
            "application/vnd.ms-excel.template.macroEnabled.main+xml",
        }
    ),
)


class XlsxFormat(DocumentFormat):
    name: ClassVar[str] = "xlsx"
    extensions: ClassVar[tuple[str, ...]] = (".xlsx",)
    media_type: ClassVar[str] = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    # A cell's lines (Alt+Enter) are often a list: each line its own sentence, newlines kept.
    markup: ClassVar[MarkupOptions] = MarkupOptions(
        kind="xml", split="sentences", outline_detection=False
    )

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        return _FLAVOUR.sniff(data)

    @classmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> Extracted:
        return extract_package(data, limits, _FLAVOUR, _read)


def _read(package: Package) -> list[Unit]:
    main = package.main_part()
    workbook = package.xml(main)
    if workbook.tag != f"{_S}workbook":
        raise DocumentRefused(
            "the workbook is in Strict Open XML, which is not read: save it as an "
            "Excel Workbook (.xlsx)",
            415,
        )
    related = package.relationships(main)
    sheets = [
        related[sheet.get(f"{_R}id", "")][1]
        for sheet in workbook.iter(f"{_S}sheet")
        if related.get(sheet.get(f"{_R}id", ""), ("", ""))[0] == "worksheet"
    ]
    shared: set[int] = set()  # indices of shared strings shown by text cells
    computed: set[int] = set()  # ... and by formula cells: never translated
    inline: list[Unit] = []
    for sheet in sheets:
        for cell in package.xml(sheet).iter(f"{_S}c"):
            has_formula = cell.find(f"{_S}f") is not None
            if cell.get("t") == "s":
                index = _index(cell)
                if index is not None:
                    (computed if has_formula else shared).add(index)
            elif cell.get("t") == "inlineStr" and not has_formula:
                string = cell.find(f"{_S}is")
                unit = None if string is None else _string_unit(sheet, string)
                if unit is not None:
                    inline.append(unit)
    units = []
    table = package.related(main, ("sharedStrings",))
    if table:
        strings = package.xml(table[0]).findall(f"{_S}si")
        for index in sorted(shared - computed):
            unit = _string_unit(table[0], strings[index]) if index < len(strings) else None
            if unit is not None:
                units.append(unit)
    return units + inline


def _index(cell: etree._Element) -> int | None:
    value = cell.find(f"{_S}v")
    try:
        return int((value.text or "").strip()) if value is not None else None
    except ValueError:
        return None


def _string_unit(part: str, string: etree._Element) -> Unit | None:
    """A shared (`si`) or inline (`is`) string: plain (`t`) or rich text (`r` runs)."""
    paragraph = Paragraph()
    properties: dict[Hashable, etree._Element | None] = {}
    plain: list[str] = []
    last_style: Hashable = None
    for child in string:
        name = tag(child)
        if name == f"{_S}t":
            paragraph.text(child.text or "", None)  # style None: a plain `t`, no run
            plain.append(child.text or "")
        elif name == f"{_S}r":
            rpr = child.find(f"{_S}rPr")
            text = "".join(t.text or "" for t in child.iter(f"{_S}t"))
            style = text_style(text, b"" if rpr is None else etree.tostring(rpr), last_style)
            properties.setdefault(style, rpr)
            paragraph.text(text, style)
            plain.append(text)
            last_style = style if text else last_style
    text = "".join(plain)
    if not (paragraph.has_text and worth_translating(text)):
        return None

    def write(pieces: list[Piece]) -> None:
        kept = [child for child in string if tag(child) not in (f"{_S}t", f"{_S}r", f"{_S}rPh")]
        for child in list(string):
            string.remove(child)
        for piece in pieces:
            style = paragraph.styles[piece.style]
            if style is None:
                set_text(etree.SubElement(string, f"{_S}t"), piece.text)
                continue
            run = etree.SubElement(string, f"{_S}r")
            rpr = properties[style]
            if rpr is not None:
                run.append(copy.deepcopy(rpr))
            set_text(etree.SubElement(run, f"{_S}t"), piece.text)
        for child in kept:  # phoneticPr and the like come after the text
            string.append(child)

    return Unit(part, paragraph, len(text), write)
