"""Whole files: DeepL's document API (`POST /v2/document`, `/v2/document/{id}`,
`/v2/document/{id}/result`) and LibreTranslate's (`POST /translate_file`,
`GET /download_file/{name}`), on the document jobs of service/documents/jobs.py.

DeepL's is asynchronous: the upload answers `{document_id, document_key}` at once, the client
polls the status (queued, translating with seconds_remaining, done with billed_characters,
error with error_message), then downloads the result once (a second download, or a wrong key,
is 404; a result not ready yet, 503). The official `deepl` client's
`translate_document_from_filepath` does exactly that. LibreTranslate's is synchronous: the
upload answers when the file is translated, with the URL of the result, which may be
downloaded until the job expires (NMT_DOCUMENT_RESULT_TTL_SECONDS); the URL holds the job's
key, as LibreTranslate's holds a random name.

A file is read and checked when it is uploaded (its format from its content, macro-enabled
files, zip bombs, entities, limits): a file that cannot be translated is a 4xx at once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from service.documents.formats import formats
from service.documents.jobs import DocumentJobs, DocumentRequest
from service.http import deepl, libretranslate
from service.http.dependencies import ApiKeysDep, ServiceDep, StoreDep
from service.http.dialect import Decoding, Dialect, documented_body, search_options
from service.http.glossary_lookup import owner_of, terminology_of
from service.http.multipart import MultipartError, parse_multipart
from service.serving.requests import TranslationService, off_loop
from service.serving.settings import Settings
from service.store import DocumentNotFound, DocumentNotReady

DEEPL_UPLOAD = "/v2/document"
DEEPL_PREFIX = "/v2/document/"
LIBRE_UPLOAD = "/translate_file"
LIBRE_PREFIX = "/download_file/"
# The paths whose bodies may be a document (NMT_MAX_DOCUMENT_BYTES on top of a body).
UPLOADS = (DEEPL_UPLOAD, LIBRE_UPLOAD)


def document_jobs(request: Request) -> DocumentJobs:
    return request.app.state.documents


JobsDep = Annotated[DocumentJobs, Depends(document_jobs)]


async def _read_upload_fields(request: Request) -> dict[str, Any]:
    """The multipart form, in memory (service/http/multipart.py): its fields, and its file as
    `file` (a tuple: name, bytes)."""
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    try:  # a document's body is megabytes: parsed on a worker thread, not the event loop
        form = await off_loop(len(body), parse_multipart, content_type, body)
    except MultipartError as error:
        raise _error_class(request)(400, str(error)) from None
    fields: dict[str, Any] = dict(request.query_params)
    fields.update(form.fields)
    files = [file for file in form.files if file.field_name == "file"]
    if len(files) > 1:  # which one to translate? (a client that meant several sends several)
        raise _error_class(request)(
            400, f"The upload holds {len(files)} files; send one file per upload."
        )
    if files:
        fields["file"] = (files[0].filename, files[0].data)
    return fields


def _error_class(request: Request) -> type:
    return deepl.DeepLError if request.url.path.startswith("/v2/") else libretranslate.LibreError


DEEPL_DOCUMENTS = replace(
    deepl.DEEPL,
    paths=frozenset({DEEPL_UPLOAD}),
    prefixes=frozenset({DEEPL_PREFIX}),
    statuses={**deepl.DEEPL.statuses, 415: 400},
    read_fields=_read_upload_fields,
)
# The status and result polls send JSON or a form (`document_key`), read as /v2/translate's.
DEEPL_POLLS = replace(deepl.DEEPL, paths=frozenset(), prefixes=frozenset({DEEPL_PREFIX}))
LIBRE_FILES = replace(
    libretranslate.LIBRE,
    paths=frozenset({LIBRE_UPLOAD}),
    prefixes=frozenset({LIBRE_PREFIX}),
    statuses={**libretranslate.LIBRE.statuses, 415: 400},
    read_fields=_read_upload_fields,
)
DIALECTS: tuple[Dialect, ...] = (DEEPL_DOCUMENTS, LIBRE_FILES)


# For /openapi.json: the fields each call reads (by hand, from the body).
_FILE = {"type": "string", "format": "binary", "description": "the document (its name: its format)"}
_MULTIPART = ("multipart/form-data",)
_DEEPL_UPLOAD = documented_body(
    required=["file", "target_lang"],
    properties={
        "file": _FILE,
        **deepl.LANGUAGE_FIELDS,
        "filename": {
            "type": "string",
            "description": "the document's name, if the file part has none",
        },
        "output_format": {
            "type": "string",
            "description": "another format's extension to answer in",
        },
    },
    content_types=_MULTIPART,
)
_LIBRE_UPLOAD = documented_body(
    required=["file", "source", "target"],
    properties={
        "file": _FILE,
        **libretranslate.PAIR_FIELDS,
    },
    content_types=_MULTIPART,
)
_DOCUMENT_KEY = documented_body(
    required=["document_key"],
    properties={
        "document_key": {"type": "string", "minLength": 1, "description": "the upload's answer's"}
    },
)


def build_router(settings: Settings) -> APIRouter:
    router = APIRouter(tags=["Documents (DeepL and LibreTranslate compatible)"])

    @router.post(
        DEEPL_UPLOAD,
        summary="DeepL-compatible document upload (multipart: file, target_lang)",
        openapi_extra=_DEEPL_UPLOAD,
        response_model=None,
        responses={s: deepl.DeepLError.doc(why) for s, why in DOCUMENT_ERRORS.items()},
    )
    async def deepl_upload(
        request: Request, service: ServiceDep, keys: ApiKeysDep, store: StoreDep, jobs: JobsDep
    ) -> Response:
        async def work(fields: dict[str, Any]) -> Response:
            owner = owner_of(keys, deepl.presented_key(request, fields))
            data, filename = _file_of(fields, deepl.DeepLError)
            target = deepl.target_language(fields.get("target_lang"))
            deepl.refuse_what_cannot_be_honoured(fields)
            source = fields.get("source_lang")
            source = source.strip().lower() if isinstance(source, str) and source else None
            glossary_id = fields.get("glossary_id") or None
            if glossary_id:
                if not source:
                    raise deepl.DeepLError(
                        400, "Use of a glossary requires the source_lang parameter to be specified."
                    )
                await terminology_of(
                    store.glossaries, owner, glossary_id, source, target, deepl.DeepLError
                )
            submitted = await jobs.submit(
                data,
                _document_request(
                    service,
                    fields.get("filename") or filename,
                    source,
                    target,
                    glossary_id,
                    fields.get("output_format") or None,
                    owner,
                ),
            )
            return JSONResponse(
                {"document_id": submitted.document_id, "document_key": submitted.document_key}
            )

        return await DEEPL_DOCUMENTS.answer(request, keys, work)

    @router.post(
        DEEPL_PREFIX + "{document_id}",
        summary="DeepL-compatible document status (document_key)",
        openapi_extra=_DOCUMENT_KEY,
        response_model=None,
        responses={s: deepl.DeepLError.doc(why) for s, why in POLL_ERRORS.items()},
    )
    async def deepl_status(
        document_id: str, request: Request, keys: ApiKeysDep, jobs: JobsDep
    ) -> Response:
        async def work(fields: dict[str, Any]) -> Response:
            key = _document_key(fields)
            try:
                found = await jobs.status(document_id, key)
            except DocumentNotFound:
                raise deepl.DeepLError(404, "Document not found.") from None
            body: dict[str, Any] = {"document_id": found.document_id, "status": found.status}
            if found.status == "translating":
                body["seconds_remaining"] = found.seconds_remaining
            # Not DeepL's: the share of segments translated, for a progress bar (the web
            # page's); DeepL's clients ignore fields they do not know.
            body["progress"] = round(found.segments_done / max(found.segments, 1), 4)
            if found.status in ("done", "downloaded"):
                body["billed_characters"] = found.characters
            if found.status == "error":
                body["error_message"] = found.error_message
            return JSONResponse(body)

        return await DEEPL_POLLS.answer(request, keys, work)

    @router.post(
        DEEPL_PREFIX + "{document_id}/result",
        summary="DeepL-compatible download of a translated document (once)",
        openapi_extra=_DOCUMENT_KEY,
        response_model=None,
        responses={s: deepl.DeepLError.doc(why) for s, why in POLL_ERRORS.items()},
    )
    async def deepl_result(
        document_id: str, request: Request, keys: ApiKeysDep, jobs: JobsDep
    ) -> Response:
        async def work(fields: dict[str, Any]) -> Response:
            key = _document_key(fields)
            try:
                filename, data = await jobs.result(document_id, key, once=True)
            except DocumentNotFound:
                raise deepl.DeepLError(404, "Document not found.") from None
            except DocumentNotReady as not_ready:
                raise deepl.DeepLError(
                    503, f"Document not ready: it is {not_ready.status}.", {"Retry-After": "1"}
                ) from None
            return _file_response(filename, data)

        return await DEEPL_POLLS.answer(request, keys, work)

    @router.post(
        LIBRE_UPLOAD,
        summary="LibreTranslate-compatible file translation (multipart: file, source, target)",
        openapi_extra=_LIBRE_UPLOAD,
        response_model=None,
        responses={s: libretranslate.LibreError.doc(why) for s, why in LIBRE_ERRORS.items()},
    )
    async def libre_upload(
        request: Request, service: ServiceDep, keys: ApiKeysDep, jobs: JobsDep
    ) -> Response:
        async def work(fields: dict[str, Any]) -> Response:
            owner = owner_of(keys, libretranslate.presented_key(request, fields))
            data, filename = _file_of(fields, libretranslate.LibreError)
            target = str(fields.get("target") or "").strip().lower()
            if not target:
                raise libretranslate.LibreError(400, "Invalid request: missing target parameter")
            source = str(fields.get("source") or "").strip().lower()
            if not source:
                raise libretranslate.LibreError(400, "Invalid request: missing source parameter")
            request_ = _document_request(
                service,
                filename,
                None if source == "auto" else source,
                target,
                None,
                None,
                owner,
            )
            submitted = await jobs.submit(data, request_)
            status = await jobs.wait(
                submitted.document_id, submitted.document_key, settings.request_timeout_seconds
            )
            if status.status == "error":
                raise libretranslate.LibreError(400, status.error_message or "translation failed")
            if status.status not in ("done", "downloaded"):
                raise libretranslate.LibreError(
                    504,
                    f"the file was not translated within {settings.request_timeout_seconds:g} s "
                    "(NMT_REQUEST_TIMEOUT_SECONDS)",
                )
            name = f"{submitted.document_id}.{submitted.document_key}/{quote(status.filename)}"
            url = str(request.base_url).rstrip("/") + LIBRE_PREFIX + name
            return JSONResponse({"translatedFileUrl": url})

        return await LIBRE_FILES.answer(request, keys, work)

    @router.get(
        LIBRE_PREFIX + "{handle}/{filename}",
        summary="LibreTranslate-compatible download of a translated file",
        response_model=None,
        responses={404: libretranslate.LibreError.doc("no such file (or it expired)")},
    )
    async def libre_download(handle: str, filename: str, jobs: JobsDep) -> Response:
        document_id, _, key = handle.partition(".")
        try:
            stored_name, data = await jobs.result(document_id, key, once=False)
        except (DocumentNotFound, DocumentNotReady):
            return libretranslate.LibreError(404, "File not found").response()
        return _file_response(stored_name, data)

    return router


def _document_request(
    service: TranslationService,
    filename: str | None,
    source: str | None,
    target: str,
    glossary_id: str | None,
    output_format: str | None,
    owner: str,
) -> DocumentRequest:
    """The upload's request, with the server's default search options (greedy or beam as
    NMT_DEFAULT_BEAM_SIZE says, as for text)."""
    models = service.registry.models
    if not models:
        service.lifecycle.check_accepting(None)  # loading: 503 (NotReady)
    model = models[0] if source is None else service.model_for(source, target)
    options = search_options(Decoding(), service.settings, model)
    return DocumentRequest(filename, source, target, glossary_id, output_format, owner, options)


def _file_of(fields: dict[str, Any], error: type) -> tuple[bytes, str | None]:
    file = fields.get("file")
    if not isinstance(file, tuple):
        raise error(400, "Parameter 'file' not specified: send the document as a file part.")
    filename, data = file
    return data, filename


def _document_key(fields: dict[str, Any]) -> str:
    key = fields.get("document_key")
    if key is None or key == "":
        raise deepl.DeepLError(400, "Parameter 'document_key' not specified.")
    if not isinstance(key, str):  # a number, a list: the upload's answer holds a string
        raise deepl.DeepLError(400, "Value for 'document_key' not supported: expected a string.")
    return key


def _file_response(filename: str, data: bytes) -> Response:
    media_type = next(
        (
            f.media_type
            for f in formats()
            if any(filename.lower().endswith(e) for e in f.extensions)
        ),
        "application/octet-stream",
    )
    ascii_name = filename.encode("ascii", "replace").decode().replace("?", "_")
    disposition = f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename)}"
    return Response(data, media_type=media_type, headers={"Content-Disposition": disposition})


DOCUMENT_ERRORS = {
    400: "no file, an unsupported language, a file that cannot be translated (format, "
    "macro-enabled, entities, damaged)",
    403: "authorization failure",
    404: "no glossary of this glossary_id for this key",
    413: "a file past NMT_MAX_DOCUMENT_BYTES, NMT_MAX_DOCUMENT_CHARACTERS or a zip bomb",
    456: "quota exceeded (NMT_CHARACTER_LIMIT)",
    503: "models loading, or the server is shutting down",
}
POLL_ERRORS = {
    400: "no document_key",
    403: "authorization failure",
    404: "no such document, a wrong key, or a result already downloaded",
    503: "the result is not ready (download)",
}
LIBRE_ERRORS = {
    400: "a missing field, an unsupported language, a file that cannot be translated",
    403: "an API key that is not valid",
    413: "a file past the limits",
    504: "not translated within NMT_REQUEST_TIMEOUT_SECONDS",
}
