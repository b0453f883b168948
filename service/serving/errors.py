"""What can go wrong with one translation request, in the service's own words.

Each error owns its meaning: it declares the HTTP status it stands for (`status`) and any
headers a client needs (`headers`), so that no mapping table in the HTTP layer can forget one.
The decoding loop, its queue, request handling and the HTTP layer's own checks (texts, the body)
raise these and know nothing of HTTP beyond those numbers; each API dialect (service/http/)
shapes the body its clients expect from them, and may give a limit a status of its own.

`status` < 500: the client's doing (fix the request, or retry later for 429/503/504).
`status` >= 500 for `InternalError`: a fault of the server, reported with the request id.
`setting`: for an error that says a request passed a configured limit, the Settings field of
that limit, so that each dialect can give every limit its own status without reading a message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from service.serving.admission import Forecast

# nginx's status for "the client went away before the answer"; nobody reads it but the logs.
CLIENT_CLOSED_REQUEST = 499


class ServiceError(Exception):
    """Base class: a request that cannot be served, for a reason the client should hear."""

    status: ClassVar[int] = 500
    setting: ClassVar[str | None] = None  # the limit passed (a Settings field), if any

    def headers(self) -> dict[str, str]:
        return {}


class NotReady(ServiceError):
    """Models are still loading (or failed to load)."""

    status = 503

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class ShuttingDown(ServiceError):
    """The server got SIGTERM: it finishes admitted requests but takes no new ones, or it ran
    out of NMT_SHUTDOWN_TIMEOUT_SECONDS before this request finished."""

    status = 503


class UnknownPair(ServiceError):
    status = 404

    def __init__(self, source_lang: str, target_lang: str, supported: list[str]) -> None:
        self.source_lang, self.target_lang, self.supported = source_lang, target_lang, supported
        listed = ", ".join(supported) or "none"
        if len(supported) > 50:  # a multilingual model's thousands
            listed = f"{len(supported)} of them (GET /languages lists them)"
        super().__init__(
            f"no model translates {source_lang!r} to {target_lang!r}; supported pairs: {listed}"
        )


class ModelUnknown(ServiceError):
    """No model of that name is loaded or in the repository (NMT_MODEL_DIR)."""

    status = 404

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(f"no model named {name!r}; models: {', '.join(known) or 'none'}")


class ModelVersionUnknown(ServiceError):
    """A request or a load named a version the model does not have (loaded, or on disk)."""

    status = 404

    def __init__(self, name: str, version: int, known: list[int]) -> None:
        self.name, self.version = name, version
        listed = ", ".join(map(str, known)) or "none"
        super().__init__(f"model {name!r} has no version {version}; its versions: {listed}")


class ModelLoadFailed(ServiceError):
    """An explicit load could not load (or warm up) what it was asked to; what served before
    still serves. 409: the request was fine, the repository's state is not."""

    status = 409

    def __init__(
        self, name: str, reasons: dict[int | None, str], serving: str, note: str = ""
    ) -> None:
        """`reasons`: by version (None: the unversioned bundle), why it failed; `serving`: what
        serves the model now, in words ("version 2", "nothing"); `note`: why, when no version
        was tried at all."""
        self.name, self.reasons, self.serving = name, reasons, serving
        failures = note or "; ".join(
            f"{'the bundle' if v is None else f'version {v}'}: {why}" for v, why in reasons.items()
        )
        super().__init__(f"model {name!r} did not load ({failures}); {serving} serves it now")


class ModelUnavailable(ServiceError):
    """The model was unloaded while the request waited for it, and nothing replaced it."""

    status = 503

    def __init__(self, name: str) -> None:
        super().__init__(f"model {name!r} was unloaded: no version of it serves now")

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class AdminKeyRequired(ServiceError):
    """Model administration needs an admin key (NMT_ADMIN_KEYS), and, while API keys are on,
    is refused outright when no admin key is configured."""

    status = 403


class GlossaryUnknown(ServiceError):
    """No glossary of that id, or another API key's (never told apart)."""

    status = 404


