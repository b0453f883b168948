"""What route handlers receive through FastAPI's `Depends`: the app's service objects, so that
handlers never reach into `request.app.state` themselves (and tests can override them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.serving.metrics import Metrics
from service.serving.pipeline import TranslationService


def translation_service(request: Request) -> TranslationService:
    return request.app.state.service


def metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def client_disconnected(request: Request) -> None:
    """Returns when the client goes away. The body has been read by then, so the next ASGI
    message can only be the disconnect (or the end of the response, when it is cancelled)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# The annotations handlers declare, e.g. `async def models(service: ServiceDep)`.
ServiceDep = Annotated[TranslationService, Depends(translation_service)]
MetricsDep = Annotated[Metrics, Depends(metrics)]
