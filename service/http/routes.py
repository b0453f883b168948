"""The native routes: thin. Each one reads its input, asks the TranslationService, and shapes
the answer; failures are ServiceErrors that app.py answers in the native dialect (NATIVE:
FastAPI's `{"detail": ...}`, pydantic's list of problems for invalid input).

No `from __future__ import annotations` here: FastAPI must see the request model class itself
in the route's signature, and that class is made at runtime from the settings.
"""

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from service.http.dependencies import (
    ApiKeysDep,
    MetricsDep,
    ServiceDep,
    StoreDep,
    client_disconnected,
    header_key,
    require_api_key,
    require_api_key_for_metrics,
)
from service.http.dialect import Dialect, DialectError, search_options, with_request_id
from service.http.glossary_lookup import owner_of, terminology_of
from service.http.limits import Limit, check_texts
from service.http.middleware import admitted_at
from service.http.schemas import (
    Problem,
    TranslateRequestBase,
    TranslateResponse,
    glossary_terms,
    translate_request_model,
)
from service.http.usage import account
from service.serving.errors import GlossaryUnknown, InvalidInput, ServiceError
from service.serving.requests import RequestResult, off_loop
from service.serving.settings import Settings
from service.serving.terminology import Terminology


class NativeError(DialectError):
    key = "detail"


def _as_native_error(error: ServiceError, request: Request, status: int) -> NativeError:
    if isinstance(error, InvalidInput):  # shaped like pydantic's own 422 details
        problem: dict = {"type": error.kind, "loc": list(error.location), "msg": error.message}
        if error.context is not None:
            problem["ctx"] = error.context
        return NativeError(status, error.message, detail=[problem])
    return NativeError(status, with_request_id(error, request), error.headers() or None)


# 422 for a request that breaks a limit on what it holds, 413 for too much work, 429 for the
# quota: each error's own status.
LIMIT_STATUS = {
    Limit.TEXTS: 422, Limit.CHARACTERS: 422, Limit.SENTENCES: 413, Limit.TOKENS: 422,
    Limit.ALIGNMENT: 413, Limit.BODY: 413, Limit.QUOTA: 429,
}  # fmt: skip
# Every path the other dialects do not claim.
NATIVE = Dialect(
    NativeError,
    paths=frozenset(),
    limit_status=LIMIT_STATUS,
    statuses={},
    as_error=_as_native_error,
)

ERROR_RESPONSES: dict[int | str, dict] = {
    400: {"model": Problem, "description": "a body that is not valid JSON (or not UTF-8)"},
    401: {"model": Problem, "description": "no API key (only when NMT_API_KEYS is set)"},
    403: {"model": Problem, "description": "an API key that is not valid"},
    404: {"model": Problem, "description": "no model for this language pair (lists them)"},
    408: {"model": Problem, "description": "the body did not arrive in NMT_BODY_TIMEOUT_SECONDS"},
    413: {
        "model": Problem,
        "description": "body larger than NMT_MAX_BODY_BYTES, more sentences than "
        "NMT_MAX_SENTENCES_PER_REQUEST, or an alignment of more weights than "
        "NMT_MAX_ALIGNMENT_WEIGHTS",
    },
    422: {"description": "invalid input: the message names the field and the limit"},
    429: {
        "model": Problem,
        "description": "queue full, or too many requests in flight: retry after Retry-After "
        "seconds",
    },
    500: {"model": Problem, "description": "a server fault; the message names the request id"},
    503: {"model": Problem, "description": "models loading, or shutting down"},
    504: {"model": Problem, "description": "not done within NMT_REQUEST_TIMEOUT_SECONDS"},
}
KEYED = [Depends(require_api_key)]


