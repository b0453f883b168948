"""An upload's multipart body read in memory: fields, one file, and bodies that are not forms.
The reference is httpx's own multipart encoder (what clients send)."""

from __future__ import annotations

import httpx
import pytest

from service.http.multipart import MAX_FIELDS, MultipartError, parse_multipart


def encoded(data: dict, files: dict) -> tuple[str, bytes]:
    request = httpx.Request("POST", "http://x/", data=data, files=files)
    return request.headers["content-type"], request.read()


def test_fields_and_a_file_come_back_as_sent():
    payload = bytes(range(256)) * 4000  # binary, past Starlette's 1 MiB spooling threshold
    content_type, body = encoded(
        {"target_lang": "EN-US", "source_lang": "FR", "filename": "état.docx"},
        {"file": ("rapport été.docx", payload, "application/octet-stream")},
    )
    form = parse_multipart(content_type, body)
    assert form.fields == {"target_lang": "EN-US", "source_lang": "FR", "filename": "état.docx"}
    (file,) = form.files
    assert (file.field_name, file.filename, file.data) == ("file", "rapport été.docx", payload)


@pytest.mark.parametrize(
    ("content_type", "body", "says"),
    [
        ("application/json", b"{}", "multipart/form-data"),
        ("multipart/form-data", b"--x\r\n", "no boundary"),
        ("multipart/form-data; boundary=x", b"garbage without parts", "cannot be read"),
    ],
)
def test_what_is_not_a_form_is_refused_clearly(content_type: str, body: bytes, says: str):
    with pytest.raises(MultipartError, match=says):
        parse_multipart(content_type, body)


def test_a_form_with_too_many_fields_is_refused():
    fields = {f"f{n}": "x" for n in range(MAX_FIELDS)}
    content_type, body = encoded(fields, {"file": ("a.txt", b"x")})
    with pytest.raises(MultipartError, match="more than"):
        parse_multipart(content_type, body)


def test_a_body_cut_short_is_refused_not_read_as_a_form_without_its_file():
    content_type, body = encoded({"target_lang": "DE"}, {"file": ("a.txt", b"Un chat." * 100)})
    for cut in (len(body) - 10, len(body) // 2):
        with pytest.raises(MultipartError, match="cut short"):
            parse_multipart(content_type, body[:cut])
