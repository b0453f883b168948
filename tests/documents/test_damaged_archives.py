"""Zip files damaged or built unusually (office documents, OpenDocument, epub): whatever is wrong
with a member, even the one its format is recognized by, the upload is refused with a reason
(DocumentRefused: a 4xx), never an error of the zip or compression library (a 500)."""

from __future__ import annotations

import io
import struct
import zipfile

import pytest

from service.documents.files import limits_of, read_upload
from service.documents.formats import DocumentRefused
from service.serving.settings import Settings
from tests.documents.test_collection import FILES
from tests.documents.test_epub import book_bytes  # noqa: F401 (a fixture)

ARCHIVES = [name for name in sorted(FILES) if name.endswith(("x", ".odt"))]
LOCAL_HEADER, CENTRAL_HEADER = b"PK\x03\x04", b"PK\x01\x02"


def deflated(data: bytes, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    """The archive again, every member compressed by `method` (what the tests then damage)."""
    source, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            archive.writestr(info.filename, source.read(info), compress_type=method)
    return out.getvalue()


def _headers(data: bytes, name: str) -> tuple[int, list[int]]:
    """Where the member's local header starts, and where its central directory entries do."""
    info = zipfile.ZipFile(io.BytesIO(data)).getinfo(name)
    central, at = [], data.find(CENTRAL_HEADER)
    while at >= 0:
        length = struct.unpack("<H", data[at + 28 : at + 30])[0]
        if data[at + 46 : at + 46 + length] == name.encode():
            central.append(at)
        at = data.find(CENTRAL_HEADER, at + 4)
    return info.header_offset, central


def stream_garbled(data: bytes, name: str) -> bytes:
    """The member's compressed bytes scrambled (its headers intact)."""
    info = zipfile.ZipFile(io.BytesIO(data)).getinfo(name)
    local, _ = _headers(data, name)
    start = local + 30 + sum(struct.unpack("<HH", data[local + 26 : local + 30]))
    damaged = bytearray(data)
    for at in range(start, start + min(info.compress_size, 64)):
        damaged[at] ^= 0x5A
    return bytes(damaged)


def method_set(data: bytes, name: str, method: int) -> bytes:
    """The member said to be compressed by `method` in both of its headers."""
    local, central = _headers(data, name)
    damaged = bytearray(data)
    damaged[local + 8 : local + 10] = struct.pack("<H", method)
    for at in central:
        damaged[at + 10 : at + 12] = struct.pack("<H", method)
    return bytes(damaged)


def encrypted(data: bytes, name: str) -> bytes:
    """The member's headers say it is encrypted (flag bit 0)."""
    local, central = _headers(data, name)
    damaged = bytearray(data)
    damaged[local + 6] |= 1
    for at in central:
        damaged[at + 8] |= 1
    return bytes(damaged)


DAMAGES = {
    "deflate stream garbled": lambda data, name: stream_garbled(deflated(data), name),
    "lzma stream garbled": lambda data, name: stream_garbled(
        deflated(data, zipfile.ZIP_LZMA), name
    ),
    "bzip2 stream garbled": lambda data, name: stream_garbled(
        deflated(data, zipfile.ZIP_BZIP2), name
    ),
    "imploded (a method zipfile lacks)": lambda data, name: method_set(data, name, 6),
    "AES (method 99)": lambda data, name: method_set(data, name, 99),
    "encrypted": encrypted,
}


def refused_or_read(data: bytes) -> None:
    try:
        read_upload(data, "a", None, limits_of(Settings()))
    except DocumentRefused as refused:
        assert 400 <= refused.status < 500


def every_member_damaged(data: bytes) -> None:
    for name in zipfile.ZipFile(io.BytesIO(data)).namelist():
        for damage, damaged in DAMAGES.items():
            try:
                refused_or_read(damaged(data, name))
            except Exception as error:
                pytest.fail(f"{name} {damage}: {type(error).__name__}: {error}")


@pytest.mark.parametrize("file", ARCHIVES)
def test_a_damaged_member_refuses_the_upload(file: str) -> None:
    every_member_damaged(FILES[file]())


def test_a_damaged_member_refuses_the_book(book_bytes: bytes) -> None:  # noqa: F811
    every_member_damaged(book_bytes)


@pytest.mark.parametrize("file", ARCHIVES)
def test_a_member_named_twice_refuses_the_upload(file: str) -> None:
    """Readers differ on which one counts (the first, the last): the file is ambiguous, and
    one of the two would be lost in the translation."""
    data = FILES[file]()
    source, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            archive.writestr(info, source.read(info))
        twice = source.infolist()[-1]
        with pytest.warns(UserWarning, match="Duplicate name"):
            archive.writestr(twice, source.read(twice))
    with pytest.raises(DocumentRefused, match="two members named"):
        read_upload(out.getvalue(), "a", None, limits_of(Settings()))
