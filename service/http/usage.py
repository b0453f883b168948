"""What a request used, counted the same way in every dialect: the facts its access log line
and the request metrics read from `request.state`, the characters a text is billed, and those
translated against NMT_CHARACTER_LIMIT (the pipeline counts them; DeepL's /v2/usage says them).
"""

from __future__ import annotations

from typing import Protocol

from fastapi import Request

from service.serving.requests import TranslationService


class Counts(Protocol):
    """What a pipeline or markup result counts."""

    sentences: int
    input_tokens: int
    output_tokens: int


def account(request: Request, texts: int, counts: Counts) -> None:
    """What the access log line reports of a translation request of `texts` texts."""
    request.state.texts = texts
    request.state.sentences = counts.sentences
    request.state.input_tokens = counts.input_tokens
    request.state.output_tokens = counts.output_tokens


def billed_characters(text: str) -> int:
    """A text's characters as the client sent it. The quota counts what the pipeline was sent:
    the same for plain text, only the sentences' characters for markup (tags aside)."""
    return len(text)


def character_usage(service: TranslationService) -> tuple[int, int | None]:
    """Characters translated since the server started, and NMT_CHARACTER_LIMIT (None: none)."""
    return service.characters_translated, service.settings.character_limit or None
