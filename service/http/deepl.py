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

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.documents import markup
from service.http.dependencies import ApiKeysDep, ServiceDep, StoreDep, header_key
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
from service.http.glossary_lookup import owner_of, terminology_of
from service.http.libretranslate import LANGUAGE_NAMES
from service.http.limits import Limit, check_texts
from service.http.middleware import admitted_at
from service.http.usage import billed_characters, character_usage
from service.serving.errors import (
    InvalidApiKey,
    MissingApiKey,
    QuotaExceeded,
    ServiceError,
    TextTooLong,
    TooManyTexts,
    UnknownPair,
)
from service.serving.requests import TranslationService
from service.serving.sentences import SplitMode
from service.serving.settings import Settings
from service.store.glossaries import GlossaryStore

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
        openapi_extra=_REQUEST_BODY,
        responses={status: DeepLError.doc(why) for status, why in DEEPL_ERRORS.items()},
    )
    async def translate(
        request: Request, service: ServiceDep, keys: ApiKeysDep, store: StoreDep
    ) -> JSONResponse:
        async def work(fields: dict[str, Any]) -> JSONResponse:
            owner = owner_of(keys, presented_key(request, fields))
            return await _translate(service, request, fields, store.glossaries, owner)

        return await DEEPL.answer(request, keys, work)

    # DeepL answers both GET and POST here. One route per method, so that each has an
    # operationId of its own in /openapi.json (client generators reject duplicates).
    languages, usage = _languages_route(), _usage_route()
    for method in ("GET", "POST"):
        router.add_api_route(
            "/v2/languages",
            languages,
            methods=[method],
            operation_id=f"deepl_languages_{method.lower()}",
            summary="DeepL-compatible list of languages (type=source|target)",
            response_model=None,
            responses={403: DeepLError.doc(DEEPL_ERRORS[403])},
        )
        router.add_api_route(
            "/v2/usage",
            usage,
            methods=[method],
            operation_id=f"deepl_usage_{method.lower()}",
            summary="DeepL-compatible usage: characters translated and the limit",
            response_model=None,
            responses={403: DeepLError.doc(DEEPL_ERRORS[403])},
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


def _usage_route():
    async def usage(request: Request, service: ServiceDep, keys: ApiKeysDep) -> JSONResponse:
        async def answer(fields: dict[str, Any]) -> JSONResponse:
            count, limit = character_usage(service)
            # No limit configured: a limit no one reaches, as DeepL reports for unlimited plans.
            return JSONResponse({"character_count": count, "character_limit": limit or 10**12})

        return await DEEPL.answer(request, keys, answer)

    return usage


DEEPL_BODY = BodyWording(
    invalid_json="Invalid JSON in the request body.",
    not_an_object="The request body must be a JSON object.",
    unreadable_form="Invalid form data in the request body: {detail}",
    unreadable_markup="Tag handling parsing failed, please check input. ({detail})",
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


def presented_key(request: Request, fields: dict[str, Any]) -> str | None:
    """A header's key, else DeepL's deprecated `auth_key` form field."""
    auth_key = fields.get("auth_key")
    return header_key(request) or (auth_key if isinstance(auth_key, str) else None)


async def _translate(
    service: TranslationService,
    request: Request,
    fields: dict[str, Any],
    glossaries: GlossaryStore,
    owner: str,
) -> JSONResponse:
    texts = fields.get("text")
    if isinstance(texts, str):
        texts = [texts]
    if not texts:
        raise DeepLError(400, "Parameter 'text' not specified.")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise DeepLError(400, "Parameter 'text' must be a string or a list of strings.")
    settings = service.settings
    check_texts(texts, settings)
    target = target_language(fields.get("target_lang"))
    refuse_what_cannot_be_honoured(fields)
    tags = _tag_handling(fields)
    with_confidence = confidence_flag(fields.get("return_confidence"), DeepLError)
    if with_confidence and tags is not None:
        raise DeepLError(400, "return_confidence is not available with tag_handling.")
    split = tags.split if tags is not None else _split_mode(fields, "1")
    documents = None
    if tags is not None:
        documents = await read_markup(texts, tags, settings, DeepLError, DEEPL_BODY)
    plain = [d.plain_text for d in documents] if documents is not None else texts
    source = await _source_language(service, fields.get("source_lang"), plain, target)
    model = service.model_for(source, target, admitted_at(request))
    request.state.model = model.labels
    options = search_options(Decoding(confidence=with_confidence), settings, model)
    terminology = None
    if glossary_id := fields.get("glossary_id"):
        if not fields.get("source_lang"):  # DeepL's rule: a glossary is for a pair
            raise DeepLError(
                400, "Use of a glossary requires the source_lang parameter to be specified."
            )
        terminology = await terminology_of(
            glossaries, owner, str(glossary_id), source, model.target_lang, DeepLError
        )
    found = await translate_texts(
        service, request, model, texts, options, documents, split, terminology
    )
    detected = source.upper()
    billed = map(billed_characters, texts)  # DeepL's clients read the count
    translations = [
        {"detected_source_language": detected, "text": text, "billed_characters": n}
        for text, n in zip(found.texts, billed, strict=True)
    ]
    if with_confidence:  # our extension: DeepL's clients ignore fields they do not know
        for translation, confidence in zip(translations, found.confidence, strict=True):
            translation["confidence"] = confidence_body(confidence, found.confidence_label)
    return JSONResponse({"translations": translations})


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


def target_language(value: Any) -> str:
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


def refuse_what_cannot_be_honoured(fields: dict[str, Any]) -> None:
    formality = str(fields.get("formality") or "default").lower()
    if formality not in FORMALITIES:
        raise DeepLError(400, "Value for 'formality' not supported.")
    if formality in ("more", "less"):  # a demand, not a hint: the models have no formality
        raise DeepLError(400, "'formality' is not supported for the given target language.")


def _language_list(service: TranslationService, kind: str) -> list[dict[str, Any]]:
    models = service.registry.models
    if kind == "source":
        codes = sorted({a for m in models for a, _ in m.pairs()})
        return [{"language": c.upper(), "name": LANGUAGE_NAMES.get(c, c)} for c in codes]
    listed = []
    for code in sorted({b for m in models for _, b in m.pairs()}):
        for variant in REGIONAL_TARGETS.get(code, (code.upper(),)):
            name = REGION_NAMES.get(variant, LANGUAGE_NAMES.get(code, code))
            listed.append({"language": variant, "name": name, "supports_formality": False})
    return listed


def _as_deepl_error(error: ServiceError, request: Request, status: int) -> DeepLError:
    """DeepL's wording for a service error."""
    if isinstance(error, MissingApiKey | InvalidApiKey):
        return DeepLError(status, "Authorization failure, check auth_key.")
    if isinstance(error, QuotaExceeded):
        return DeepLError(status, f"Quota Exceeded: {error}")
    message = with_request_id(error, request)
    if isinstance(error, TooManyTexts):
        message = (
            f"Too many texts: {error.count}; at most {error.limit} per request "
            "(NMT_MAX_TEXTS_PER_REQUEST)."
        )
    elif isinstance(error, TextTooLong):
        message = (
            f"A text has {error.characters} characters; at most {error.limit} "
            "(NMT_MAX_CHARS_PER_TEXT)."
        )
    elif isinstance(error, UnknownPair):
        supported = ", ".join(p.upper() for p in error.supported) or "none"
        message = f"Value for 'target_lang' or 'source_lang' not supported (pairs: {supported})."
    return DeepLError(status, message, error.headers() or None)


DEEPL_ERRORS = {
    400: "a missing or unsupported parameter or language, invalid JSON",
    403: "authorization failure (NMT_API_KEYS is set, and the key is missing or wrong)",
    404: "no glossary of this glossary_id for this key",
    413: "too many texts, a text too long, or a body larger than NMT_MAX_BODY_BYTES",
    429: "too many requests: the queue is full (Retry-After)",
    456: "quota exceeded (NMT_CHARACTER_LIMIT)",
    500: "a server fault; the message names the request id",
    503: "models loading, or the server is shutting down",
    504: "not translated within NMT_REQUEST_TIMEOUT_SECONDS",
}


# The languages and glossary, as every DeepL call that translates reads them (/openapi.json).
LANGUAGE_FIELDS = {
    "target_lang": {"type": "string", "example": "EN-GB"},
    "source_lang": {"type": "string", "example": "FR"},
    "glossary_id": {"type": "string", "description": "a glossary of this key (needs source_lang)"},
}
# The fields /v2/translate reads, for /openapi.json (a form repeats `text` for a list).
_REQUEST_BODY = documented_body(
    required=["text", "target_lang"],
    properties={
        "text": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "example": ["Un homme fait du vélo."],
        },
        **LANGUAGE_FIELDS,
        "split_sentences": {"type": "string", "enum": ["0", "1", "nonewlines"]},
        "preserve_formatting": {"type": "boolean"},
        "formality": {"type": "string", "enum": sorted(FORMALITIES)},
        "context": {"type": "string"},
        "tag_handling": {"type": "string", "enum": ["html", "xml"]},
        "outline_detection": {"type": "boolean"},
        **{name: {"type": "array", "items": {"type": "string"}} for name in TAG_LISTS},
        "return_confidence": {
            "type": "boolean",
            "description": "not DeepL's: each translation's confidence (docs/confidence.md)",
        },
    },
)


# DeepL says 413 for a request too large and 456 for the quota, 403 for any key problem;
# anything else wrong with the request is a 400. (No DeepL answer carries alignment weights.)
LIMIT_STATUS = {
    Limit.TEXTS: 413, Limit.CHARACTERS: 413, Limit.SENTENCES: 413, Limit.TOKENS: 400,
    Limit.ALIGNMENT: 413, Limit.BODY: 413, Limit.QUOTA: QUOTA_EXCEEDED,
}  # fmt: skip
DEEPL = Dialect(
    DeepLError,
    paths=frozenset({"/v2/translate", "/v2/languages", "/v2/usage"}),
    limit_status=LIMIT_STATUS,
    statuses={401: 403, 404: 400, 422: 400},
    as_error=_as_deepl_error,
    read_fields=_read_fields,
    presented_key=presented_key,
)
