"""What can go wrong with one translation request, in the service's own words.

The scheduler and the translation pipeline raise these and know nothing of HTTP; the routes map
each to a status code (app.py for the native API, libretranslate.py for the compatible one).
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base class: a request that cannot be served, for a reason the client should hear."""


class NotReady(ServiceError):
    """Models are still loading (or failed to load)."""


class ShuttingDown(ServiceError):
    """The server got SIGTERM: it finishes admitted requests but takes no new ones."""


class UnknownPair(ServiceError):
    def __init__(self, source_lang: str, target_lang: str, supported: list[str]) -> None:
        self.source_lang, self.target_lang, self.supported = source_lang, target_lang, supported
        super().__init__(
            f"no model translates {source_lang!r} to {target_lang!r}; "
            f"supported pairs: {', '.join(supported) or 'none'}"
        )


class InvalidInput(ServiceError):
    """Input that passed the request schema but not a model-level limit (tokens per sentence).

    `location` follows pydantic's error locations, e.g. ("body", "text", 2).
    """

    def __init__(self, location: tuple[str | int, ...], message: str, kind: str) -> None:
        self.location, self.message, self.kind = location, message, kind
        super().__init__(message)


class QueueFull(ServiceError):
    def __init__(self, model: str, queued: int, limit: int, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"model {model} has {queued} sentences waiting (limit {limit}, "
            "NMT_MAX_QUEUE_SENTENCES): retry later"
        )


class DeadlineExceeded(ServiceError):
    def __init__(self, timeout: float) -> None:
        super().__init__(
            f"translation did not finish within {timeout:g} s (NMT_REQUEST_TIMEOUT_SECONDS)"
        )


class ClientGone(ServiceError):
    """The client disconnected; its queued work was dropped. Nobody reads this answer."""


class TranslationFailed(ServiceError):
    """The engine failed on this input alone (the other items of its batch were retried)."""

    def __init__(self, text_index: int, reason: str) -> None:
        self.text_index = text_index
        super().__init__(f"the engine could not translate text[{text_index}]: {reason}")
