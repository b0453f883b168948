"""What the API dialects (native, LibreTranslate, DeepL) share, written once: the error
envelope, each limit's status, the decoding settings a request asks for, reading a JSON or form
body, and the order in which a request is answered (fields, then key, then the work; every
failure in the dialect's own body).

Each dialect declares only what differs: its error field ("detail", "error" or "message"), its
status for every limit (limits.py) and for the other service errors it says otherwise, its
wording, and (LibreTranslate, DeepL) how it reads its fields and where its key may be. The
native dialect reads its fields through FastAPI's request schema (schemas.py). LibreTranslate
and DeepL read markup and translate through the same two functions here, which account what
a request used (usage.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.types import Message, Scope

from service.documents import markup
from service.http.dependencies import client_disconnected, header_key
from service.http.json_process import MAX_VALUES, TooManyValues
from service.http.limits import Limit, limit_of
from service.http.usage import account
from service.runtime.search import SearchOptions
from service.serving.access import ApiKeys
from service.serving.confidence import SentenceConfidence
from service.serving.errors import InternalError, InvalidInput, ServiceError
from service.serving.pivot import Pivot
from service.serving.registry import LoadedModel
from service.serving.requests import PREPARE_INLINE_CHARS, TranslationService
from service.serving.sentences import SplitMode
from service.serving.settings import Settings
from service.serving.terminology import Terminology

log = logging.getLogger("nmt.app")


class DialectError(Exception):
    """An answer in a dialect's error body, `{key: message}` (or `{key: detail}` where the body
    carries more than the message), with its status."""

    key: ClassVar[str]

    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        detail: Any = None,
    ) -> None:
        self.status, self.message, self.headers, self.detail = status, message, headers, detail
        super().__init__(message)

    def response(self) -> JSONResponse:
        body = {self.key: self.message if self.detail is None else self.detail}
        return JSONResponse(body, self.status, headers=self.headers)

    @classmethod
    def doc(cls, description: str) -> dict:
        """This body in an OpenAPI `responses` entry."""
        properties = {cls.key: {"type": "string"}}
        schema = {"type": "object", "required": [cls.key], "properties": properties}
        return {"description": description, "content": {"application/json": {"schema": schema}}}


def with_request_id(error: ServiceError, request: Request) -> str:
    """The error's message; a server fault's names the request id, to find its log line."""
    if isinstance(error, InternalError):
        return f"{error} (request id {request.state.request_id})"
    return str(error)


@dataclass(frozen=True)
class Dialect:
    error: type[DialectError]
    paths: frozenset[str]  # the paths that answer in this dialect
    # This dialect's status for each limit (every Limit: checked when it is made).
    limit_status: Mapping[Limit, int]
    # The service errors' statuses this dialect says otherwise (the error's own -> this one's).
    statuses: Mapping[int, int]
    # The dialect's answer for a service error, with the status it has in this dialect.
    as_error: Callable[[ServiceError, Request, int], DialectError]
    # Dialects that read their own fields (not through FastAPI's request schema): how, and
    # the key a request presents (the headers', or a field of the dialect's own) or None.
    read_fields: Callable[[Request], Awaitable[dict[str, Any]]] | None = None
    presented_key: Callable[[Request, dict[str, Any]], str | None] | None = None
    # ... and every path that starts with one of these (a resource's own paths, by its id).
    prefixes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        missing = set(Limit) - set(self.limit_status)
        if missing:
            raise ValueError(f"{self.error.__name__}: no status for {sorted(missing)}")

    def serves(self, path: str) -> bool:
        return path in self.paths or any(path.startswith(prefix) for prefix in self.prefixes)

    def status_of(self, error: ServiceError) -> int:
        limit = limit_of(error)
        if limit is not None:
            return self.limit_status[limit]
        return self.statuses.get(error.status, error.status)

    def error_for(self, error: ServiceError, request: Request) -> DialectError:
        if isinstance(error, InternalError):  # the server's fault: its log line, by request id
            log.error("internal error: %s", error, extra={"request_id": request.state.request_id})
        return self.as_error(error, request, self.status_of(error))

    async def answer(
        self,
        request: Request,
        keys: ApiKeys,
        respond: Callable[[dict[str, Any]], Awaitable[Response]],
    ) -> Response:
        """Read the fields, check the key, respond; every failure in the dialect's body."""
        assert self.read_fields is not None and self.presented_key is not None
        try:
            try:
                fields = await self.read_fields(request)
            except DialectError:  # a body that cannot be read holds no key: the header's first
                keys.check(header_key(request))
                raise
            keys.check(self.presented_key(request, fields))
            return await respond(fields)
        except DialectError as error:
            request.state.error = error.message
            return error.response()
        except ServiceError as error:
            answer = self.error_for(error, request)
            request.state.error = answer.message
            return answer.response()


