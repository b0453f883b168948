"""The limits a request can pass, each named by its setting, and the one check of those the
HTTP layer owns (texts per request, characters per text).

The others are checked where the work is counted: the body size by the middleware, before the
body is read; sentences per request, tokens per sentence, alignment weights and the character
quota by the pipeline (service/serving/). Every one of them ends in a ServiceError whose
`setting` names its limit, and each dialect (dialect.py) declares its status for every limit
in one table: no dialect reads a message to tell one from another.
"""

from __future__ import annotations

from enum import StrEnum

from service.serving.errors import ServiceError, TextTooLong, TooManyTexts
from service.serving.settings import Settings


class Limit(StrEnum):
    """A limit, by the Settings field that configures it."""

    TEXTS = "max_texts_per_request"
    CHARACTERS = "max_chars_per_text"
    SENTENCES = "max_sentences_per_request"
    TOKENS = "max_tokens_per_sentence"
    ALIGNMENT = "max_alignment_weights"
    BODY = "max_body_bytes"
    QUOTA = "character_limit"


def limit_of(error: ServiceError) -> Limit | None:
    """The limit an error says the request passed; None for an error that is no limit."""
    return None if error.setting is None else Limit(error.setting)


def check_texts(text: str | list[str], settings: Settings) -> None:
    """The request's texts within NMT_MAX_TEXTS_PER_REQUEST and NMT_MAX_CHARS_PER_TEXT, or
    TooManyTexts / TextTooLong for the first one past; `text` as the client sent it (a lone
    string is named "text", a list's items "text[i]")."""
    texts = [text] if isinstance(text, str) else text
    if len(texts) > settings.max_texts_per_request:
        raise TooManyTexts(len(texts), settings.max_texts_per_request)
    for index, item in enumerate(texts):
        if len(item) > settings.max_chars_per_text:
            where = None if isinstance(text, str) else index
            raise TextTooLong(where, len(item), settings.max_chars_per_text)
