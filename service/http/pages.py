"""The HTML the service serves: the web page (`/`) and the OpenAPI pages (`/docs`, `/redoc`).

Everything works offline: the page is one file with its script and style inline, and the
OpenAPI pages load Swagger UI and ReDoc from the assets the `fastapi-offline` package installs,
not from a CDN. Each page is sent with a Content-Security-Policy that allows exactly its own
inline script and style (by hash) and nothing from elsewhere.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

PAGE = Path(__file__).parent / "static" / "index.html"
DOCS_ASSETS = Path(fastapi_offline.__file__).parent / "static"
ASSETS_URL = "/docs-assets"


def content_security_policy(html: str, any_inline_style: bool = False) -> str:
    """Same origin only; inline <script> and <style> blocks allowed by their sha256.
    `any_inline_style` for pages whose library injects styles at run time (ReDoc, Swagger UI):
    styles cannot run code, so that is a small allowance."""

    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", html, flags=re.DOTALL)
        digests = (
            base64.b64encode(hashlib.sha256(block.encode()).digest()).decode()
            for block in blocks
            if block.strip()
        )
        return " ".join(f"'sha256-{digest}'" for digest in digests)

    styles = "'unsafe-inline'" if any_inline_style else hashes("style")
    return (
        f"default-src 'self'; script-src 'self' {hashes('script')}; "
        f"style-src 'self' {styles}; "
        "img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    )


def html_page(html: str, any_inline_style: bool = False) -> HTMLResponse:
    policy = content_security_policy(html, any_inline_style)
    return HTMLResponse(html, headers={"Content-Security-Policy": policy})


def add_pages(app: FastAPI, docs: bool) -> None:
    page = PAGE.read_text(encoding="utf-8")

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        return html_page(page)

    if not docs:
        return
    app.mount(ASSETS_URL, StaticFiles(directory=DOCS_ASSETS), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        html = get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        )
        return html_page(html.body.decode(), any_inline_style=True)

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        html = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
        return html_page(html.body.decode(), any_inline_style=True)
