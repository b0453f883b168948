"""Opening what a client uploads without trusting it: zip archives (office and OpenDocument
files, epub) and XML.

- Zip bombs: the declared inflated sizes are checked before anything is read (total, and each
  member's ratio over its stored size), and inflation stops at the declared size, so a member
  that lies about its size cannot inflate further.
- Path traversal: a member named `../x`, `/x`, `C:x` or with a backslash is refused. Nothing is
  ever extracted to disk anyway: members are read into memory and written into a new archive.
- XML: a document type declaration is refused outright (no entities, so no billion laughs and
  no external entities), and lxml is told to resolve nothing and fetch nothing.
"""

from __future__ import annotations

import io
import lzma
import re
import zipfile
import zlib
from dataclasses import dataclass, field

from lxml import etree

from service.documents.formats.base import DocumentLimits, DocumentRefused

_DRIVE = re.compile(r"^[A-Za-z]:")
# What reading a damaged or unusual zip raises: a bad header or checksum (BadZipFile), a stream
# that does not inflate (zlib.error, lzma.LZMAError; bz2 raises OSError), a truncated one
# (EOFError), a compression method zipfile lacks (NotImplementedError), an encrypted member
# (RuntimeError: a password is required), a name it cannot find (KeyError).
DAMAGED_ZIP = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    lzma.LZMAError,
    OSError,
    EOFError,
    ValueError,
    NotImplementedError,
    RuntimeError,
    KeyError,
)


@dataclass
class Archive:
    """A zip read into memory, member by member, in its original order."""

    infos: list[zipfile.ZipInfo]
    members: dict[str, bytes] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [info.filename for info in self.infos]

    def read(self, name: str) -> bytes:
        try:
            return self.members[name]
        except KeyError:
            raise DocumentRefused(f"the archive has no member {name!r}") from None

    def has(self, name: str) -> bool:
        return name in self.members

    def write(self, replaced: dict[str, bytes]) -> bytes:
        """A new archive: the members named in `replaced` with their new content, every other
        member byte for byte as it was; same order, names, dates and compression."""
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            for info in self.infos:
                data = replaced.get(info.filename, self.members[info.filename])
                copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                copy.compress_type = info.compress_type
                copy.external_attr = info.external_attr
                copy.comment = info.comment
                copy.extra = info.extra
                archive.writestr(copy, data)
        return out.getvalue()


def is_zip(data: bytes) -> bool:
    return data[:4] == b"PK\x03\x04"


def small_member(data: bytes, name: str, cap: int) -> bytes | None:
    """The member `name` of the zip `data` (a format's signature: a mimetype, a content types
    list) if it has one of at most `cap` bytes that reads whole; else None: sniffing, an archive
    that is damaged or not as expected is simply not that format."""
    if not is_zip(data):
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            info = archive.getinfo(name)
            if info.file_size > cap or info.flag_bits & 0x1:
                return None
            with archive.open(info) as member:
                return member.read(cap + 1)
    except DAMAGED_ZIP:
        return None


def open_zip(data: bytes, limits: DocumentLimits) -> Archive:
    """The archive's members, read into memory after its declared sizes pass the limits."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as error:
        raise DocumentRefused(f"the file is not a readable zip archive ({error})") from None
    if len(infos) > limits.max_members:
        raise DocumentRefused(
            f"the archive has {len(infos)} members, more than {limits.max_members}", 413
        )
    total, names = 0, set()
    for info in infos:
        _check_name(info.filename)
        if info.filename in names:  # which one a reader takes is its own choice: ambiguous
            raise DocumentRefused(f"the archive holds two members named {info.filename!r}")
        names.add(info.filename)
        if info.flag_bits & 0x1:
            raise DocumentRefused(f"the archive member {info.filename!r} is encrypted")
        total += info.file_size
        if total > limits.max_uncompressed_bytes:
            raise DocumentRefused(
                f"the archive inflates to more than {limits.max_uncompressed_bytes} bytes "
                "(NMT_MAX_DOCUMENT_UNCOMPRESSED_BYTES)",
                413,
            )
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > 1024 * 1024 and ratio > limits.max_compression_ratio:
            raise DocumentRefused(
                f"the archive member {info.filename!r} inflates {ratio:.0f} times, more than "
                f"{limits.max_compression_ratio} (NMT_MAX_DOCUMENT_COMPRESSION_RATIO): "
                "a zip bomb",
                413,
            )
    read = Archive(infos)
    for info in infos:
        read.members[info.filename] = _inflate(archive, info)
    return read


def _inflate(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """The member's bytes, never more than it declared (a lying header cannot inflate on)."""
    try:
        with archive.open(info) as member:
            data = member.read(info.file_size + 1)
    except DAMAGED_ZIP as error:
        raise DocumentRefused(
            f"the archive member {info.filename!r} is damaged ({error})"
        ) from None
    if len(data) > info.file_size:
        raise DocumentRefused(
            f"the archive member {info.filename!r} inflates past its declared size", 413
        )
    return data


def _check_name(name: str) -> None:
    parts = name.split("/")
    if (
        name.startswith("/")
        or "\\" in name
        or _DRIVE.match(name)
        or ".." in parts
        or "\x00" in name
    ):
        raise DocumentRefused(f"the archive member name {name!r} points outside the archive")


# `<!DOCTYPE html>` (XHTML) is harmless with nothing loaded; an internal subset `[...]` or an
# entity declaration is how entity expansion and external entities get in: refused.
_DECLARES_ENTITIES = re.compile(rb"<!DOCTYPE[^>\[]*\[|<!ENTITY", re.IGNORECASE)

# Parsing XML a client sent: nothing resolved, nothing fetched, no huge trees.
_PARSER = etree.XMLParser(
    resolve_entities=False,
    no_network=True,
    load_dtd=False,
    huge_tree=False,
    remove_blank_text=False,
)


def parse_xml(data: bytes, what: str) -> etree._Element:
    """A document's XML root; DocumentRefused for XML that declares a document type (entity
    expansion, external entities) or cannot be read. `what` names it in the error."""
    if _DECLARES_ENTITIES.search(data):
        raise DocumentRefused(f"{what} declares entities (a DTD subset): they are not read")
    try:
        root = etree.fromstring(data, _PARSER)
    except etree.XMLSyntaxError as error:
        raise DocumentRefused(f"{what} is not well-formed XML ({error})") from None
    if root is None:
        raise DocumentRefused(f"{what} holds no XML")
    # The bytes' check reads ASCII; in another encoding (UTF-16) a subset passes it unseen, and
    # the parsed document says what it declared (nothing was resolved meanwhile).
    subset = root.getroottree().docinfo.internalDTD
    if subset is not None and (any(subset.iterentities()) or any(subset.iterelements())):
        raise DocumentRefused(f"{what} declares entities (a DTD subset): they are not read")
    return root


def xml_bytes(root: etree._Element) -> bytes:
    """The tree written back as its part was: UTF-8 with the XML declaration, standalone kept."""
    tree = root.getroottree()
    return etree.tostring(
        tree,
        xml_declaration=True,
        encoding=tree.docinfo.encoding or "UTF-8",
        standalone=tree.docinfo.standalone or None,  # False: the declaration had none
    )
