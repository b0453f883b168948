"""Word files as the tests of the document API build and read them: with python-docx, the
library Word files are made with, not the code under test."""

from __future__ import annotations

import io

import docx


def word_file(paragraphs: list[str]) -> bytes:
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def paragraphs_of(data: bytes) -> list[str]:
    return [paragraph.text for paragraph in docx.Document(io.BytesIO(data)).paragraphs]
