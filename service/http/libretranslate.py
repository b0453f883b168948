"""A LibreTranslate-compatible `POST /translate` and `GET /languages`, so that existing
LibreTranslate clients work unchanged against this server.

It answers as LibreTranslate does: JSON or form bodies; `q` a string or a list of strings;
`{"translatedText": str | [str]}` (plus `alternatives` when asked); errors as
`{"error": "..."}` with LibreTranslate's status codes and wording (400 for anything wrong with
the request, 429 "Slowdown: ...") and, beyond what LibreTranslate has, 503 and 504 as in the
native API. `format` "html" translates the text of the markup and carries its tags to the
aligned words (service/documents/markup/); `alternatives` are then empty lists, as LibreTranslate
answers for HTML.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.documents import markup
from service.documents.formats import supported_extensions
from service.http.dependencies import ApiKeysDep, ServiceDep, header_key
from service.http.dialect import (
    BodyWording,
    Decoding,
    Dialect,
    DialectError,
    confidence_body,
    confidence_flag,
    documented_body,
    read_body,
    read_markup,
    search_options,
    translate_texts,
    with_request_id,
)
from service.http.limits import Limit, check_texts
from service.http.middleware import admitted_at
from service.serving.errors import (
    InvalidApiKey,
    InvalidInput,
    MissingApiKey,
    ServiceError,
    TextTooLong,
    TooManyTexts,
    UnknownPair,
)
from service.serving.pivot import PIVOT_LANGUAGE, pivot_pairs
from service.serving.requests import TranslationService
from service.serving.settings import Settings

LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "zh": "Chinese",
}  # fmt: skip


class LibreError(DialectError):
    key = "error"


# LibreTranslate's statuses, each with an {"error": "..."} body.
LIBRE_ERRORS = {
    400: "invalid request: a missing or malformed field, an unsupported language, a limit, "
    "invalid JSON or a body that is not UTF-8, a missing API key",
    403: "an API key that is not valid",
    408: "the body did not arrive within NMT_BODY_TIMEOUT_SECONDS",
    413: "a body larger than NMT_MAX_BODY_BYTES",
    429: "Slowdown: the queue is full or too many requests are in flight (Retry-After)",
    500: "a server fault; the message names the request id",
    503: "models loading, or the server is shutting down",
    504: "not translated within NMT_REQUEST_TIMEOUT_SECONDS",
}


# `q`: a text, or a list of texts (a form repeats it).
_Q = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
    ],
    "example": "Un homme fait du vélo.",
}
# The language pair and key, as every LibreTranslate call that translates reads them.
PAIR_FIELDS = {
    "source": {"type": "string", "example": "fr"},
    "target": {"type": "string", "example": "en"},
    "api_key": {"type": "string"},
}


def build_router(settings: Settings) -> APIRouter:
    router = APIRouter(tags=["LibreTranslate compatible"])

    @router.post(
        "/translate",
        summary="LibreTranslate-compatible translation (q, source, target)",
        openapi_extra=documented_body(
            required=["q", "source", "target"],
            properties={
                "q": _Q,
                **PAIR_FIELDS,
                "format": {"type": "string", "enum": ["text", "html"]},
                "alternatives": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": settings.max_beam_size - 1,
                },
                "return_confidence": {
                    "type": "boolean",
                    "description": "not LibreTranslate's: each translation's confidence "
                    "(docs/confidence.md)",
                },
            },
        ),
        response_model=None,
        responses={
            200: {
                "description": "translatedText: a string, or a list for a list q (plus "
                "alternatives and detectedLanguage when they apply)",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            **{status: LibreError.doc(why) for status, why in LIBRE_ERRORS.items()},
        },
    )
    async def translate(request: Request, service: ServiceDep, keys: ApiKeysDep) -> JSONResponse:
        return await LIBRE.answer(
            request, keys, lambda fields: _translate(service, settings, request, fields)
        )

    @router.post(
        "/detect",
        summary="LibreTranslate-compatible language detection (q)",
        openapi_extra=documented_body(
            required=["q"], properties={"q": _Q, "api_key": {"type": "string"}}
        ),
        response_model=None,
        responses={status: LibreError.doc(LIBRE_ERRORS[status]) for status in (400, 403, 429)},
    )
    async def detect(request: Request, service: ServiceDep, keys: ApiKeysDep) -> JSONResponse:
        async def respond(fields: dict[str, Any]) -> JSONResponse:
            q = fields.get("q")
            if not q:
                raise LibreError(400, "Invalid request: missing q parameter")
            texts = q if isinstance(q, list) else [q]
            if not all(isinstance(text, str) for text in texts):
                raise LibreError(400, "Invalid request: q must be a string or a list of strings")
            check_texts(q, settings)
            found = []
            for index, text in enumerate(texts):
                detections = await service.detect(text, index)
                found.append(
                    [{"confidence": d.confidence, "language": d.language} for d in detections]
                )
            return JSONResponse(found if isinstance(q, list) else found[0])

        return await LIBRE.answer(request, keys, respond)

    @router.get("/frontend/settings", summary="LibreTranslate-compatible front-end settings")
    async def frontend_settings(service: ServiceDep) -> JSONResponse:
        pairs = [pair for m in service.registry.models for pair in m.pairs()]
        sources = sorted({a for a, _ in pairs})
        targets = sorted({b for _, b in pairs})

        def language(codes: list[str]) -> dict[str, str]:
            code = codes[0] if codes else ""
            return {"code": code, "name": LANGUAGE_NAMES.get(code, code)}

        return JSONResponse(
            {
                "charLimit": settings.max_chars_per_text,
                "frontendTimeout": int(settings.request_timeout_seconds * 1000),
                "apiKeys": bool(settings.api_key_list),
                "keyRequired": bool(settings.api_key_list),
                "suggestions": False,
                "filesTranslation": True,
                "supportedFilesFormat": supported_extensions(),
                "language": {"source": language(sources), "target": language(targets)},
            }
        )

    @router.get("/languages", summary="LibreTranslate-compatible list of languages")
    async def languages(
        service: ServiceDep,
    ) -> list[dict[str, Any]]:
        targets: dict[str, list[str]] = {}
        through: dict[str, dict[str, str]] = {}
        models = service.registry.models
        for source, target in [pair for m in models for pair in m.pairs()]:
            targets.setdefault(source, []).append(target)
        for source, target in pivot_pairs(models):  # listed too, and said so (our extension)
            targets.setdefault(source, []).append(target)
            through.setdefault(source, {})[target] = PIVOT_LANGUAGE
        answer = []
        for code, found in sorted(targets.items()):
            entry: dict[str, Any] = {
                "code": code,
                "name": LANGUAGE_NAMES.get(code, code),
                "targets": sorted(found),
            }
            if code in through:  # {target: the language it goes through}
                entry["pivot"] = dict(sorted(through[code].items()))
            answer.append(entry)
        return answer

    return router


LIBRE_BODY = BodyWording(
    invalid_json="Invalid JSON format",
    not_an_object="Invalid JSON format",
    unreadable_form="Invalid request: unreadable form body: {detail}",
    unreadable_markup="Invalid request: {detail}",
)


async def _read_fields(request: Request) -> dict[str, Any]:
    """A JSON body as it is; a urlencoded or multipart form over the query parameters."""
    body = await read_body(request, LibreError, LIBRE_BODY, empty_json="null")
    if isinstance(body, dict):
        return body
    fields: dict[str, Any] = dict(request.query_params)
    if body is not None:
        fields.update({k: v for k, v in body.items() if isinstance(v, str)})
        # Form bodies get LF line endings, as LibreTranslate does for its character limit;
        # `q` repeated is a list of texts, as a JSON list is (not the last one alone).
        texts = ["\n".join(q.splitlines()) for q in body.getlist("q") if isinstance(q, str)]
        if texts:
            fields["q"] = texts if len(texts) > 1 else texts[0]
    return fields


def presented_key(request: Request, fields: dict[str, Any]) -> str | None:
    """LibreTranslate's `api_key` field, else a header's key."""
    api_key = fields.get("api_key")
    if api_key is not None and not isinstance(api_key, str):
        raise LibreError(400, "Invalid request: api_key must be a string")
    return api_key or header_key(request)


async def _translate(
    service: TranslationService, settings: Settings, request: Request, fields: dict[str, Any]
) -> JSONResponse:
    q, source, target = fields.get("q"), fields.get("source"), fields.get("target")
    for name, value in (("q", q), ("source", source), ("target", target)):
        if not value:
            raise LibreError(400, f"Invalid request: missing {name} parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(text, str) for text in texts):
        raise LibreError(400, "Invalid request: q must be a string or a list of strings")
    for name, value in (("source", source), ("target", target)):
        if not isinstance(value, str):
            raise LibreError(400, f"Invalid request: {name} must be a string")
    check_texts(q, settings)
    text_format = fields.get("format") or "text"
    if text_format not in ("text", "html"):
        raise LibreError(400, f"{text_format} format is not supported")
    alternatives = _alternatives(fields.get("alternatives"), settings.max_beam_size - 1)
    with_confidence = confidence_flag(fields.get("return_confidence"), LibreError)
    if with_confidence and text_format == "html":
        raise LibreError(400, "Invalid request: return_confidence is not available for html")
    # HTML: parsed first, so that detection reads the text, not the tags.
    documents = None
    if text_format == "html":
        html = markup.MarkupOptions(kind="html")
        documents = await read_markup(texts, html, settings, LibreError, LIBRE_BODY)

    detected = None
    if source == "auto":
        plain = [d.plain_text for d in documents] if documents is not None else texts
        found = await service.detect_source(plain, target)
        source = found.language
        detected = {"confidence": found.confidence, "language": found.language}
    model = service.model_for(source, target, admitted_at(request))
    request.state.model = model.labels
    options = search_options(
        Decoding(n_best=alternatives + 1, confidence=with_confidence), settings, model
    )
    # No alternatives for HTML: LibreTranslate gives none either.
    found = await translate_texts(service, request, model, texts, options, documents)
    body: dict[str, Any] = {"translatedText": found.texts if batch else found.texts[0]}
    if alternatives:
        body["alternatives"] = found.alternatives if batch else found.alternatives[0]
    if detected:
        body["detectedLanguage"] = [detected] * len(texts) if batch else detected
    if with_confidence:  # our extension (LibreTranslate has none)
        each = [confidence_body(c, found.confidence_label) for c in found.confidence]
        body["confidence"] = each if batch else each[0]
    return JSONResponse(body)


def _alternatives(value: Any, most: int) -> int:
    """A count as LibreTranslate reads it (`int(value)`), from JSON or a form: an integer, a
    string of digits, or a whole float. Infinity, NaN and huge numbers are refused."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise LibreError(400, "Invalid request: alternatives parameter is not a whole number")
    if isinstance(value, str) and len(value.strip()) > 10:  # int() is quadratic in digits
        raise LibreError(400, f"Invalid request: alternatives must be between 0 and {most}")
    try:
        count = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(float("inf"))
        raise LibreError(400, "Invalid request: alternatives parameter is not a number") from None
    if not 0 <= count <= most:
        raise LibreError(
            400, f"Invalid request: alternatives must be between 0 and {most} (NMT_MAX_BEAM_SIZE)"
        )
    return count


