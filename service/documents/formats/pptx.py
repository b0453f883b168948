"""PowerPoint presentations (.pptx): every paragraph of every slide (titles, text boxes,
placeholders, grouped shapes, table cells), in slide order, each slide followed by its
speaker notes. DrawingML runs are mapped in formats/ooxml.py.

Not translated: charts and SmartArt (their own parts), slide layouts and masters (their
placeholder prompts are never shown in a slide show), comments, the document's properties.
"""

from __future__ import annotations

from typing import ClassVar

from service.documents.formats.base import (
    DocumentFormat,
    DocumentLimits,
    DocumentRefused,
    Extracted,
)
from service.documents.formats.ooxml import Flavour, Package, Unit, drawing_units, extract_package

_P = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
_R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"

_FLAVOUR = Flavour(
    label="PowerPoint",
    extension=".pptx",
    macro_extension=".pptm",
    main_types=frozenset(
        {
            "application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml",
            "application/vnd.openxmlformats-officedocument.presentationml.slideshow.main+xml",
            "application/vnd.openxmlformats-officedocument.presentationml.template.main+xml",
            "application/vnd.ms-powerpoint.presentation.macroEnabled.main+xml",
            "application/vnd.ms-powerpoint.slideshow.macroEnabled.main+xml",
            "application/vnd.ms-powerpoint.template.macroEnabled.main+xml",
        }
    ),
)


class PptxFormat(DocumentFormat):
    name: ClassVar[str] = "pptx"
    extensions: ClassVar[tuple[str, ...]] = (".pptx",)
    media_type: ClassVar[str] = (
        "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    )

    @classmethod
    def sniff(cls, data: bytes) -> bool:
        return _FLAVOUR.sniff(data)

    @classmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> Extracted:
        return extract_package(data, limits, _FLAVOUR, _read)


def _read(package: Package) -> list[Unit]:
    main = package.main_part()
    presentation = package.xml(main)
    if presentation.tag != f"{_P}presentation":
        raise DocumentRefused(
            "the presentation is in Strict Open XML, which is not read: save it as a "
            "PowerPoint Presentation (.pptx)",
            415,
        )
    related = package.relationships(main)
    units = []
    for slide_id in presentation.iter(f"{_P}sldId"):
        kind, slide = related.get(slide_id.get(f"{_R}id", ""), ("", ""))
        if kind != "slide":
            continue
        units += drawing_units(slide, package.xml(slide))
        for notes in package.related(slide, ("notesSlide",)):
            units += drawing_units(notes, package.xml(notes))
    return units
