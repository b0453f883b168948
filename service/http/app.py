"""The FastAPI application: wiring only. Routes live in routes.py (native), libretranslate.py,
deepl.py and glossaries.py (DeepL's), each answering in its dialect (dialect.py); the work in
service/serving/: requests.py, loop.py (the decoding loop) and registry.py (models).

The store (service/store: glossaries, in SQLite or PostgreSQL) opens first, its schema migrated,
before any request is answered, and closes last. Models load in a background thread after it,
so that /healthz answers at once and /readyz says 503 until every model is loaded and warm. On
shutdown the decoding loops finish what was admitted before the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from service.documents.jobs import DocumentJobs
from service.http import deepl, glossaries, libretranslate, model_control, routes
from service.http import documents as documents_api
from service.http.dependencies import (
    require_admin_key,
    require_api_key,
    require_api_key_for_metrics,
)
from service.http.dialect import Dialect
from service.http.json_process import JsonProcess
from service.http.middleware import QUIET_ROUTES, RequestContextMiddleware
from service.http.pages import add_pages
from service.serving import heap
from service.serving.access import ApiKeys
from service.serving.cache import TranslationCache
from service.serving.errors import ServiceError
from service.serving.lifecycle import Lifecycle
from service.serving.metrics import Metrics, package_version
from service.serving.registry import ModelRegistry, RepositoryWatch
from service.serving.requests import TranslationService
from service.serving.settings import Settings
from service.serving.tracing import Tracing
from service.store import Store, StoreError, StoreUnavailable, database_url, open_store, shown

log = logging.getLogger("nmt.app")


def create_app(
    settings: Settings | None = None,
    on_load_failed: Callable[[str], None] | None = None,
    tracing: Tracing | None = None,
) -> FastAPI:
    """`tracing`: where spans go (tests pass their own); default: NMT_OTLP_ENDPOINT's, or off.
    The app shuts it down when it stops."""
    settings = settings or Settings()
    tracing = tracing if tracing is not None else Tracing.from_settings(settings)
    metrics = Metrics()
    lifecycle = Lifecycle(on_failed=on_load_failed, grace=settings.shutdown_timeout_seconds)
    registry = ModelRegistry(settings, metrics)
    cache = TranslationCache(settings.cache_entries, settings.cache_bytes, metrics)
    service = TranslationService(settings, registry, lifecycle, cache, metrics, tracing)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The store first, before any request: glossaries must be there once the server
        # answers, and a database it cannot use stops it here (`nmt serve` exits with
        # uvicorn's status for a failed start-up, 3).
        store = await asyncio.to_thread(_open_store, settings, lifecycle)
        app.state.store = store
        metrics.watch_glossaries(store.glossaries.count)
        metrics.watch_documents(store.documents.queued)
        documents = DocumentJobs(settings, service, store)
        app.state.documents = documents
        documents.start()  # its workers wait for the models to be ready
        watch = None
        if settings.model_poll_seconds:
            watch = RepositoryWatch(registry, settings.model_poll_seconds)
        loader = threading.Thread(
            target=_load_models, args=(service, lifecycle, watch), name="nmt-load", daemon=True
        )
        loader.start()
        yield
        lifecycle.start_draining()
        await documents.stop()  # the jobs they held go back to the queue, chunks kept
        await asyncio.to_thread(loader.join, settings.shutdown_timeout_seconds)
        if watch is not None:
            await asyncio.to_thread(watch.stop)
        await asyncio.to_thread(registry.close, settings.shutdown_timeout_seconds)
        await asyncio.to_thread(store.close)  # after the last request that could use it
        await asyncio.to_thread(tracing.shutdown)  # the spans still buffered are sent
        if lifecycle.abandoned:
            log.warning(
                "stopped: %d admitted requests were still running at "
                "NMT_SHUTDOWN_TIMEOUT_SECONDS and were answered 503; every other one was "
                "answered in full",
                lifecycle.abandoned,
            )
        else:
            log.info("stopped: every admitted request was answered in full")

    app = FastAPI(
        title="nmt-serve",
        version=package_version(),
        description="Neural machine translation on ONNX Runtime, with dynamic batching. "
        "Native API under /v1; LibreTranslate-compatible POST /translate.",
        lifespan=lifespan,
        docs_url=None,  # served by pages.py from local assets, not from a CDN
        redoc_url=None,
    )
    app.state.settings, app.state.metrics, app.state.service = settings, metrics, service
    app.state.api_keys = ApiKeys(settings.api_key_list)
    app.state.json_process = JsonProcess()  # the glossary routes' big bodies
    app.state.admin_keys = ApiKeys(settings.admin_key_list)
    add_pages(app, docs=settings.docs)
    app.include_router(routes.build_router(settings))
    app.include_router(model_control.build_router())
    app.include_router(libretranslate.build_router(settings))
    app.include_router(deepl.build_router(settings))
    app.include_router(glossaries.build_router(settings))
    app.include_router(documents_api.build_router(settings))
    app.state.dialect_of = dialect_of
    app.state.error_key = lambda path: dialect_of(path).error.key
    cors_origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if cors_origins:
        # Added first, so that it runs inside RequestContextMiddleware (the last one added is
        # the outermost): its preflight answers get the request id and the security headers,
        # and reach no route (so no key is asked of them).
        app.add_middleware(
            CORSMiddleware,
            allow_origins=cors_origins,
            allow_methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"],
            # Every header the docs tell clients to send (DeepL's key is in Authorization).
            allow_headers=["Content-Type", "Authorization", "X-API-Key", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Retry-After"],
        )
    app.add_middleware(
        RequestContextMiddleware,
        metrics=metrics,
        max_body_bytes=settings.max_body_bytes,
        access_log_enabled=settings.access_log,
        dialect_of=dialect_of,
        max_in_flight=settings.max_requests_in_flight,
        body_timeout=settings.body_timeout_seconds,
        retry_after=settings.retry_after_seconds,
        cors_origins=cors_origins,
        # A glossary's entries may be NMT_MAX_GLOSSARY_BYTES on top of an ordinary body.
        # A document may be NMT_MAX_DOCUMENT_BYTES (and its form's fields).
        larger_bodies={
            prefix: settings.max_body_bytes + settings.max_glossary_bytes
            for prefix in glossaries.PREFIXES
        },
        uploads={
            path: settings.max_body_bytes + settings.max_document_bytes
            for path in documents_api.UPLOADS
        },
    )
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(StoreUnavailable, _store_unavailable)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    if tracing.provider is not None:
        _instrument(app, tracing)
    return app


def _instrument(app: FastAPI, tracing: Tracing) -> None:
    """A span per request (OpenTelemetry's FastAPI instrumentation, imported only when tracing
    is on), the parent of the service's spans (service/serving/tracing.py). Probes and scrapes
    are left out, and so are the ASGI messages' own spans (one per body chunk)."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=tracing.provider,
        excluded_urls=",".join(sorted(QUIET_ROUTES)),
        exclude_spans=["receive", "send"],
    )