class DetectedLanguageNotServed(ServiceError):
    """Language detection named a language that no model translates into the target."""

    status = 422

    def __init__(self, detected: str, confidence: float, target: str, sources: list[str]) -> None:
        self.detected = detected
        super().__init__(
            f"the text looks like {detected!r} (confidence {confidence:g}%), and no model "
            f"translates {detected!r} into {target!r}; models into {target!r} translate from: "
            f"{', '.join(sources) or 'none'}"
        )


class InvalidInput(ServiceError):
    """Input that passed the request schema but not a later check (texts and characters per
    request, Unicode, tokens per sentence, a parameter the model cannot honour).

    Its fields, not its message, say what is wrong: `kind` (pydantic's error `type`), `field`
    (the request field), `text_index` (which of the request's texts; None for the field as a
    whole) and `reason` (what is wrong, said of that text or field). The message is built from
    them, so that a layer which sends the pipeline other texts than the client's (markup sends
    one text per sentence) names the client's text by building a new error from the fields,
    never by parsing a message.
    """

    status = 422

    def __init__(
        self, kind: str, reason: str, *, text_index: int | None = None, field: str = "text"
    ) -> None:
        self.kind, self.reason, self.text_index, self.field = kind, reason, text_index, field
        super().__init__(self.message)

    @property
    def subject(self) -> str:
        """What the reason is said of: `text[2]`, or the field's name."""
        return self.field if self.text_index is None else f"{self.field}[{self.text_index}]"

    @property
    def message(self) -> str:
        return f"{self.subject} {self.reason}"

    @property
    def location(self) -> tuple[str | int, ...]:
        """pydantic's error location, e.g. ("body", "text", 2)."""
        if self.text_index is None:
            return ("body", self.field)
        return ("body", self.field, self.text_index)

    @property
    def context(self) -> dict[str, object] | None:
        """pydantic's error context (`ctx`): the numbers the message is made of, if any."""
        return None


class TooManyTexts(InvalidInput):
    """More texts in one request than NMT_MAX_TEXTS_PER_REQUEST."""

    setting = "max_texts_per_request"

    def __init__(self, count: int, limit: int) -> None:
        self.count, self.limit = count, limit
        super().__init__(
            "too_many_texts",
            f"has {count} texts; the limit is {limit} texts per request "
            "(NMT_MAX_TEXTS_PER_REQUEST)",
        )

    @property
    def context(self) -> dict[str, object]:
        return {"count": self.count, "limit": self.limit}


class TextTooLong(InvalidInput):
    """A text of more characters than NMT_MAX_CHARS_PER_TEXT. `text_index` is None where the
    request's text is a lone string (the message then says "text", not "text[0]")."""

    setting = "max_chars_per_text"

    def __init__(self, text_index: int | None, characters: int, limit: int) -> None:
        self.characters, self.limit = characters, limit
        super().__init__(
            "text_too_long",
            f"has {characters} characters; the limit is {limit} characters per text "
            "(NMT_MAX_CHARS_PER_TEXT)",
            text_index=text_index,
        )

    @property
    def location(self) -> tuple[str | int, ...]:
        """The field as a whole (the message names the text), as the request schema said it
        when it checked this limit."""
        return ("body", self.field)

    @property
    def context(self) -> dict[str, object]:
        return {"where": self.subject, "count": self.characters, "limit": self.limit}


class SentenceTooLong(InvalidInput):
    """A sentence of more tokens than NMT_MAX_TOKENS_PER_SENTENCE. `sentence` is its number in
    the text (from 1); None where the pipeline's sentences are not the client's (markup sends
    each sentence as a text of its own), and the message then names the text alone."""

    setting = "max_tokens_per_sentence"

    def __init__(self, text_index: int, tokens: int, limit: int, sentence: int | None) -> None:
        self.tokens, self.limit, self.sentence = tokens, limit, sentence
        # said of the sentence ("text[1], sentence 2, has ..."), or of the text
        counted = f"has {tokens}" if sentence is not None else f"holds a sentence of {tokens}"
        super().__init__(
            "too_many_tokens",
            f"{counted} tokens; the limit is {limit} tokens per sentence "
            "(NMT_MAX_TOKENS_PER_SENTENCE): split it into shorter sentences",
            text_index=text_index,
        )

    @property
    def message(self) -> str:
        if self.sentence is None:
            return super().message
        return f"{self.subject}, sentence {self.sentence}, {self.reason}"


