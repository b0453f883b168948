"""What every HTTP request goes through, around the routes: its request id, the body size and
time limits, admission (a bound on requests in flight, decided once the body is read, so that
a client sending its body slowly holds a connection but no slot), security headers, the
request metrics, the JSON access log line, and the catch-all for faults.

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware) so that the route still sees the
client disconnect, which is how a request whose client went away gets its queued work dropped.
Routes add what they learn (model, sentences, tokens) to `request.state`; the log line and the
metrics read it from there when the answer is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.serving.errors import CLIENT_CLOSED_REQUEST, BodyTooLarge
from service.serving.metrics import Metrics

if TYPE_CHECKING:  # the dialects' routes import this module
    from service.http.dialect import Dialect

access_log = logging.getLogger("nmt.access")
log = logging.getLogger("nmt.http")

REQUEST_ID_HEADER = "x-request-id"
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
# Probes and scrapes hit these every few seconds; log them only when they fail.
QUIET_ROUTES = {"/healthz", "/readyz", "/metrics"}
# Answered whatever the load: cheap, and what tells an orchestrator the process is alive.
NEVER_REFUSED = QUIET_ROUTES | {"/", "/docs", "/redoc", "/openapi.json"}
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]


def never_refused(scope: Scope) -> bool:
    """Health, metrics and pages, and CORS preflights (answered by the CORS middleware: they
    cost nothing and reach no route)."""
    if scope.get("path") in NEVER_REFUSED:
        return True
    return scope.get("method") == "OPTIONS" and any(
        name == b"access-control-request-method" for name, _ in scope.get("headers", [])
    )


def admitted_at(request: Any) -> float | None:
    """When the middleware admitted this request (time.monotonic()), if it went through it."""
    return getattr(request.state, "admitted_at", None)


def request_id_from(scope: Scope) -> str:
    """The client's X-Request-ID when it is a sane token, else a fresh one."""
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            candidate = value.decode("latin-1").strip()
            if _VALID_REQUEST_ID.match(candidate):
                return candidate
    return uuid.uuid4().hex


class RequestContextMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        max_body_bytes: int,
        dialect_of: Callable[[str], Dialect],
        access_log_enabled: bool = True,
        max_in_flight: int = 256,
        body_timeout: float = 10.0,
        retry_after: int = 1,
        cors_origins: list[str] | None = None,
        larger_bodies: Mapping[str, int] | None = None,
        uploads: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        # The CORS middleware runs inside this one (so that its preflights get the request id
        # and the security headers): the answers this one gives itself need its headers too,
        # or a browser's script could not read a 429's Retry-After.
        self.cors_origins = set(cors_origins or [])
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        # Paths (by prefix) whose bodies may be larger: glossary uploads carry up to
        # NMT_MAX_GLOSSARY_BYTES of entries.
        self.larger_bodies = dict(larger_bodies or {})
        # Paths (exactly: not their sub-paths, such as a document's status) whose bodies may
        # carry a file of up to NMT_MAX_DOCUMENT_BYTES.
        self.uploads = dict(uploads or {})
        self.max_in_flight = max_in_flight
        self.body_timeout = body_timeout
        self.retry_after = retry_after
        self.in_flight = 0  # requests past admission, not yet answered (one event loop)
        self.access_log_enabled = access_log_enabled
        # The dialect of a path: its error field ("detail", "error", "message") and the status
        # it gives a body past the limit.
        self.dialect_of = dialect_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = request_id_from(scope)
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = request_id
        status = CLIENT_CLOSED_REQUEST  # unless a response starts
        started_response = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started_response
            if message["type"] == "http.response.start":
                status, started_response = message["status"], True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                headers.extend(SECURITY_HEADERS)
                message = {**message, "headers": headers}
            await send(message)

        admitted = False
        # When: a request admitted before SIGTERM is finished (see Lifecycle.check_accepting).
        state["admitted_at"] = time.monotonic()
        self.metrics.requests_in_progress.inc()
        try:
            limit = self.body_limit(scope.get("path", ""))
            replay = await self._read_body(scope, receive, limit)
            if replay is None:
                await self._too_large(scope, send_with_id, limit)
            elif replay == "timeout":
                state["error"] = "body timeout"
                await self._send_error(
                    scope,
                    send_with_id,
                    408,
                    f"the body did not arrive within {self.body_timeout:g} s "
                    "(NMT_BODY_TIMEOUT_SECONDS)",
                    close=True,
                )
            elif replay == "disconnected":  # nobody to answer: a 499 in the metrics and log
                state["error"] = "the client left while sending its body"
            elif not (never_refused(scope) or self.in_flight < self.max_in_flight):
                state["error"] = "overloaded"
                await self._overloaded(scope, send_with_id)
            else:
                admitted = True
                self.in_flight += 1
                await self.app(scope, replay, send_with_id)
        except Exception:
            # A net, not the fix: every fault a client can trigger is handled where it arises.
            # Answering here (rather than re-raising to uvicorn, which drops the connection)
            # keeps a pooled keep-alive connection usable for the client's next request.
            log.exception("unhandled error", extra={"request_id": request_id})
            status = 500
            if started_response:  # too late for a clean answer: let the server close it
                raise
            state["error"] = "internal server error"
            await self._internal_error(scope, request_id, send_with_id)
        finally:
            self.in_flight -= admitted
            self.metrics.requests_in_progress.dec()
            seconds = time.perf_counter() - started
            route = scope["route"].path if "route" in scope else "unmatched"
            model = state.get("model", ("", ""))  # (name, version): LoadedModel.labels
            self.metrics.observe_request(route, model, status, seconds)
            if self.access_log_enabled and (status != 200 or route not in QUIET_ROUTES):
                self._log(scope, state, route, status, seconds)

    def body_limit(self, path: str) -> int:
        """The largest body a request to `path` may send."""
        if path in self.uploads:
            return max(self.uploads[path], self.max_body_bytes)
        for prefix, limit in self.larger_bodies.items():
            if path == prefix or path.startswith(prefix + "/"):
                return max(limit, self.max_body_bytes)
        return self.max_body_bytes

    async def _read_body(self, scope: Scope, receive: Receive, limit: int) -> Receive | str | None:
        """Read the whole body up front, refusing it past the limit (None) or when it has not
        all arrived within the body timeout ("timeout": one deadline for the whole body, not
        per pause, so a byte every few seconds does not hold the connection for ever), and
        give the app a `receive` that replays it and then passes through (to report the
        disconnect). "disconnected": the client left before its body was whole."""
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return None
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.body_timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                return "timeout"
            if message["type"] != "http.request":  # disconnected while sending
                return "disconnected"
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                return None
            chunks.append(body)
            if not message.get("more_body", False):
                break
        pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks)}]

        async def replay() -> Message:
            if pending:
                return pending.pop(0)
            return await receive()

        return replay

    async def _too_large(self, scope: Scope, send: Send, limit: int) -> None:
        error = BodyTooLarge(limit)
        status = self.dialect_of(scope.get("path", "")).status_of(error)
        # The rest of the body is unread: the connection cannot carry another request.
        await self._send_error(scope, send, status, str(error), close=True)

    async def _overloaded(self, scope: Scope, send: Send) -> None:
        message = (
            f"the server is handling {self.max_in_flight} requests (NMT_MAX_REQUESTS_IN_FLIGHT): "
            "retry later"
        )
        retry = [(b"retry-after", str(self.retry_after).encode())]
        # The body has been read: the connection can carry the client's next request.
        await self._send_error(scope, send, 429, message, close=False, headers=retry)

    async def _internal_error(self, scope: Scope, request_id: str, send: Send) -> None:
        message = f"internal server error (request id {request_id}); it is logged"
        await self._send_error(scope, send, 500, message, close=False)

    async def _send_error(
        self,
        scope: Scope,
        send: Send,
        status: int,
        message: str,
        close: bool,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        key = self.dialect_of(scope.get("path", "")).error.key
        body = json.dumps({key: message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ]
        if close:
            headers.append((b"connection", b"close"))
        headers += self._cors_headers(scope)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _cors_headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        """What Starlette's CORSMiddleware adds to a simple request's answer from an allowed
        origin (with the same exposed headers)."""
        origin = next((v for n, v in scope.get("headers", []) if n == b"origin"), None)
        if origin is None or not self.cors_origins:
            return []
        if "*" in self.cors_origins:
            allowed = b"*"
        elif origin.decode("latin-1") in self.cors_origins:
            allowed = origin
        else:
            return []
        return [
            (b"access-control-allow-origin", allowed),
            (b"access-control-expose-headers", b"X-Request-ID, Retry-After"),
            (b"vary", b"Origin"),
        ]

    def _log(
        self, scope: Scope, state: dict[str, Any], route: str, status: int, seconds: float
    ) -> None:
        client = scope.get("client")
        fields = {
            "request_id": state["request_id"],
            "method": scope.get("method"),
            "path": scope.get("path"),
            "route": route,
            "status": status,
            "latency_ms": round(seconds * 1000, 2),
            "client": f"{client[0]}:{client[1]}" if client else None,
        }
        if "model" in state:
            fields["model"], version = state["model"]
            fields["model_version"] = int(version) if version else None
        for key in ("texts", "sentences", "input_tokens", "output_tokens", "error"):
            if key in state:
                fields[key] = state[key]
        access_log.info("request", extra=fields)
