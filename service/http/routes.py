"""The native routes: thin. Each one reads its input, asks the TranslationService, and shapes
the answer; failures are ServiceErrors that app.py turns into status codes.

No `from __future__ import annotations` here: FastAPI must see the request model class itself
in the route's signature, and that class is made at runtime from the settings.
"""

from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

from service.http.dependencies import MetricsDep, ServiceDep, client_disconnected
from service.http.schemas import (
    ModelInfo,
    ModelsResponse,
    Problem,
    TranslateResponse,
    translate_request_model,
)
from service.serving.settings import Settings

PAGE = Path(__file__).parent / "static" / "index.html"

ERROR_RESPONSES: dict[int | str, dict] = {
    404: {"model": Problem, "description": "no model for this language pair (lists them)"},
    413: {"model": Problem, "description": "body larger than NMT_MAX_BODY_BYTES"},
    422: {"description": "invalid input: the message names the field and the limit"},
    429: {"model": Problem, "description": "queue full: retry after Retry-After seconds"},
    503: {"model": Problem, "description": "models loading, or shutting down"},
    504: {"model": Problem, "description": "not done within NMT_REQUEST_TIMEOUT_SECONDS"},
}


def build_router(settings: Settings) -> APIRouter:
    router = APIRouter()
    TranslateRequest = translate_request_model(settings)  # a class, made for these limits

    @router.post(
        "/v1/translate",
        response_model=TranslateResponse,
        response_model_exclude_none=True,
        responses=ERROR_RESPONSES,
        tags=["translate"],
        summary="Translate one text or a list of texts",
    )
    async def translate(
        body: TranslateRequest,  # type: ignore[valid-type]
        request: Request,
        service: ServiceDep,
    ) -> TranslateResponse:
        model = service.model_for(body.source_lang, body.target_lang)
        request.state.model = model.name
        result = await service.translate(
            model, body.texts, body.search_options(), lambda: client_disconnected(request)
        )
        request.state.texts = len(result.texts)
        request.state.sentences = result.sentences
        request.state.input_tokens = result.input_tokens
        request.state.output_tokens = result.output_tokens
        return TranslateResponse.from_result(result, body)

    @router.get("/v1/models", response_model=ModelsResponse, tags=["models"])
    async def models(service: ServiceDep) -> ModelsResponse:
        return ModelsResponse(models=[ModelInfo(**m.describe()) for m in service.registry.models])

    @router.get("/healthz", tags=["health"], summary="alive (200) unless loading failed (503)")
    async def healthz(service: ServiceDep) -> JSONResponse:
        lifecycle = service.lifecycle
        status = 200 if lifecycle.alive else 503
        return JSONResponse({"status": lifecycle.phase, "detail": lifecycle.reason}, status)

    @router.get(
        "/readyz", tags=["health"], summary="ready (200) when every model is loaded and warm"
    )
    async def readyz(service: ServiceDep) -> JSONResponse:
        lifecycle = service.lifecycle
        if not lifecycle.ready:
            return JSONResponse({"status": lifecycle.phase, "detail": lifecycle.reason}, 503)
        return JSONResponse({"status": "ready", "models": service.registry.pairs})

    @router.get("/metrics", tags=["health"], summary="Prometheus metrics")
    async def metrics(metrics: MetricsDep) -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @router.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    return router