class RequestTooLarge(ServiceError):
    """More work in one request than one request may hold (sentences after splitting)."""

    status = 413
    setting = "max_sentences_per_request"

    def __init__(self, sentences: int, limit: int, at_least: bool = False) -> None:
        """`at_least`: counting stopped once past the limit (markup not parsed to its end)."""
        self.sentences, self.limit, self.at_least = sentences, limit, at_least
        counted = f"at least {sentences}" if at_least else str(sentences)
        super().__init__(
            f"the request has {counted} sentences; the limit is {limit} sentences per request "
            "(NMT_MAX_SENTENCES_PER_REQUEST): send them in several requests"
        )


class AlignmentTooLarge(ServiceError):
    """An answer that would carry more attention weights than one answer may
    (NMT_MAX_ALIGNMENT_WEIGHTS): counted after decoding, refused before its lists are built,
    so that a small request cannot make the server build (and hold) a huge answer."""

    status = 413
    setting = "max_alignment_weights"

    def __init__(self, weights: int, limit: int) -> None:
        self.weights, self.limit = weights, limit
        super().__init__(
            f"the alignment of this answer has {weights} attention weights; the limit is "
            f"{limit} per answer (NMT_MAX_ALIGNMENT_WEIGHTS): ask for fewer texts, for "
            "alignment_heads 'mean' instead of 'all', or for no alignment"
        )


class BodyTooLarge(ServiceError):
    """A request body of more bytes than NMT_MAX_BODY_BYTES: refused by the HTTP middleware
    before the rest is read (and so before any route or dialect reads a field)."""

    status = 413
    setting = "max_body_bytes"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request body is larger than {limit} bytes (NMT_MAX_BODY_BYTES)")


class MissingApiKey(ServiceError):
    status = 401

    def __init__(self) -> None:
        super().__init__(
            "an API key is required: send `Authorization: Bearer KEY` (or `X-API-Key: KEY`)"
        )

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class InvalidApiKey(ServiceError):
    status = 403

    def __init__(self) -> None:
        super().__init__("the API key is not valid")


class QueueFull(ServiceError):
    status = 429

    def __init__(self, model: str, queued: int, limit: int, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"model {model} has {queued} sentences waiting (limit {limit}, "
            "NMT_MAX_QUEUE_SENTENCES): retry later"
        )

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class Backlogged(ServiceError):
    """The queue ahead of this request would keep it past its deadline (admission.py): refused
    at once, with the time after which the same request would fit."""

    status = 429

    def __init__(
        self, model: str, ahead: int, forecast: Forecast, timeout: float, retry_after: int
    ) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"model {model} has {ahead} sentences waiting, taken at about "
            f"{forecast.rate:.0f} sentences/s: this request would finish in about "
            f"{forecast.wait + forecast.service:.1f} s, past its {timeout:g} s deadline "
            f"(NMT_REQUEST_TIMEOUT_SECONDS): retry in {retry_after} s"
        )

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class QuotaExceeded(ServiceError):
    """The configured character quota (NMT_CHARACTER_LIMIT) is used up. 429 in the native
    and LibreTranslate APIs; DeepL's API says 456, as DeepL does."""

    status = 429
    setting = "character_limit"

    def __init__(self, used: int, limit: int) -> None:
        super().__init__(
            f"the character quota is used up: {used} of {limit} characters translated "
            "(NMT_CHARACTER_LIMIT)"
        )


class DeadlineExceeded(ServiceError):
    status = 504

    def __init__(self, timeout: float) -> None:
        super().__init__(
            f"translation did not finish within {timeout:g} s (NMT_REQUEST_TIMEOUT_SECONDS)"
        )


class ClientGone(ServiceError):
    """The client disconnected; its queued work was dropped. Nobody reads this answer."""

    status = CLIENT_CLOSED_REQUEST


class InternalError(ServiceError):
    """The server failed, not the request: the engine raised on this input even alone in its
    batch (the other requests of the batch were retried and answered), or a bug. A 500 that
    carries the request id, so that the log line can be found."""

    status = 500


class TranslationFailed(InternalError):
    """The engine failed on one text of this request alone."""

    def __init__(self, text_index: int, reason: str) -> None:
        self.text_index, self.reason = text_index, reason
        super().__init__(f"the engine could not translate text[{text_index}]: {reason}")
