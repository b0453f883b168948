"""An uploaded file, read: its format (from its content), its segments, and what it asks of
the model (characters, sentences), with every limit checked before anything is stored."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath

from service.documents import markup
from service.documents.formats import (
    DocumentLimits,
    DocumentRefused,
    Extracted,
    detect,
    format_named,
)
from service.documents.formats.base import DocumentFormat
from service.serving.settings import Settings

# What a client's file name may be, once written back in a download's Content-Disposition.
MAX_FILENAME = 200


@dataclass
class Upload:
    format: type[DocumentFormat]
    extracted: Extracted
    characters: int  # of text to translate: what is billed
    filename: str  # of the translated file
    sample: str  # the text of its first segments: what its language is detected on

    @property
    def segments(self) -> int:
        return len(self.extracted.segments)


def limits_of(settings: Settings) -> DocumentLimits:
    return DocumentLimits(
        max_bytes=settings.max_document_bytes,
        max_uncompressed_bytes=settings.max_document_uncompressed_bytes,
        max_compression_ratio=settings.max_document_compression_ratio,
        max_characters=settings.max_document_characters,
    )


def read_upload(
    data: bytes, filename: str | None, output_format: str | None, limits: DocumentLimits
) -> Upload:
    """The file read and checked (CPU work: call it off the event loop); DocumentRefused
    naming what is wrong. `output_format` must be the file's own (no conversion here)."""
    if len(data) > limits.max_bytes:
        raise DocumentRefused(
            f"the file has {len(data)} bytes, more than {limits.max_bytes} "
            "(NMT_MAX_DOCUMENT_BYTES)",
            413,
        )
    if not data:
        raise DocumentRefused("the file is empty")
    format = detect(data)
    if output_format and output_format.lower().lstrip(".") not in (
        format.name,
        *(extension.lstrip(".") for extension in format.extensions),
    ):
        raise DocumentRefused(
            f"output_format {output_format!r}: a {format.name} file is translated into "
            f"{format.name} (conversion between formats is not offered)"
        )
    extracted = format.extract(data, limits)
    try:  # as the worker will read them: the layout of every segment, its text
        documents = markup.read(extracted.segments, format.markup)
    except markup.MarkupError as error:  # an adapter's bug, or content it let through
        raise DocumentRefused(f"the file's text cannot be laid out ({error})") from None
    characters = sum(len(document.plain_text) for document in documents)
    if characters > limits.max_characters:
        raise DocumentRefused(
            f"the file holds {characters} characters of text, more than "
            f"{limits.max_characters} (NMT_MAX_DOCUMENT_CHARACTERS)",
            413,
        )
    sample = " ".join(document.plain_text for document in documents[:200])[:5000]
    return Upload(format, extracted, characters, result_name(filename, format), sample)


def reopen(format_name: str, data: bytes, limits: DocumentLimits) -> Extracted:
    """A stored upload read again by the worker (it passed read_upload when it came)."""
    return format_named(format_name).extract(data, limits)


def result_name(filename: str | None, format: type[DocumentFormat]) -> str:
    """The translated file's name: the client's base name (no folders, no control
    characters), with the format's extension when it has none of its own."""
    name = PureWindowsPath(PurePosixPath(filename or "").name).name if filename else ""
    name = "".join(c for c in name if c.isprintable() and c not in '"\\/')[:MAX_FILENAME].strip()
    if not name or name.startswith("."):
        name = "document" + (name if name.startswith(".") else "")
    if not any(name.lower().endswith(extension) for extension in format.extensions):
        name += format.extensions[0]
    return name
