"""What the API dialects other than the native one (LibreTranslate, DeepL) share, written once:
the error envelope, reading a JSON or form body, and the order in which a request is
answered (fields, then key, then the work; every failure in the dialect's own body).

Each dialect declares only what differs: its error field ("error" or "message"), its wording
for an unreadable body, how form fields become values, where its key may be, and how a
ServiceError maps onto its statuses.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException

from service.http.dependencies import header_key
from service.serving.access import ApiKeys
from service.serving.errors import ServiceError


class DialectError(Exception):
    """An answer in a dialect's error body, `{key: message}`, with its status."""

    key: ClassVar[str]

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self.status, self.message, self.headers = status, message, headers
        super().__init__(message)

    def response(self) -> JSONResponse:
        return JSONResponse({self.key: self.message}, self.status, headers=self.headers)


@dataclass(frozen=True)
class BodyWording:
    """A dialect's messages for a body it cannot read (each a 400)."""

    invalid_json: str
    not_an_object: str
    unreadable_form: str  # with "{detail}": Starlette's reason


async def read_body(
    request: Request, error: type[DialectError], wording: BodyWording, empty_json: str
) -> dict[str, Any] | FormData | None:
    """The body as a JSON object, a form, or None for another content type; `empty_json` is
    what an empty JSON body reads as ("{}" or "null")."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            data = json.loads(await request.body() or empty_json.encode())
        # ValueError covers JSONDecodeError, bad UTF-8 and integers past Python's digit limit;
        # RecursionError, JSON nested deeper than the parser's stack.
        except (ValueError, RecursionError):
            raise error(400, wording.invalid_json) from None
        if not isinstance(data, dict):
            raise error(400, wording.not_an_object)
        return data
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        try:
            return await request.form()
        except HTTPException as failure:  # Starlette's 400 for a form it cannot read
            raise error(400, wording.unreadable_form.format(detail=failure.detail)) from None
    return None


@dataclass(frozen=True)
class Dialect:
    error: type[DialectError]
    read_fields: Callable[[Request], Awaitable[dict[str, Any]]]
    # The key a request presents (the headers', or a field of the dialect's own), or None.
    presented_key: Callable[[Request, dict[str, Any]], str | None]
    as_error: Callable[[ServiceError, Request], DialectError]

    async def answer(
        self,
        request: Request,
        keys: ApiKeys,
        respond: Callable[[dict[str, Any]], Awaitable[JSONResponse]],
    ) -> JSONResponse:
        """Read the fields, check the key, respond; every failure in the dialect's body."""
        try:
            try:
                fields = await self.read_fields(request)
            except DialectError:  # a body that cannot be read holds no key: the header's first
                keys.check(header_key(request))
                raise
            keys.check(self.presented_key(request, fields))
            return await respond(fields)
        except DialectError as error:
            request.state.error = error.message
            return error.response()
        except ServiceError as error:
            answer = self.as_error(error, request)
            request.state.error = answer.message
            return answer.response()
