"""HTTP hardening (issue 9, defects 3, 4, 7 and 8; issue 31): admission once the body is read,
body timeouts, security headers, API keys in each dialect, a cap on sentences per request, and
OpenAPI pages that work offline."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from service.http.app import create_app, dialect_of
from service.http.middleware import RequestContextMiddleware
from service.serving.metrics import Metrics
from service.serving.settings import Settings
from tests.http.in_process import start

KEYS = "k-alpha,k-beta"


class HeldApp:
    """A tiny ASGI app (no model) that answers 200 once the test lets it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        if scope["path"] == "/hold":
            self.entered.set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def wrapped(app, **options) -> RequestContextMiddleware:
    return RequestContextMiddleware(
        app, Metrics(), max_body_bytes=1000, dialect_of=dialect_of, **options
    )


def test_past_the_in_flight_limit_a_request_gets_429_at_once_and_health_still_answers():
    async def scenario() -> None:
        held = HeldApp()
        transport = httpx.ASGITransport(app=wrapped(held, max_in_flight=1, retry_after=3))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            first = asyncio.ensure_future(client.post("/hold", content=b"x"))
            await held.entered.wait()
            refused = await client.post("/v1/translate", content=b"{}")
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "3"
            assert "NMT_MAX_REQUESTS_IN_FLIGHT" in refused.json()["detail"]
            assert (await client.get("/healthz")).status_code == 200  # never refused
            held.release.set()
            assert (await first).status_code == 200
            assert (await client.post("/v1/translate", content=b"{}")).status_code == 200

    asyncio.run(scenario())


def test_a_body_that_stops_arriving_gets_408():
    async def scenario() -> None:
        app = wrapped(HeldApp(), body_timeout=0.05)
        sent: list[dict] = []

        async def receive() -> dict:
            if not sent:
                sent.append({})
                return {"type": "http.request", "body": b"{", "more_body": True}
            await asyncio.Event().wait()  # the rest never comes
            raise AssertionError

        messages: list[dict] = []

        async def send(message: dict) -> None:
            messages.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/translate", "headers": []}
        await asyncio.wait_for(app(scope, receive, send), 30)
        assert messages[0]["status"] == 408
        assert (b"connection", b"close") in messages[0]["headers"]

    asyncio.run(scenario())


def test_every_answer_carries_the_security_headers():
    async def scenario() -> httpx.Response:
        transport = httpx.ASGITransport(app=wrapped(HeldApp()))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get("/anything")

    headers = asyncio.run(scenario()).headers
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"


# With the real app and model.


@pytest.fixture(scope="module")
def client(fr_en_bundle: Path) -> Iterator[TestClient]:
    settings = Settings(
        model_dir=fr_en_bundle,
        api_keys=KEYS,
        metrics_require_key=True,
        max_sentences_per_request=4,
        default_beam_size=1,
        threads=1,
    )
    client = start(settings)
    yield client
    client.__exit__(None, None, None)


NATIVE = {"text": "Un chien court.", "source_lang": "fr", "target_lang": "en"}
LIBRE = {"q": "Un chien court.", "source": "fr", "target": "en"}


def test_the_native_api_needs_a_key_when_keys_are_set(client: TestClient):
    missing = client.post("/v1/translate", json=NATIVE)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    wrong = client.post("/v1/translate", json=NATIVE, headers={"authorization": "Bearer k-gamma"})
    assert wrong.status_code == 403
    for headers in ({"authorization": "Bearer k-beta"}, {"x-api-key": "k-alpha"}):
        assert client.post("/v1/translate", json=NATIVE, headers=headers).status_code == 200
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"x-api-key": "k-alpha"}).status_code == 200