# The dialects other than the native one, which answers every path they do not claim.
DIALECTS = (
    libretranslate.LIBRE,
    deepl.DEEPL,
    glossaries.GLOSSARIES,
    *documents_api.DIALECTS,
    documents_api.DEEPL_POLLS,
)
DIALECT_OF_PATH = {path: dialect for dialect in DIALECTS for path in dialect.paths}


def dialect_of(path: str) -> Dialect:
    found = DIALECT_OF_PATH.get(path)
    if found is None:
        found = next((d for d in DIALECTS if d.prefixes and d.serves(path)), routes.NATIVE)
    return found


def _open_store(settings: Settings, lifecycle: Lifecycle) -> Store:
    """The store of NMT_DATABASE_URL (migrated, with NMT_DATABASE_MIGRATE), or the server
    fails, saying which database (password masked) and why."""
    try:
        return open_store(settings)
    except Exception as error:  # a bad URL, a database down or refusing us, a newer schema
        where = _shown_database(settings)
        log.error("could not open the database %s: %s", where, error)
        lifecycle.mark_failed(f"could not open the database {where}: {error}")
        raise


def _shown_database(settings: Settings) -> str:
    try:
        return shown(database_url(settings))
    except StoreError:
        return "(NMT_DATABASE_URL, not a URL)"


def _load_models(
    service: TranslationService, lifecycle: Lifecycle, watch: RepositoryWatch | None
) -> None:
    registry = service.registry
    try:
        registry.load_all()
        service.detector.load()  # before ready: the first "auto" request must not wait
        if undetectable := service.undetectable_sources():
            log.warning(
                "language detection (%s) cannot name %d source languages served: a text in "
                "one, sent without its language, is detected as another; NMT_LANGUAGE_ID_MODEL "
                "can name a fastText model that covers them",
                service.detector.name,
                len(undetectable),
                extra={"languages": undetectable},
            )
    except Exception as error:  # a bad bundle, a missing folder, an ONNX Runtime failure
        log.error("could not load the models: %s", error)
        lifecycle.mark_failed(f"could not load the models: {error}")
        return
    heap.settle()  # what the server keeps for its life: out of the full collections' way
    lifecycle.mark_ready()
    log.info("ready", extra={"models": registry.pairs})
    if watch is not None:
        watch.start()


async def _service_error(request: Request, error: Exception) -> JSONResponse:
    """A service error from a native route, in the native dialect."""
    assert isinstance(error, ServiceError)
    request.state.error = str(error)
    return routes.NATIVE.error_for(error, request).response()