@dataclass(frozen=True)
class Decoding:
    """What a request asks of the decoder, in any dialect's fields; None: the server's
    default (NMT_DEFAULT_BEAM_SIZE, at least n_best; NMT_MAX_OUTPUT_LENGTH;
    NMT_DEFAULT_LENGTH_PENALTY; the last decoder layer)."""

    beam_size: int | None = None
    n_best: int = 1
    max_length: int | None = None
    length_penalty: float | None = None
    alignment: bool = False
    alignment_layer: int | None = None
    alignment_heads: bool = False
    confidence: bool = False


def search_options(
    decoding: Decoding, settings: Settings, model: LoadedModel | Pivot
) -> SearchOptions:
    """The SearchOptions of a request to `model`, with the server's defaults and repetition
    guard. The alignment layer is checked here, against the model's decoder layers (a 422 in
    the native API), whether or not alignment is asked for."""
    layer = decoding.alignment_layer
    if layer is not None:
        layers = model.decoder_layers
        if not 0 <= layer < layers:
            raise InvalidInput(
                "alignment_layer",
                f"is {layer}; {model.name} has {layers} decoder layers: 0 to {layers - 1}",
                field="alignment_layer",
            )
    penalty = decoding.length_penalty
    return SearchOptions(
        beam_size=decoding.beam_size or max(settings.default_beam_size, decoding.n_best),
        length_penalty=settings.default_length_penalty if penalty is None else penalty,
        n_best=decoding.n_best,
        max_length=decoding.max_length or settings.max_output_length,
        alignment=decoding.alignment,
        max_repeats=settings.max_repeats,
        alignment_layer=-1 if layer is None else layer,
        alignment_heads=decoding.alignment_heads,
        first_token=model.first_token,
        confidence=decoding.confidence,
    )


@dataclass
class Translated:
    texts: list[str]
    alternatives: list[list[str]]  # each text's, after the best (none for markup)
    # With options.confidence (plain text only): each text's (SentenceConfidence), and what
    # the model's calibration calls good
    confidence: list[SentenceConfidence | None] = field(default_factory=list)
    confidence_label: str | None = None


def confidence_flag(value: Any, error: type[DialectError]) -> bool:
    """return_confidence, our extension of the LibreTranslate and DeepL dialects, as JSON
    (true/false) or a form field ("true"/"false", "1"/"0"); absent: false."""
    if value is None or value is False or value is True:
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0", ""):
        return value.strip().lower() in ("true", "1")
    raise error(400, "return_confidence must be true or false")


def confidence_body(confidence: SentenceConfidence | None, label: str | None) -> dict | None:
    """A text's confidence as the dialects answer it: the native API's `confidence` object
    (sentence and label absent without a calibration, as are the words' doubtful flags)."""
    if confidence is None:
        return None
    body: dict[str, Any] = {"raw": confidence.raw}
    if confidence.sentence is not None:
        body = {"sentence": confidence.sentence, **body, "label": label}
    body["truncated"] = confidence.truncated
    body["words"] = [
        {"word": w.word, "confidence": w.confidence}
        | ({} if w.doubtful is None else {"doubtful": w.doubtful})
        for w in confidence.words
    ]
    return body


async def translate_texts(
    service: TranslationService,
    request: Request,
    model: LoadedModel | Pivot,
    texts: list[str],
    options: SearchOptions,
    documents: list[markup.Document] | None = None,
    split: SplitMode = "sentences",
    terminology: Terminology | None = None,
) -> Translated:
    """The texts translated, or the documents read from them with their markup carried; what
    the request used accounted. `terminology`: a glossary's terms, written where found."""

    def gone() -> Awaitable[None]:
        return client_disconnected(request)

    if documents is not None:
        written = await markup.translate(service, model, documents, options, gone, terminology)
        account(request, len(texts), written)
        return Translated(written.texts, [[] for _ in documents])
    result = await service.translate(
        model, texts, options, gone, split=split, terminology=terminology
    )
    account(request, len(texts), result)
    others = [[a.text for a in item.n_best[1:]] for item in result.texts]
    return Translated(
        [item.text for item in result.texts],
        others,
        [item.confidence for item in result.texts],
        result.confidence_label,
    )


@dataclass(frozen=True)
class BodyWording:
    """A dialect's messages for a body it cannot read (each a 400)."""

    invalid_json: str
    not_an_object: str
    unreadable_form: str  # with "{detail}": Starlette's reason
    unreadable_markup: str  # with "{detail}": what the markup parser said
    too_many_values: str = (
        "The request body holds more than {limit} JSON values: a glossary's entries go in "
        "one string (entries)."
    )


JSON_OR_FORM = ("application/json", "application/x-www-form-urlencoded")


