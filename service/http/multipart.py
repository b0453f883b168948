"""A multipart/form-data body read into memory: its fields, and at most one file.

Starlette's own form reader spools a file part past 1 MiB to a temporary file on disk; an
upload here goes to the store and nowhere else, and its size is already bounded by the body
limit (RequestContextMiddleware), so the whole body is read and parsed in memory, with
python-multipart's parser (the one Starlette uses).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.multipart import MultipartParser, parse_options_header

# Fields one upload form may have (DeepL's document form has about ten).
MAX_FIELDS = 64


class MultipartError(ValueError):
    """A body that is not a readable multipart form (the dialect answers it with its 400)."""


@dataclass
class UploadedFile:
    field_name: str
    filename: str | None
    content_type: str | None
    data: bytes


@dataclass
class Form:
    fields: dict[str, str] = field(default_factory=dict)  # the last value of each name
    files: list[UploadedFile] = field(default_factory=list)


def parse_multipart(content_type: str, body: bytes) -> Form:
    kind, params = parse_options_header(content_type)
    if kind != b"multipart/form-data":
        raise MultipartError("the body must be multipart/form-data (a file upload)")
    boundary = params.get(b"boundary")
    if not boundary:
        raise MultipartError("the multipart body has no boundary")
    form = Form()
    headers: dict[bytes, bytes] = {}
    name_buffer: list[bytes] = []
    value_buffer: list[bytes] = []
    data: list[bytes] = []
    parts = 0
    closed = False  # the closing boundary was read: the body is whole

    def on_part_begin() -> None:
        nonlocal parts
        parts += 1
        if parts > MAX_FIELDS:
            raise MultipartError(f"the form has more than {MAX_FIELDS} fields")
        headers.clear()
        data.clear()

    def on_header_field(chunk: bytes, start: int, end: int) -> None:
        name_buffer.append(chunk[start:end])

    def on_header_value(chunk: bytes, start: int, end: int) -> None:
        value_buffer.append(chunk[start:end])

    def on_header_end() -> None:
        headers[b"".join(name_buffer).lower()] = b"".join(value_buffer)
        name_buffer.clear()
        value_buffer.clear()

    def on_part_data(chunk: bytes, start: int, end: int) -> None:
        data.append(chunk[start:end])

    def on_part_end() -> None:
        disposition, options = parse_options_header(headers.get(b"content-disposition", b""))
        if disposition != b"form-data" or b"name" not in options:
            raise MultipartError("a form part has no Content-Disposition name")
        name = options[b"name"].decode("utf-8", "replace")
        content = b"".join(data)
        if b"filename" in options:
            filename = options[b"filename"].decode("utf-8", "replace")
            kind = headers.get(b"content-type")
            form.files.append(
                UploadedFile(name, filename, kind.decode("latin-1") if kind else None, content)
            )
        else:
            try:
                form.fields[name] = content.decode("utf-8")
            except UnicodeDecodeError:
                raise MultipartError(f"the form field {name!r} is not UTF-8") from None

    def on_end() -> None:
        nonlocal closed
        closed = True

    parser = MultipartParser(
        boundary,
        {
            "on_end": on_end,
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except MultipartError:
        raise
    except Exception as error:  # python-multipart's own errors: a malformed body
        raise MultipartError(f"the multipart body cannot be read ({error})") from None
    if not closed:  # python-multipart drops a part left open; its file would go unnoticed
        raise MultipartError(
            "the multipart body ends before its closing boundary: it was cut short"
        )
    return form
