"""Optional API keys (NMT_API_KEYS). Off when none is configured.

A key is compared with every configured key in constant time (hmac.compare_digest, and no early
exit), so that response times do not tell an attacker how much of a guess was right. Keys are
never logged: the access log records no header and no body.
"""

from __future__ import annotations

import hmac

from service.serving.errors import InvalidApiKey, MissingApiKey


class ApiKeys:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [key.encode() for key in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, presented: str | None) -> None:
        """Return when access is granted; raise MissingApiKey or InvalidApiKey otherwise."""
        if not self._keys:
            return
        if not presented:
            raise MissingApiKey()
        candidate = presented.encode("utf-8", "surrogateescape")
        matches = [hmac.compare_digest(candidate, key) for key in self._keys]
        if not any(matches):
            raise InvalidApiKey()


def key_from_headers(authorization: str | None, x_api_key: str | None) -> str | None:
    """`Authorization: Bearer KEY` (or DeepL's `DeepL-Auth-Key KEY`), else `X-API-Key: KEY`."""
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() in ("bearer", "deepl-auth-key") and value.strip():
            return value.strip()
    return x_api_key.strip() if x_api_key else None