def documented_body(
    properties: dict[str, Any],
    required: list[str],
    content_types: tuple[str, ...] = JSON_OR_FORM,
) -> dict[str, Any]:
    """`openapi_extra` for a call that reads its fields by hand (read_body: a JSON or form
    body, over the query), which FastAPI cannot see: the fields as its request body in
    /openapi.json, the same schema for each content type it takes."""
    schema = {"type": "object", "required": required, "properties": properties}
    return {"requestBody": {"content": {kind: {"schema": schema} for kind in content_types}}}


async def read_body(
    request: Request, error: type[DialectError], wording: BodyWording, empty_json: str
) -> dict[str, Any] | FormData | None:
    """The body as a JSON object, a form, or None for another content type; `empty_json` is
    what an empty JSON body reads as ("{}" or "null")."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        body = await request.body() or empty_json.encode()
        try:
            if len(body) > request.app.state.settings.max_body_bytes:  # a glossary route's
                data = await request.app.state.json_process.loads(body)
            else:
                data = json.loads(body)
        except TooManyValues:
            raise error(400, wording.too_many_values.format(limit=MAX_VALUES)) from None
        # ValueError covers JSONDecodeError, bad UTF-8 and integers past Python's digit limit;
        # RecursionError, JSON nested deeper than the parser's stack.
        except (ValueError, RecursionError):
            raise error(400, wording.invalid_json) from None
        if not isinstance(data, dict):
            raise error(400, wording.not_an_object)
        return data
    if content_type == "application/x-www-form-urlencoded":
        body = await request.body()
        try:
            if len(body) <= PREPARE_INLINE_CHARS:
                return urlencoded_form(body)
            return await asyncio.to_thread(urlencoded_form, body)
        except UnreadableForm as failure:
            raise error(400, wording.unreadable_form.format(detail=failure)) from None
    if content_type == "multipart/form-data":
        body = await request.body()
        # A field may be as large as the whole body, which the middleware bounded already
        # (a glossary's entries: NMT_MAX_GLOSSARY_BYTES); Starlette's cap is 1 MiB a part.
        largest_part = len(body) + 1
        try:
            if len(body) <= PREPARE_INLINE_CHARS:
                return await request.form(max_part_size=largest_part)
            # Starlette's parser is Python run on the event loop: 0.2-0.3 s for a 10 MB form.
            return await asyncio.to_thread(_form_of, request.scope, body, largest_part)
        except HTTPException as failure:  # Starlette's 400 for a form it cannot read
            raise error(400, wording.unreadable_form.format(detail=failure.detail)) from None
    return None


# Fields a urlencoded form may have (Starlette's own limit).
MAX_FORM_FIELDS = 1000


class UnreadableForm(ValueError):
    """A urlencoded body that is not a form of UTF-8 text."""


def urlencoded_form(body: bytes) -> FormData:
    """A urlencoded body's fields, each percent-decoded as bytes and then read as UTF-8, as
    browsers and HTML forms send them. Starlette reads the body as Latin-1 first: UTF-8 sent
    as it is (`curl -d 'q=café'`) came out "cafÃ©", and bytes that are not UTF-8 came out as
    U+FFFD, both translated without a word; here the first reads right and the second is a
    400."""
    # Latin-1 maps bytes to characters one to one, raw and percent-encoded alike: the pairs
    # are the body's bytes, read as UTF-8 once decoded.
    try:
        pairs = parse_qsl(
            body.decode("latin-1"),
            keep_blank_values=True,
            max_num_fields=MAX_FORM_FIELDS,
            encoding="latin-1",
        )
    except ValueError:  # parse_qsl's: more fields than max_num_fields
        raise UnreadableForm(f"more than {MAX_FORM_FIELDS} fields") from None
    try:
        return FormData(
            [
                (name.encode("latin-1").decode(), value.encode("latin-1").decode())
                for name, value in pairs
            ]
        )
    except UnicodeDecodeError:
        raise UnreadableForm("a field is not UTF-8 text (send UTF-8, percent-encoded)") from None


def _form_of(scope: Scope, body: bytes, largest_part: int) -> FormData:
    """Starlette's reading of a form body (its limits, its errors), on the calling thread."""

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def read() -> FormData:
        return await Request(scope, receive).form(max_part_size=largest_part)

    return asyncio.run(read())


async def read_markup(
    texts: list[str],
    options: markup.MarkupOptions,
    settings: Settings,
    error: type[DialectError],
    wording: BodyWording,
) -> list[markup.Document]:
    """Parsed off the event loop when long (seconds of CPU for 64 texts of markup), and no
    further than the sentence limit where a request passes it."""
    try:
        return await markup.read_off_loop(texts, options, settings.max_sentences_per_request)
    except markup.MarkupError as failure:
        raise error(400, wording.unreadable_markup.format(detail=failure)) from None
