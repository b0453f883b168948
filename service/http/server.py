"""`nmt serve`: run the app under uvicorn, with a graceful SIGTERM.

On SIGTERM (or Ctrl-C) the server turns not-ready and refuses new translations with 503,
uvicorn stops accepting connections and waits for the requests in flight (at most
NMT_SHUTDOWN_TIMEOUT_SECONDS), the decoding loops finish their queues, and the process exits 0.
If the models cannot be loaded, it exits 1 with the reason in the log.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn

from service.http.app import create_app
from service.http.connections import ConnectionLimits, guarded_protocol
from service.http.logs import configure_logging
from service.http.middleware import QUIET_ROUTES
from service.serving.settings import Settings

log = logging.getLogger("nmt.server")

SHUTDOWN_MARGIN_SECONDS = 5.0


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app to drain as soon as the signal arrives (uvicorn
    itself only tells the app at the very end, through the lifespan shutdown)."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            log.info("signal %s: finishing admitted requests, then exiting", sig)
            self._on_signal()
        super().handle_exit(sig, frame)


def serve(settings: Settings | None = None) -> int:
    settings = settings or Settings()
    configure_logging(settings.log_level)
    failure: list[str] = []
    server: _Server | None = None

    def load_failed(reason: str) -> None:
        failure.append(reason)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_load_failed=load_failed)
    refused = app.state.metrics.connections_refused
    limits = ConnectionLimits(
        header_timeout=settings.header_timeout_seconds,
        max_header_bytes=settings.max_header_bytes,
        max_per_client=settings.max_connections_per_client,
        exempt_paths=frozenset(QUIET_ROUTES),
        error_key=app.state.error_key,
        on_refused=lambda reason: refused.labels(reason).inc(),
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,  # keep our JSON logging
        access_log=False,  # our middleware writes the access log
        # loop "auto": uvloop (a serving dependency), or asyncio's own where a platform has no
        # wheel for it. http: httptools with the limits on connections uvicorn lacks.
        http=guarded_protocol(limits),  # type: ignore[arg-type]  # a factory, as uvicorn calls it
        # The app answers what is still running at NMT_SHUTDOWN_TIMEOUT_SECONDS with a 503
        # itself (Lifecycle); uvicorn's own limit, which cuts requests off with no answer,
        # comes a little later, as a last resort.
        timeout_graceful_shutdown=settings.shutdown_timeout_seconds + SHUTDOWN_MARGIN_SECONDS,
        limit_concurrency=settings.max_connections,
        timeout_keep_alive=settings.keep_alive_seconds,
        lifespan="on",
    )
    server = _Server(config, on_signal=app.state.service.lifecycle.start_draining)
    # uvicorn raises the captured signal again once it has shut down; by then every admitted
    # request has been answered, so that second delivery must be a no-op (exit status 0), not
    # the default action (death by SIGTERM).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    log.info(
        "starting",
        extra={"host": settings.host, "port": settings.port, "model_dir": str(settings.model_dir)},
    )
    server.run()
    if failure:
        log.error("exiting: %s", failure[0])
        return 1
    return 0


if __name__ == "__main__":  # `python -m service.http.server`: the same as `nmt serve`
    sys.exit(serve())
