"""What route handlers receive through FastAPI's `Depends`: the app's service objects, so that
handlers never reach into `request.app.state` themselves (and tests can override them).

Every dependency is `async def`, although none awaits: FastAPI runs a plain `def` dependency in
its thread pool, and for a /v1/translate that was two thread hand-offs per request on the event
loop's critical path (about a tenth of its time under load, each hand-off also trading the GIL
with the engine's thread)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.serving.access import ApiKeys, key_from_headers
from service.serving.errors import AdminKeyRequired
from service.serving.metrics import Metrics
from service.serving.requests import TranslationService
from service.store import Store


async def translation_service(request: Request) -> TranslationService:
    return request.app.state.service


async def metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_store(request: Request) -> Store:
    """The app's store (opened by the lifespan before the first request). Its methods are
    synchronous and wait on the database: run them on its threads (`store.threads.run`), never
    on the event loop itself nor in the thread pool that translations use."""
    return request.app.state.store


async def api_keys(request: Request) -> ApiKeys:
    return request.app.state.api_keys


def header_key(request: Request) -> str | None:
    """The API key a request carries in its headers, if any (every dialect accepts these)."""
    return key_from_headers(request.headers.get("authorization"), request.headers.get("x-api-key"))


async def require_api_key(request: Request) -> None:
    """A route dependency: the request carries a valid key, or NMT_API_KEYS is empty."""
    request.app.state.api_keys.check(header_key(request))


async def require_admin_key(request: Request) -> None:
    """A route dependency of model administration: an admin key (NMT_ADMIN_KEYS) when there
    are any; with none, open only while the API is open too (no NMT_API_KEYS)."""
    state = request.app.state
    if state.admin_keys.enabled:
        state.admin_keys.check(header_key(request))
    elif state.api_keys.enabled:
        raise AdminKeyRequired(
            "model administration needs an admin key, and this server has none: set "
            "NMT_ADMIN_KEYS (API keys are not admin keys)"
        )


async def require_api_key_for_metrics(request: Request) -> None:
    if request.app.state.settings.metrics_require_key:
        await require_api_key(request)


async def client_disconnected(request: Request) -> None:
    """Returns when the client goes away. The body has been read by then, so the next ASGI
    message can only be the disconnect (or the end of the response, when it is cancelled)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# The annotations handlers declare, e.g. `async def models(service: ServiceDep)`.
ServiceDep = Annotated[TranslationService, Depends(translation_service)]
MetricsDep = Annotated[Metrics, Depends(metrics)]
ApiKeysDep = Annotated[ApiKeys, Depends(api_keys)]
StoreDep = Annotated[Store, Depends(get_store)]