async def _store_unavailable(request: Request, error: Exception) -> Response:
    """The database did not answer (down, unreachable, locked past its timeout) where a route
    needed it (a glossary to translate with, a document's job): a 503 the client may retry,
    in the path's dialect. The driver's reason is logged for the operator, not sent."""
    log.warning("the store is unavailable: %s", error)
    refusal = HTTPException(
        503, "The database did not answer; retry later.", headers={"Retry-After": "1"}
    )
    return await _http_error(request, refusal)


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    """FastAPI's 422 body, minus the echo of the (possibly huge) input. A body that is not JSON
    at all is a 400 (422 is for JSON that breaks the schema), answered after the key check."""
    assert isinstance(error, RequestValidationError)
    for problem in error.errors():
        if problem.get("type") == "json_invalid":
            return await _unreadable_body(request, _json_problem(problem, error.body))
    detail = [
        {key: value for key, value in problem.items() if key in ("type", "loc", "msg", "ctx")}
        for problem in error.errors()
    ]
    request.state.error = "; ".join(str(problem["msg"]) for problem in detail)[:500]
    return JSONResponse({"detail": _jsonable(detail)}, 422)


async def _http_error(request: Request, error: Exception) -> Response:
    """Starlette's and FastAPI's HTTP errors (404, 405, the 400 for a body FastAPI could not
    decode) in the error body of the path's dialect; that 400 names what is wrong with the
    body, and comes after the key check."""
    assert isinstance(error, HTTPException)
    cause = error.__cause__  # set only where FastAPI decoded the body itself
    if error.status_code == 400 and cause is not None:
        if isinstance(cause, UnicodeDecodeError):
            reason = f"it is not UTF-8 ({cause.reason} at byte {cause.start})"
        elif isinstance(cause, RecursionError):
            reason = "it is nested deeper than the parser allows"
        else:
            reason = str(error.detail)
        return await _unreadable_body(request, f"the body is not valid JSON: {reason}")
    request.state.error = str(error.detail)
    if error.status_code == 405:
        named = (error.headers or {}).get("Allow", "")
        error.headers = {**(error.headers or {}), "Allow": _allowed_methods(request, named)}
    key = dialect_of(request.url.path).error.key
    if key == "detail":
        return await http_exception_handler(request, error)
    return JSONResponse({key: error.detail}, error.status_code, headers=error.headers)


def _allowed_methods(request: Request, named: str) -> str:
    """Every method the OpenAPI document gives this path (RFC 9110's Allow for a 405), or what
    Starlette `named`: it names only the first matching route's, and each method of a path is
    a route of its own here (one operationId each: GET and POST of a DeepL path; GET, PATCH and
    DELETE of a glossary, whose documented path is a template, `/v3/glossaries/{glossary_id}`)."""
    segments = request.url.path.split("/")
    methods = {
        method.upper()
        for template, operations in request.app.openapi().get("paths", {}).items()
        if _matches(template.split("/"), segments)
        for method in operations
    }
    return ", ".join(sorted(methods)) or named


def _matches(template: list[str], segments: list[str]) -> bool:
    """A path's segments against a documented path's (a `{name}` segment matches any one)."""
    return len(template) == len(segments) and all(
        part == segment or (part.startswith("{") and part.endswith("}") and segment)
        for part, segment in zip(template, segments, strict=True)
    )


# The route dependencies that check an API key.
KEY_CHECKS = (require_api_key, require_api_key_for_metrics, require_admin_key)


async def _unreadable_body(request: Request, message: str) -> JSONResponse:
    """400 for a body that cannot be read, unless the key is missing or wrong: FastAPI decodes
    a JSON body before it runs the route's dependencies, so without this a client without a
    key would learn about its body (400) before it is told about its key (401/403)."""
    route = request.scope.get("route")
    for dependency in getattr(getattr(route, "dependant", None), "dependencies", ()):
        if dependency.call in KEY_CHECKS:
            try:
                await dependency.call(request)
            except ServiceError as refused:
                return await _service_error(request, refused)
    request.state.error = message
    return JSONResponse({"detail": message}, 400)


def _json_problem(problem: dict, document: object) -> str:
    """What json.loads said, where, as its own messages put it ("line 1 column 9 (char 8)")."""
    reason = problem.get("ctx", {}).get("error", "JSON decode error")
    position = problem["loc"][-1]
    if not (isinstance(document, str) and isinstance(position, int)):
        return f"the body is not valid JSON: {reason}"
    line = document.count("\n", 0, position) + 1
    column = position - document.rfind("\n", 0, position)
    return f"the body is not valid JSON: {reason}: line {line} column {column} (char {position})"


def _jsonable(value: object) -> object:
    """Error contexts may hold exceptions or other objects; make them strings."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
