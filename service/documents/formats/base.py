"""What every document format is: a reader that turns a file into segments (inline XML markup,
one per paragraph, cell, cue or unit) and a writer that puts their translations back.

The markup layer (service/documents/markup) translates the segments: each inline tag in a
segment is carried to the target words aligned to the words it wrapped. So a format only has
to say what a paragraph's runs are: a bold run becomes `<s1>...</s1>` in its segment, and the
translated segment says which target words the bold run now holds. The formats know nothing
of the model, of the store or of HTTP: read bytes, give segments, take translations, give bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from service.documents.markup import MarkupOptions
from service.serving.errors import ServiceError


class DocumentRefused(ServiceError):
    """A file that is not translated, and why: not a format we read, a macro-enabled file, a
    zip bomb, XML with entities, a member name that climbs out of the archive, a file past a
    limit. Said at once, before any translation (status 400; 413 for a limit, 415 for a
    format we do not read)."""

    status = 400

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status  # type: ignore[misc]  # a refusal's status is the instance's


@dataclass(frozen=True)
class DocumentLimits:
    """Caps on what a file may hold once opened (settings NMT_DOCUMENT_*)."""

    max_bytes: int = 20 * 1024 * 1024  # the upload itself
    max_uncompressed_bytes: int = 200 * 1024 * 1024  # all zip members together, inflated
    max_compression_ratio: int = 100  # a member's inflated size over its stored size
    max_members: int = 10_000  # entries in a zip
    max_characters: int = 1_000_000  # text to translate, over all segments


class Extracted(ABC):
    """A file read: its segments, and how to write the file back with their translations."""

    segments: list[str]  # inline XML markup (see base docstring), in document order
    # Set by the caller before write(): the formats that name their language (XLIFF, HTML,
    # epub) write it; None leaves it as it was.
    target_language: str | None = None

    @abstractmethod
    def write(self, translations: list[str]) -> bytes:
        """The file, each segment replaced by its translation (same order, same markup
        elements, as the markup layer returns them); everything else as it was."""


class DocumentFormat(ABC):
    """One format: its names, how to recognise it from the bytes, and how to read it."""

    name: ClassVar[str]  # "docx": also the output_format DeepL clients send
    extensions: ClassVar[tuple[str, ...]]  # (".docx",)
    media_type: ClassVar[str]
    # How the segments are cut into sentences for the model (MarkupOptions.split).
    markup: ClassVar[MarkupOptions] = MarkupOptions(
        kind="xml", split="no_newlines", outline_detection=False
    )

    @classmethod
    @abstractmethod
    def sniff(cls, data: bytes) -> bool:
        """Is this file of this format, judged from its content (never its name)?"""

    @classmethod
    @abstractmethod
    def extract(cls, data: bytes, limits: DocumentLimits) -> Extracted:
        """The file read into segments; DocumentRefused for a file that must not be read."""