def test_libretranslate_takes_the_key_in_the_body_and_answers_in_its_own_format(
    client: TestClient,
):
    missing = client.post("/translate", json=LIBRE)
    assert missing.status_code == 400 and "API key" in missing.json()["error"]
    wrong = client.post("/translate", json={**LIBRE, "api_key": "nope"})
    assert wrong.status_code == 403 and wrong.json() == {"error": "Invalid API key"}
    assert client.post("/translate", json={**LIBRE, "api_key": "k-alpha"}).status_code == 200
    assert client.post("/translate", data={**LIBRE, "api_key": "k-beta"}).status_code == 200


# Every keyed route, what it answers without a key and with a wrong one: (status, error field).
KEYED_ROUTES = [
    ("/v1/translate", (401, "detail"), (403, "detail")),
    ("/translate", (400, "error"), (403, "error")),
    ("/detect", (400, "error"), (403, "error")),
    ("/v2/translate", (403, "message"), (403, "message")),
    ("/v2/languages", (403, "message"), (403, "message")),
    ("/v2/usage", (403, "message"), (403, "message")),
]
UNREADABLE = [
    ("application/json", b"{"),
    ("application/json", b'{"text": "Bonjour'),  # truncated
    ("application/json", b'{"text": "\xff"}'),  # not UTF-8
    ("application/json", b"[" * 3000),  # nested past the parser's stack
    ("multipart/form-data", b"--x\r\ntext\r\n--x--\r\n"),  # no boundary
    ("text/plain", b"hello"),
]


@pytest.mark.parametrize(("path", "missing", "wrong"), KEYED_ROUTES)
def test_a_missing_or_wrong_key_is_answered_before_anything_about_the_body(
    client: TestClient, path: str, missing: tuple[int, str], wrong: tuple[int, str]
):
    """FastAPI decodes /v1's JSON before the key dependency runs: `{` without a key got 422.
    A body that cannot be read holds no key either, so every dialect answers the key first."""
    for content_type, body in UNREADABLE:
        for key, (status, field) in ((None, missing), ("k-gamma", wrong)):
            headers = {"content-type": content_type} | ({"x-api-key": key} if key else {})
            answer = client.post(path, content=body, headers=headers)
            assert answer.status_code == status, (body, key, answer.text)
            assert list(answer.json()) == [field] and "key" in answer.json()[field].lower()
        headers = {"content-type": content_type, "x-api-key": "k-alpha"}
        answer = client.post(path, content=body, headers=headers)  # now the body's answer
        assert answer.status_code not in (401, 403) and answer.status_code < 500, answer.text


ORIGIN = "https://app.example"


def test_past_the_in_flight_limit_preflights_pass_and_refusals_carry_cors_headers():
    """A browser's preflight costs nothing and reaches no route: never refused. The 429 the
    middleware gives itself carries the CORS headers a browser needs to read it (Retry-After
    included), as the answers from inside the CORS middleware do."""

    async def scenario() -> None:
        held = HeldApp()
        app = wrapped(held, max_in_flight=1, retry_after=3, cors_origins=[ORIGIN])
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            first = asyncio.ensure_future(client.post("/hold", content=b"x"))
            await held.entered.wait()
            preflight = {"origin": ORIGIN, "access-control-request-method": "POST"}
            assert (await client.options("/v1/translate", headers=preflight)).status_code == 200
            refused = await client.post("/v1/translate", content=b"{}", headers={"origin": ORIGIN})
            assert refused.status_code == 429
            assert refused.headers["access-control-allow-origin"] == ORIGIN
            assert "retry-after" in refused.headers["access-control-expose-headers"].lower()
            foreign = await client.post(
                "/v1/translate", content=b"{}", headers={"origin": "http://evil"}
            )
            assert "access-control-allow-origin" not in foreign.headers
            held.release.set()
            await first

    asyncio.run(scenario())


