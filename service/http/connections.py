"""What a connection may cost before it has sent a request: uvicorn's HTTP protocol (httptools),
with the limits uvicorn lacks.

uvicorn has no timeout for a connection that sends nothing or sends its headers a byte at a
time, no bound on the size of headers (httptools buffers an unfinished header whole), and its
connection cap (`limit_concurrency`) answers 503 on every route, health checks included.
So one client holding about a thousand idle connections denied service to everyone, and ten
megabytes of unfinished header cost ten megabytes of memory each (docs/reliability.md).
Here, per connection:

* the headers of a request must be complete within `header_timeout` seconds of the connection
  opening, or of the first byte of a keep-alive connection's next request; past it the
  connection closes (with a 408 if the client had started a request);
* headers larger than `max_header_bytes` get 431 and the connection closes;
* at most `max_per_client` connections per client address are served (0: no cap; behind a
  proxy every client has the proxy's address); a request on a connection past the cap gets
  429, and such connections do not count against uvicorn's global cap, so that one client's
  flood does not refuse everyone else;
* health and metrics (`exempt_paths`) are answered whatever the connection count, so that an
  orchestrator's probe is never refused for what other clients do.

The body's own limits (size, total time) are the HTTP middleware's (middleware.py).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

# Why a connection was closed or refused, for nmt_connections_refused_total.
HEADER_TIMEOUT = "header_timeout"
HEADER_TOO_LARGE = "header_too_large"
CLIENT_CAP = "client_cap"


@dataclass
class ConnectionLimits:
    header_timeout: float
    max_header_bytes: int
    max_per_client: int  # 0: no cap
    exempt_paths: frozenset[str]
    error_key: Callable[[str], str] = lambda path: "detail"  # the dialect's error field
    on_refused: Callable[[str], None] = lambda reason: None  # a metric
    # Open connections per client address (one server, one event loop: no lock needed).
    per_client: Counter[str] = field(default_factory=Counter)


def guarded_protocol(limits: ConnectionLimits) -> Callable[..., asyncio.Protocol]:
    """The `http` protocol factory to give uvicorn.Config."""
    return partial(GuardedHttpToolsProtocol, limits=limits)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._awaiting_headers = True  # between two requests, or before the first one
        self._header_bytes = 0  # received since the current request's headers began
        self._header_timer: asyncio.TimerHandle | None = None
        self._counted_as: str | None = None  # the client address counted in per_client
        self._over_client_cap = False
        self._headers_seen = 0  # requests whose headers were complete, on this connection

    # Connection events.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        host = self.client[0] if self.client else None
        if self.limits.max_per_client and host is not None:
            self._over_client_cap = self.limits.per_client[host] >= self.limits.max_per_client
            self.limits.per_client[host] += 1
            self._counted_as = host
            if self._over_client_cap:
                # Not counted against NMT_MAX_CONNECTIONS (uvicorn counts this set): one
                # client's excess must not push everyone else past the global cap.
                self.connections.discard(self)
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._counted_as is not None:
            self.limits.per_client[self._counted_as] -= 1
            if self.limits.per_client[self._counted_as] <= 0:
                del self.limits.per_client[self._counted_as]
            self._counted_as = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():  # refused already: what was still read goes nowhere
            return
        awaiting_before, headers_seen = self._awaiting_headers, self._headers_seen
        if awaiting_before and self._header_timer is None:  # a keep-alive's next request
            self._start_header_timer()
        super().data_received(data)
        # Only a chunk read entirely while waiting for headers counts (not one that ended a
        # request's headers, or began with the last request's body): the unfinished header
        # httptools holds.
        unfinished = awaiting_before and self._headers_seen == headers_seen
        if unfinished and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.max_header_bytes:
                self.limits.on_refused(HEADER_TOO_LARGE)
                self._send_and_close(431, self._too_large_message())

    # Parser callbacks.

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self._awaiting_headers = False
        self._headers_seen += 1
        path = _path_of(self.url)
        exempt = path in self.limits.exempt_paths
        # uvicorn reads these two in its on_headers_complete: health is never refused for the
        # connection count, and a refused request gets its answer instead of the app.
        self.limit_concurrency = None if exempt else self.config.limit_concurrency
        self.app = self.config.loaded_app
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_header_bytes:  # arrived whole, in one read
            self.limits.on_refused(HEADER_TOO_LARGE)
            self.app = _refusal(431, self._too_large_message(), self.limits.error_key(path))
        elif self._past_client_cap() and not exempt:
            self.limits.on_refused(CLIENT_CAP)
            message = (
                f"this client has more than {self.limits.max_per_client} open connections "
                "(NMT_MAX_CONNECTIONS_PER_CLIENT): close some, or reuse them"
            )
            retry = [(b"retry-after", b"1")]
            self.app = _refusal(429, message, self.limits.error_key(path), retry)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_headers, self._header_bytes = True, 0  # the next request's headers

    # Helpers.

    def _past_client_cap(self) -> bool:
        """Opened past the cap, and still past it (earlier connections may have closed)."""
        if self._over_client_cap and self._counted_as is not None:
            still = self.limits.per_client[self._counted_as] > self.limits.max_per_client
            self._over_client_cap = still
            if not still:  # within the cap now: an ordinary connection again
                self.connections.add(self)
        return self._over_client_cap

    def _start_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(
            self.limits.header_timeout, self._header_timed_out
        )

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._awaiting_headers:
            return
        self.limits.on_refused(HEADER_TIMEOUT)
        if self._header_bytes:  # a request had begun: say why it ends
            message = (
                f"the request headers did not arrive within {self.limits.header_timeout:g} s "
                "(NMT_HEADER_TIMEOUT_SECONDS)"
            )
            self._send_and_close(408, message)
        else:
            self.transport.close()

    def _too_large_message(self) -> str:
        return (
            f"request headers are larger than {self.limits.max_header_bytes} bytes "
            "(NMT_MAX_HEADER_BYTES)"
        )

    def _send_and_close(self, status: int, message: str) -> None:
        """An answer written straight to the socket: the request never reached the app."""
        body = json.dumps({"detail": message}).encode()
        head = [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def _path_of(url: bytes) -> str:
    try:
        return httptools.parse_url(url).path.decode("latin-1")
    except httptools.HttpParserInvalidURLError:
        return ""  # uvicorn answers the bad URL itself


def _refusal(
    status: int, message: str, error_key: str, headers: list[tuple[bytes, bytes]] | None = None
) -> Callable[..., Any]:
    """An ASGI app answering `status` and closing the connection (its body is not read)."""
    body = json.dumps({error_key: message}).encode()
    head = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
        (b"connection", b"close"),
    ]

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    return refuse