def _as_libre_error(error: ServiceError, request: Request, status: int) -> LibreError:
    """LibreTranslate's wording for a service error."""
    message = with_request_id(error, request)
    if isinstance(error, TooManyTexts):
        message = f"Invalid request: request ({error.count}) exceeds text limit ({error.limit})"
    elif isinstance(error, TextTooLong):
        message = (
            f"Invalid request: request ({error.characters}) exceeds text limit ({error.limit})"
        )
    elif isinstance(error, UnknownPair):
        supported = [pair.split("-", 1) for pair in error.supported]
        if error.source_lang not in {source for source, _ in supported}:
            message = f"{error.source_lang} is not supported"
        elif error.target_lang not in {target for _, target in supported}:
            message = f"{error.target_lang} is not supported"
        else:
            message = (
                f"{error.target_lang} is not available as a target language "
                f"from {error.source_lang}"
            )
    elif isinstance(error, InvalidInput):
        message = f"Invalid request: {error.message}"
    elif isinstance(error, MissingApiKey):
        message = "Please contact the server operator to get an API key (send it as api_key)"
    elif isinstance(error, InvalidApiKey):
        message = "Invalid API key"
    elif status == 429:
        message = f"Slowdown: {error}"
    return LibreError(status, message, error.headers() or None)


# LibreTranslate's clients expect 400 for anything wrong with the request (an unknown language,
# a limit, a missing key); a body too large is refused before it is read (413), and other
# statuses (403, 429, 503, ...) are the error's own. (No answer carries alignment weights.)
LIMIT_STATUS = {
    Limit.TEXTS: 400, Limit.CHARACTERS: 400, Limit.SENTENCES: 400, Limit.TOKENS: 400,
    Limit.ALIGNMENT: 400, Limit.BODY: 413, Limit.QUOTA: 429,
}  # fmt: skip
LIBRE = Dialect(
    LibreError,
    paths=frozenset({"/translate", "/detect", "/languages", "/frontend/settings"}),
    limit_status=LIMIT_STATUS,
    statuses={401: 400, 404: 400, 422: 400},
    as_error=_as_libre_error,
    read_fields=_read_fields,
    presented_key=presented_key,
)