def test_a_cors_preflight_for_the_documented_headers_passes_with_our_headers(fr_en_bundle: Path):
    """A browser asks first before it sends X-API-Key or Authorization (not CORS-safelisted):
    the Fetch standard wants a 2xx naming each header asked for in Access-Control-Allow-Headers.
    The preflight carries the request id and security headers like any answer, needs no key,
    and never reaches a route (so it is no translation request in the metrics)."""
    settings = Settings(model_dir=fr_en_bundle, api_keys=KEYS, cors_origins=ORIGIN)
    client = TestClient(create_app(settings))  # not started: a preflight needs no model
    asked = [
        ("/v1/translate", "POST", "content-type,x-api-key"),
        ("/v1/translate", "POST", "authorization,content-type,x-request-id"),
        ("/translate", "POST", "content-type"),
        ("/v2/translate", "POST", "authorization,content-type"),
        ("/healthz", "HEAD", "x-request-id"),
    ]
    for path, method, headers in asked:
        request = {
            "access-control-request-method": method,
            "access-control-request-headers": headers,
        }
        answer = client.options(path, headers={"origin": ORIGIN, **request})
        assert 200 <= answer.status_code < 300, (path, headers, answer.text)
        assert answer.headers["access-control-allow-origin"] == ORIGIN
        allowed = answer.headers["access-control-allow-headers"].lower().split(", ")
        assert set(headers.split(",")) <= set(allowed), allowed
        assert method in answer.headers["access-control-allow-methods"].split(", ")
        assert re.fullmatch(r"[0-9a-f]{32}", answer.headers["x-request-id"])
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY"
    answer = client.get("/healthz", headers={"origin": ORIGIN, "x-request-id": "trace-1"})
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    assert answer.headers["x-request-id"] == "trace-1"
    assert "x-request-id" in answer.headers["access-control-expose-headers"].lower()
    scraped = client.get("/metrics").text
    assert 'route="/v1/translate"' not in scraped and 'route="unmatched"' in scraped


def test_health_stays_open_and_metrics_can_be_protected(client: TestClient):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 401
    scraped = client.get("/metrics", headers={"authorization": "Bearer k-alpha"})
    assert scraped.status_code == 200 and "nmt_requests_total" in scraped.text
    assert scraped.headers["content-type"].startswith("text/plain")


def test_keys_never_reach_the_logs(client: TestClient, caplog: pytest.LogCaptureFixture):
    with caplog.at_level("INFO"):
        client.post("/v1/translate", json=NATIVE, headers={"x-api-key": "k-gamma-secret"})
        client.post("/translate", json={**LIBRE, "api_key": "k-delta-secret"})
    assert "secret" not in caplog.text


def test_more_sentences_than_a_request_may_hold_is_413(client: TestClient):
    text = "Un chien court. Il pleut. Une femme lit. Un homme marche. Deux enfants jouent."
    response = client.post(
        "/v1/translate", json={**NATIVE, "text": text}, headers={"x-api-key": "k-alpha"}
    )
    assert response.status_code == 413, response.text
    assert "NMT_MAX_SENTENCES_PER_REQUEST" in response.json()["detail"]
    assert "has 5 sentences" in response.json()["detail"]
    # Past the limit at the first of three texts: the two after it are not even split.
    response = client.post(
        "/v1/translate",
        json={**NATIVE, "text": [text, "Un chat.", "Un chien."]},
        headers={"x-api-key": "k-alpha"},
    )
    assert response.status_code == 413, response.text
    assert "has at least 5 sentences" in response.json()["detail"]


def test_the_page_allows_exactly_its_own_inline_script(client: TestClient):
    page = client.get("/")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    (script,) = re.findall(r"<script>(.*?)</script>", page.text, flags=re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in policy
    assert "unsafe-inline" not in policy
    assert ' style="' not in page.text  # inline style attributes would be blocked


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_the_openapi_pages_load_nothing_from_outside(client: TestClient, path: str):
    page = client.get(path)
    assert page.status_code == 200
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert urls, page.text
    for url in urls:
        assert url.startswith("/"), f"{path} loads {url} from outside"
        assert client.get(url).status_code == 200, url
