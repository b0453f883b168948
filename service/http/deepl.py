"""The DeepL API v2 dialect: `POST /v2/translate`, `GET|POST /v2/languages`, `GET|POST
/v2/usage`, so that DeepL clients (the official `deepl` library, Weblate, Mastodon) work
unchanged against this server.

As DeepL: JSON or form bodies (`text` repeated in a form, a list in JSON); upper-case language
codes, `EN-GB`/`EN-US` as English targets; `{"translations": [{"detected_source_language",
"text"}]}`; errors as `{"message": ...}` with DeepL's statuses (400, 403, 413, 429 with
Retry-After, 456 when the character quota is used up, 503); `Authorization: DeepL-Auth-Key KEY`
checked against NMT_API_KEYS when keys are configured. `tag_handling` `html` or `xml` (with
`ignore_tags`, `splitting_tags`, `non_splitting_tags`, `outline_detection`) translates the
text of the markup and carries its tags to the aligned words (service/documents/markup/); XML it
cannot read is DeepL's 400 "Tag handling parsing failed". What the models cannot honour is
refused with DeepL's own wording (`formality` `more`/`less`, glossaries), or accepted and
ignored where DeepL too treats it as a hint (`formality` `prefer_*`, `context`).
docs/compatibility.md lists every field.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.documents import markup
from service.http.dependencies import ApiKeysDep, ServiceDep, client_disconnected, header_key
from service.http.dialect import BodyWording, Dialect, DialectError, read_body
from service.http.libretranslate import LANGUAGE_NAMES
from service.http.middleware import admitted_at
from service.runtime.search import SearchOptions
from service.serving.errors import (
    InternalError,
    InvalidApiKey,
    MissingApiKey,
    QuotaExceeded,
    ServiceError,
    UnknownPair,
)
from service.serving.pipeline import TranslationService
from service.serving.sentences import SplitMode
from service.serving.settings import Settings

PATHS = frozenset({"/v2/translate", "/v2/languages", "/v2/usage"})
QUOTA_EXCEEDED = 456  # DeepL's own status for "quota exceeded"
# DeepL's English targets; a bare "EN" is accepted too (DeepL deprecates it).
REGIONAL_TARGETS = {"en": ("EN-GB", "EN-US"), "pt": ("PT-BR", "PT-PT")}
REGION_NAMES = {
    "EN-GB": "English (British)",
    "EN-US": "English (American)",
    "PT-BR": "Portuguese (Brazilian)",
    "PT-PT": "Portuguese (European)",
}
SPLIT_MODES: dict[str, SplitMode] = {"1": "sentences", "0": "none", "nonewlines": "no_newlines"}
FORMALITIES = {"default", "prefer_more", "prefer_less", "more", "less"}
TAG_LISTS = ("ignore_tags", "splitting_tags", "non_splitting_tags")
BOOLEANS = {"1": True, "true": True, "0": False, "false": False}


class DeepLError(DialectError):
    key = "message"


def build_router(settings: Settings) -> APIRouter:
    router = APIRouter(tags=["DeepL v2 compatible"])

    @router.post(
        "/v2/translate",
        summary="DeepL-compatible translation (text, target_lang)",
        response_model=None,
        openapi_extra={"requestBody": _REQUEST_BODY},
        responses={status: _error_doc(why) for status, why in DEEPL_ERRORS.items()},
    )
    async def translate(request: Request, service: ServiceDep, keys: ApiKeysDep) -> JSONResponse:
        return await DEEPL.answer(
            request, keys, lambda fields: _translate(service, request, fields)
        )

    # DeepL answers both GET and POST here. One route per method, so that each has an
    # operationId of its own in /openapi.json (client generators reject duplicates).
    languages, usage = _languages_route(), _usage_route(settings)
    for method in ("GET", "POST"):
        router.add_api_route(
            "/v2/languages",
            languages,
            methods=[method],
            operation_id=f"deepl_languages_{method.lower()}",
            summary="DeepL-compatible list of languages (type=source|target)",
            response_model=None,
            responses={403: _error_doc(DEEPL_ERRORS[403])},
        )
        router.add_api_route(
            "/v2/usage",
            usage,
            methods=[method],
            operation_id=f"deepl_usage_{method.lower()}",
            summary="DeepL-compatible usage: characters translated and the limit",
            response_model=None,
            responses={403: _error_doc(DEEPL_ERRORS[403])},
        )
    return router


def _languages_route():
    async def languages(request: Request, service: ServiceDep, keys: ApiKeysDep) -> JSONResponse:
        async def answer(fields: dict[str, Any]) -> JSONResponse:
            kind = str(fields.get("type") or "source").lower()
            if kind not in ("source", "target"):
                raise DeepLError(400, "Value for 'type' not supported.")
            return JSONResponse(_language_list(service, kind))

        return await DEEPL.answer(request, keys, answer)

    return languages


def _usage_route(settings: Settings):
    async def usage(request: Request, service: ServiceDep, keys: ApiKeysDep) -> JSONResponse:
        async def answer(fields: dict[str, Any]) -> JSONResponse:
            # No limit configured: a limit no one reaches, as DeepL reports for unlimited plans.
            limit = settings.character_limit or 10**12
            return JSONResponse(
                {"character_count": service.characters_translated, "character_limit": limit}
            )

        return await DEEPL.answer(request, keys, answer)

    return usage


DEEPL_BODY = BodyWording(
    invalid_json="Invalid JSON in the request body.",
    not_an_object="The request body must be a JSON object.",
    unreadable_form="Invalid form data in the request body: {detail}",
)


async def _read_fields(request: Request) -> dict[str, Any]:
    """JSON, urlencoded or multipart form (a repeated `text` becomes a list) over the query
    string (DeepL's GET endpoints take their parameters there, and the official client sends
    `type` in a GET body)."""
    fields: dict[str, Any] = dict(request.query_params)
    body = await read_body(request, DeepLError, DEEPL_BODY, empty_json="{}")
    if isinstance(body, dict):
        fields.update(body)
    elif body is not None:
        for name in set(body.keys()):
            values = [v for v in body.getlist(name) if isinstance(v, str)]
            if values:
                fields[name] = values if name in ("text", *TAG_LISTS) else values[-1]
    return fields


def _presented_key(request: Request, fields: dict[str, Any]) -> str | None:
    """A header's key, else DeepL's deprecated `auth_key` form field."""
    auth_key = fields.get("auth_key")
    return header_key(request) or (auth_key if isinstance(auth_key, str) else None)


async def _translate(
    service: TranslationService, request: Request, fields: dict[str, Any]
) -> JSONResponse:
    texts = fields.get("text")
    if isinstance(texts, str):
        texts = [texts]
    if not texts:
        raise DeepLError(400, "Parameter 'text' not specified.")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise DeepLError(400, "Parameter 'text' must be a string or a list of strings.")
    settings = service.settings
    if len(texts) > settings.max_texts_per_request:
        raise DeepLError(
            413,
            f"Too many texts: {len(texts)}; at most {settings.max_texts_per_request} per request "
            "(NMT_MAX_TEXTS_PER_REQUEST).",
        )
    for text in texts:
        if len(text) > settings.max_chars_per_text:
            raise DeepLError(
                413,
                f"A text has {len(text)} characters; at most {settings.max_chars_per_text} "
                "(NMT_MAX_CHARS_PER_TEXT).",
            )
    target = _target_language(fields.get("target_lang"))
    _refuse_what_cannot_be_honoured(fields)
    tags = _tag_handling(fields)
    split = tags.split if tags is not None else _split_mode(fields, "1")
    limit = settings.max_sentences_per_request
    documents = await _read_markup(texts, tags, limit) if tags is not None else None
    plain = [d.plain_text for d in documents] if documents is not None else texts
    source = await _source_language(service, fields.get("source_lang"), plain, target)
    model = service.model_for(source, target, admitted_at(request))
    request.state.model = model.name
    options = SearchOptions(
        beam_size=settings.default_beam_size,
        length_penalty=settings.default_length_penalty,
        max_length=settings.max_output_length,
        max_repeats=settings.max_repeats,
    )

    def gone() -> Awaitable[None]:
        return client_disconnected(request)

    if documents is not None:
        result = await markup.translate(service, model, documents, options, gone)
        translated, counts = result.texts, result
    else:
        answer = await service.translate(model, texts, options, gone, split=split)
        translated, counts = [item.text for item in answer.texts], answer
    request.state.sentences = counts.sentences
    request.state.input_tokens = counts.input_tokens
    request.state.output_tokens = counts.output_tokens
    detected = source.upper()
    return JSONResponse(
        {
            "translations": [
                # DeepL bills the source characters; its clients read the count.
                {"detected_source_language": detected, "text": text, "billed_characters": n}
                for text, n in zip(translated, map(len, texts), strict=True)
            ]
        }
    )


def _split_mode(fields: dict[str, Any], default: str) -> SplitMode:
    split = SPLIT_MODES.get(str(fields.get("split_sentences", default)).lower())
    if split is None:
        raise DeepLError(400, "Value for 'split_sentences' not supported.")
    return split


def _tag_handling(fields: dict[str, Any]) -> markup.MarkupOptions | None:
    """DeepL's markup fields; None for plain text (the tag lists then mean nothing, as in
    DeepL). HTML splits on punctuation only by default, as DeepL does."""
    value = fields.get("tag_handling")
    if not value:
        return None
    if not isinstance(value, str) or value.lower() not in ("html", "xml"):
        raise DeepLError(400, "Value for 'tag_handling' not supported.")
    kind: markup.MarkupKind = "html" if value.lower() == "html" else "xml"
    if str(fields.get("tag_handling_version") or "v1").lower() not in ("v1", "v2"):
        raise DeepLError(400, "Value for 'tag_handling_version' not supported.")
    outline = fields.get("outline_detection", True)
    if not isinstance(outline, bool):
        outline = BOOLEANS.get(str(outline).strip().lower())
        if outline is None:
            raise DeepLError(400, "Value for 'outline_detection' not supported.")
    return markup.MarkupOptions(
        kind=kind,
        split=_split_mode(fields, "nonewlines" if kind == "html" else "1"),
        ignore_tags=_tag_list(fields, "ignore_tags"),
        splitting_tags=_tag_list(fields, "splitting_tags"),
        non_splitting_tags=_tag_list(fields, "non_splitting_tags"),
        outline_detection=outline,
    )


def _tag_list(fields: dict[str, Any], name: str) -> frozenset[str]:
    """A list of tag names: comma-separated, repeated in a form, or a JSON list."""
    value = fields.get(name) or []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise DeepLError(400, f"Value for '{name}' not supported.")
    return frozenset(tag.strip() for v in values for tag in v.split(",") if tag.strip())


async def _read_markup(
    texts: list[str], options: markup.MarkupOptions, max_sentences: int
) -> list[markup.Document]:
    """Parsed off the event loop when long (seconds of CPU for 64 texts of markup), and no
    further than the sentence limit (413) where a request passes it."""
    try:
        return await markup.read_off_loop(texts, options, max_sentences)
    except markup.MarkupError as error:
        message = f"Tag handling parsing failed, please check input. ({error})"
        raise DeepLError(400, message) from None


def _target_language(value: Any) -> str:
    if not value:
        raise DeepLError(400, "Parameter 'target_lang' not specified.")
    if not isinstance(value, str):
        raise DeepLError(400, "Value for 'target_lang' not supported.")
    return value.strip().split("-")[0].lower()  # EN-GB, EN-US -> en


async def _source_language(
    service: TranslationService, value: Any, texts: list[str], target: str
) -> str:
    """source_lang as given, or detected on the texts as DeepL does when it is absent."""
    if value:
        if not isinstance(value, str):
            raise DeepLError(400, "Value for 'source_lang' not supported.")
        return value.strip().lower()
    return (await service.detect_source(texts, target)).language


def _refuse_what_cannot_be_honoured(fields: dict[str, Any]) -> None:
    formality = str(fields.get("formality") or "default").lower()
    if formality not in FORMALITIES:
        raise DeepLError(400, "Value for 'formality' not supported.")
    if formality in ("more", "less"):  # a demand, not a hint: the models have no formality
        raise DeepLError(400, "'formality' is not supported for the given target language.")
    if fields.get("glossary_id"):
        raise DeepLError(400, "Glossaries are not supported by this server.")


def _language_list(service: TranslationService, kind: str) -> list[dict[str, Any]]:
    models = service.registry.models
    if kind == "source":
        codes = sorted({m.bundle.source_lang for m in models})
        return [{"language": c.upper(), "name": LANGUAGE_NAMES.get(c, c)} for c in codes]
    listed = []
    for code in sorted({m.bundle.target_lang for m in models}):
        for variant in REGIONAL_TARGETS.get(code, (code.upper(),)):
            name = REGION_NAMES.get(variant, LANGUAGE_NAMES.get(code, code))
            listed.append({"language": variant, "name": name, "supports_formality": False})
    return listed


def _as_deepl_error(error: ServiceError, request: Request) -> DeepLError:
    """DeepL's status for a service error: it says 403 for any key problem and 456 for the
    quota; anything else wrong with the request is a 400."""
    message = str(error)
    if isinstance(error, MissingApiKey | InvalidApiKey):
        return DeepLError(403, "Authorization failure, check auth_key.")
    if isinstance(error, QuotaExceeded):
        return DeepLError(QUOTA_EXCEEDED, f"Quota Exceeded: {error}")
    if isinstance(error, UnknownPair):
        supported = ", ".join(p.upper() for p in error.supported) or "none"
        message = f"Value for 'target_lang' or 'source_lang' not supported (pairs: {supported})."
    if isinstance(error, InternalError):
        message = f"{error} (request id {request.state.request_id})"
    status = 400 if error.status in (401, 404, 422) else error.status
    return DeepLError(status, message, error.headers() or None)


DEEPL_ERRORS = {
    400: "a missing or unsupported parameter or language, invalid JSON",
    403: "authorization failure (NMT_API_KEYS is set, and the key is missing or wrong)",
    413: "too many texts, a text too long, or a body larger than NMT_MAX_BODY_BYTES",
    429: "too many requests: the queue is full (Retry-After)",
    456: "quota exceeded (NMT_CHARACTER_LIMIT)",
    500: "a server fault; the message names the request id",
    503: "models loading, or the server is shutting down",
    504: "not translated within NMT_REQUEST_TIMEOUT_SECONDS",
}


def _error_doc(description: str) -> dict:
    schema = {"type": "object", "properties": {"message": {"type": "string"}}}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_REQUEST_BODY = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["text", "target_lang"],
                "properties": {
                    "text": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "target_lang": {"type": "string", "example": "EN-GB"},
                    "source_lang": {"type": "string", "example": "FR"},
                    "split_sentences": {"type": "string", "enum": ["0", "1", "nonewlines"]},
                    "preserve_formatting": {"type": "boolean"},
                    "formality": {"type": "string", "enum": sorted(FORMALITIES)},
                    "context": {"type": "string"},
                    "tag_handling": {"type": "string", "enum": ["html", "xml"]},
                    "outline_detection": {"type": "boolean"},
                    **{name: {"type": "array", "items": {"type": "string"}} for name in TAG_LISTS},
                },
            }
        },
        "application/x-www-form-urlencoded": {"schema": {"type": "object"}},
    }
}


DEEPL = Dialect(DeepLError, _read_fields, _presented_key, _as_deepl_error)