def build_router(settings: Settings) -> APIRouter:
    router = APIRouter()
    TranslateRequest = translate_request_model(settings)  # a class, made for these limits

    @router.post(
        "/v1/translate",
        response_model=TranslateResponse,
        response_model_exclude_none=True,
        responses=ERROR_RESPONSES,
        dependencies=KEYED,
        tags=["translate"],
        summary="Translate one text or a list of texts",
    )
    async def translate(
        body: TranslateRequest,  # type: ignore[valid-type]
        request: Request,
        service: ServiceDep,
        keys: ApiKeysDep,
        store: StoreDep,
    ) -> Response:
        check_texts(body.text, settings)
        model = service.model_for(
            body.source_lang, body.target_lang, admitted_at(request), body.model_version
        )
        request.state.model = model.labels
        options = search_options(body.decoding(), settings, model)
        terminology = None
        if body.glossary_id is not None:
            owner = owner_of(keys, header_key(request))
            terminology = await terminology_of(
                store.glossaries,
                owner,
                body.glossary_id,
                model.source_lang,
                model.target_lang,
                _glossary_error,
            )
        elif body.glossary is not None:
            terms = await off_loop(len(body.glossary), glossary_terms, body.glossary)
            entries = [(term.source, term.target) for term in terms]
            terminology = await off_loop(len(entries), Terminology, entries)
        result = await service.translate(
            model,
            body.texts,
            options,
            lambda: client_disconnected(request),
            terminology=terminology,
        )
        account(request, len(body.texts), result)
        return await _json_answer(result, body)

    @router.get("/healthz", tags=["health"], summary="alive (200) unless loading failed (503)")
    async def healthz(service: ServiceDep) -> JSONResponse:
        lifecycle = service.lifecycle
        status = 200 if lifecycle.alive else 503
        return JSONResponse({"status": lifecycle.phase, "detail": lifecycle.reason}, status)

    @router.get(
        "/readyz",
        tags=["health"],
        summary="ready (200) once the models are loaded and warm, while some model serves",
    )
    async def readyz(service: ServiceDep) -> JSONResponse:
        lifecycle = service.lifecycle
        if not lifecycle.ready:
            return JSONResponse({"status": lifecycle.phase, "detail": lifecycle.reason}, 503)
        # A model reloading keeps serving its old version: ready stays. With every model
        # unloaded there is nothing to send traffic to.
        if not service.registry.ready:
            return JSONResponse({"status": "no_model", "detail": "no model is loaded"}, 503)
        return JSONResponse({"status": "ready", "models": service.registry.pairs})

    # HEAD, as load balancers and uptime monitors probe: GET's status and headers, no body
    # (the server drops it). A route of its own, so that its operationId is its own too.
    for path, probe in (("/healthz", healthz), ("/readyz", readyz)):
        router.add_api_route(
            path,
            probe,
            methods=["HEAD"],
            tags=["health"],
            summary=f"GET {path}, without the body",
            response_class=Response,  # documented without content: a HEAD answer has none
            responses={200: {"description": "as GET"}, 503: {"description": "as GET"}},
        )

    @router.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics (text exposition format)",
        response_class=PlainTextResponse,
        dependencies=[Depends(require_api_key_for_metrics)],
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
            401: ERROR_RESPONSES[401],
            403: ERROR_RESPONSES[403],
        },
    )
    async def metrics(metrics: MetricsDep) -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    return router


def _glossary_error(status: int, message: str) -> ServiceError:
    """An unknown glossary (404, also another key's) or one without the pair (422)."""
    if status == 404:
        return GlossaryUnknown(message)
    return InvalidInput("glossary_id", message, field="glossary_id")


async def _json_answer(result: RequestResult, body: TranslateRequestBase) -> Response:
    """The answer as JSON bytes, rendered here rather than by FastAPI, which validates and
    serialises an async route's response_model on the event loop: seconds for an answer with
    alignment. A large one (characters plus attention weights, off_loop's rule) renders on a
    worker thread; the bytes are what FastAPI would have sent (response_model_exclude_none)."""
    size = sum(map(len, body.texts)) + result.alignment_weights
    content = await off_loop(size, _render, result, body)
    return Response(content, media_type="application/json")


def _render(result: RequestResult, body: TranslateRequestBase) -> bytes:
    answer = TranslateResponse.from_result(result, body)
    return answer.model_dump_json(exclude_none=True).encode()
