"""Model control, as Triton's explicit mode: list the models and their versions, load a model
again from the repository (a new version, or an older one: a rollback), unload it, and ask
whether one model is ready. Loading and unloading are behind admin keys (NMT_ADMIN_KEYS); the
work is the registry's (service/serving/registry.py), run off the event loop: a load takes
seconds, and requests keep being served by the version in place meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from service.http.dependencies import ServiceDep, require_admin_key, require_api_key
from service.http.routes import ERROR_RESPONSES
from service.http.schemas import ModelInfo, ModelLoadRequest, ModelReady, ModelsResponse
from service.serving.requests import TranslationService

ADMIN = [Depends(require_admin_key)]
# Loads and unloads take seconds and wait for each other (a model's lock): they run on threads
# of their own, so that a burst of them never holds the default pool's threads, which prepare
# translations and read documents (16 loads at once held a document's status poll 3.5 s).
MODEL_CONTROL_THREADS = ThreadPoolExecutor(2, thread_name_prefix="nmt-model-control")
ADMIN_ERRORS: dict[int | str, dict] = {
    401: {**ERROR_RESPONSES[401], "description": "no admin key (when NMT_ADMIN_KEYS is set)"},
    403: {
        **ERROR_RESPONSES[403],
        "description": "an admin key that is not valid, or API keys are on and NMT_ADMIN_KEYS "
        "is empty",
    },
    404: {**ERROR_RESPONSES[404], "description": "no such model, or no such version of it"},
    503: ERROR_RESPONSES[503],
}


def build_router() -> APIRouter:
    router = APIRouter(tags=["models"])

    @router.get(
        "/v1/models",
        response_model=ModelsResponse,
        response_model_exclude_none=True,
        dependencies=[Depends(require_api_key)],
        responses={code: ERROR_RESPONSES[code] for code in (401, 403)},
        summary="The models, the version of each that serves, and every version's state",
    )
    async def models(service: ServiceDep) -> ModelsResponse:
        return ModelsResponse(models=[ModelInfo(**m) for m in service.registry.describe()])

    @router.get(
        "/v1/models/{name}/ready",
        response_model=ModelReady,
        dependencies=[Depends(require_api_key)],
        responses={
            404: ADMIN_ERRORS[404],
            503: {"model": ModelReady, "description": "no version of it is ready"},
        },
        summary="Whether a version of this model serves (200) or none does (503)",
    )
    async def ready(name: str, service: ServiceDep) -> JSONResponse:
        serving = service.registry.serving(name)  # ModelUnknown: 404
        if serving is not None:
            answer = ModelReady(name=name, version=serving.version, state="ready", ready=True)
            return JSONResponse(answer.model_dump(), 200)
        states = {v.state for v in service.registry.versions() if v.name == name}
        state = next((s for s in ("loading", "unloading", "failed") if s in states), "unloaded")
        answer = ModelReady(name=name, version=None, state=state, ready=False)
        return JSONResponse(answer.model_dump(), 503, headers={"Retry-After": "1"})

    @router.post(
        "/v1/models/{name}/load",
        response_model=ModelInfo,
        response_model_exclude_none=True,
        dependencies=ADMIN,
        responses={
            **ADMIN_ERRORS,
            400: ERROR_RESPONSES[400],
            413: {**ERROR_RESPONSES[413], "description": "a body larger than NMT_MAX_BODY_BYTES"},
            409: {
                **ERROR_RESPONSES[404],
                "description": "a version did not load or warm up (the reason is given); "
                "what served before serves on",
            },
        },
        summary="Load a model again from the repository; switch to it once warm",
    )
    async def load(
        name: str, service: ServiceDep, body: ModelLoadRequest | None = None
    ) -> ModelInfo:
        """Reads the model's folder again and loads the version(s) the version policy selects
        (or `version`), beside the one serving; once warm, new requests go to it, requests
        already admitted finish on the old version, which is then unloaded. Answers when the
        switch is done."""
        service.lifecycle.check_accepting()
        version = body.version if body is not None else None
        await _in_model_control(service.registry.load, name, version)
        return _described(service, name)

    @router.post(
        "/v1/models/{name}/unload",
        response_model=ModelInfo,
        response_model_exclude_none=True,
        dependencies=ADMIN,
        responses=ADMIN_ERRORS,
        summary="Stop serving a model; requests holding it finish first",
    )
    async def unload(name: str, service: ServiceDep) -> ModelInfo:
        await _in_model_control(service.registry.unload, name)
        return _described(service, name)

    return router


async def _in_model_control(work: Callable[..., object], *args: object) -> None:
    await asyncio.get_running_loop().run_in_executor(MODEL_CONTROL_THREADS, work, *args)


def _described(service: TranslationService, name: str) -> ModelInfo:
    """The model as /v1/models lists it; unloaded when the registry holds none of it (an
    unload that came in while this call loaded it, or the one this call made)."""
    for model in service.registry.describe():
        if model["name"] == name:
            return ModelInfo(**model)
    return ModelInfo(name=name, state="unloaded")
