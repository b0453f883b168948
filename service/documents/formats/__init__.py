"""The document formats, each an adapter (base.DocumentFormat), and how a file's format is
found: from its content, never its name (a .docx renamed .txt is still a Word file, and a
macro-enabled file renamed .docx is still refused)."""

from __future__ import annotations

from functools import cache

from service.documents.formats.base import (
    DocumentFormat,
    DocumentLimits,
    DocumentRefused,
    Extracted,
)


@cache
def formats() -> tuple[type[DocumentFormat], ...]:
    """Every format, in the order they are sniffed: the zip-based formats by their declared
    content type, then the text formats from the most particular (XLIFF, subtitles, HTML) to
    plain text, which takes any decodable text and so comes last. (Imported on first use: an
    adapter's libraries load only when documents are asked for.)"""
    from service.documents.formats.docx import DocxFormat
    from service.documents.formats.epub import EpubFormat
    from service.documents.formats.html import HtmlFormat
    from service.documents.formats.opendocument import OdpFormat, OdtFormat
    from service.documents.formats.pptx import PptxFormat
    from service.documents.formats.subtitles import SrtFormat, VttFormat
    from service.documents.formats.text import TxtFormat
    from service.documents.formats.xliff import XliffFormat
    from service.documents.formats.xlsx import XlsxFormat

    return (
        DocxFormat,
        PptxFormat,
        XlsxFormat,
        OdtFormat,
        OdpFormat,
        EpubFormat,
        XliffFormat,
        SrtFormat,
        VttFormat,
        HtmlFormat,
        TxtFormat,
    )


def format_named(name: str) -> type[DocumentFormat]:
    return next(format for format in formats() if format.name == name)


def supported_extensions() -> list[str]:
    """What LibreTranslate's /frontend/settings calls supportedFilesFormat: [".docx", ...]."""
    return [extension for format in formats() for extension in format.extensions]


def detect(data: bytes) -> type[DocumentFormat]:
    """The format of a file, judged from its content; DocumentRefused (415) for none."""
    for format in formats():
        if format.sniff(data):
            return format
    from service.documents.formats.text import why_not_text

    if refused := why_not_text(data):  # text, but not in an encoding read: say which
        raise refused
    raise DocumentRefused(
        "the file is not in a format this server translates; it reads "
        + ", ".join(supported_extensions()),
        415,
    )


__all__ = [
    "DocumentFormat",
    "DocumentLimits",
    "DocumentRefused",
    "Extracted",
    "detect",
    "format_named",
    "formats",
    "supported_extensions",
]
