"""The architecture holds: the service's layers import downwards only (runtime <- serving <-
store/documents <- http), nothing below HTTP imports a web framework, the serving side never
imports torch, the offline side meets the runtime only through nmt_contract, and every service
error declares a status that each API dialect turns into an answer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request

from service.documents.formats.base import DocumentRefused
from service.http.app import create_app
from service.http.deepl import DEEPL
from service.http.libretranslate import LIBRE
from service.http.limits import limit_of
from service.serving import errors
from service.serving.admission import Forecast
from service.serving.settings import Settings
from tests.conftest import ROOT

# Which packages each part may import from this project (besides itself).
ALLOWED = {
    "service.runtime": {"nmt_contract"},
    "service.serving": {"nmt_contract", "service.runtime"},
    # durable state, beside documents: it reads the settings, and knows nothing of HTTP
    "service.store": {"nmt_contract", "service.runtime", "service.serving"},
    "service.documents": {"nmt_contract", "service.runtime", "service.serving", "service.store"},
    "service.http": {
        "nmt_contract",
        "service.runtime",
        "service.serving",
        "service.store",
        "service.documents",
    },
    "export": {"nmt_contract", "export"},
}
PROJECT_PACKAGES = ("service", "export", "bench", "nmt_contract", "nmt_cli")
# What only the HTTP layer may import: below it, nothing knows it is behind a web server.
WEB_LIBRARIES = ("fastapi", "starlette", "uvicorn")
BELOW_HTTP = ("service.runtime", "service.serving", "service.store", "service.documents")


def imports(path: Path) -> set[str]:
    """Every module a file imports (absolute imports: the code uses no relative ones)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def project_imports(path: Path) -> set[str]:
    """Modules of this project that a file imports."""
    return {name for name in imports(path) if name.split(".")[0] in PROJECT_PACKAGES}


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_each_part_imports_only_the_layers_below_it(part: str):
    folder = ROOT.joinpath(*part.split("."))
    files = sorted(folder.rglob("*.py"))
    assert files
    wrong = []
    for file in files:
        for module in project_imports(file):
            if not any(
                module == ok or module.startswith(ok + ".") for ok in ALLOWED[part] | {part}
            ):
                wrong.append(f"{file.relative_to(ROOT)} imports {module}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("part", BELOW_HTTP)
def test_nothing_below_http_imports_a_web_framework(part: str):
    files = sorted(ROOT.joinpath(*part.split(".")).rglob("*.py"))
    assert files
    wrong = [
        f"{file.relative_to(ROOT)} imports {module}"
        for file in files
        for module in sorted(imports(file))
        if module.split(".")[0] in WEB_LIBRARIES
    ]
    assert not wrong, "\n".join(wrong)


def test_the_serving_side_never_imports_torch() -> None:
    code = (
        "import sys, pkgutil, importlib, service, nmt_contract\n"
        "for m in pkgutil.walk_packages(service.__path__, 'service.'):\n"
        "    importlib.import_module(m.name)\n"
        "assert 'torch' not in sys.modules, 'service imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def every_subclass(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *every_subclass(sub))]


# One instance of every service error; a new error class must be added here (the test says so).
SAMPLES: dict[type, errors.ServiceError] = {
    errors.NotReady: errors.NotReady("models are loading"),
    errors.ShuttingDown: errors.ShuttingDown("shutting down"),
    errors.UnknownPair: errors.UnknownPair("fr", "xx", ["fr-en"]),
    errors.GlossaryUnknown: errors.GlossaryUnknown("Glossary not found."),
    errors.ModelUnknown: errors.ModelUnknown("de-en", ["fr-en"]),
    errors.ModelVersionUnknown: errors.ModelVersionUnknown("fr-en", 7, [1, 2]),
    errors.ModelLoadFailed: errors.ModelLoadFailed("fr-en", {3: "checksum"}, "version 2"),
    errors.ModelUnavailable: errors.ModelUnavailable("fr-en"),
    errors.AdminKeyRequired: errors.AdminKeyRequired("set NMT_ADMIN_KEYS"),
    errors.InvalidInput: errors.InvalidInput(
        "invalid_unicode", "holds a lone surrogate", text_index=0
    ),
    errors.SentenceTooLong: errors.SentenceTooLong(0, 300, 256, sentence=2),
    errors.QueueFull: errors.QueueFull("fr-en", 10, 10, 3),
    errors.Backlogged: errors.Backlogged("fr-en", 90, Forecast(12.0, 1.5, 0.5, 60.0), 1.0, 2),
    errors.TooManyTexts: errors.TooManyTexts(65, 64),
    errors.TextTooLong: errors.TextTooLong(2, 5001, 5000),
    errors.RequestTooLarge: errors.RequestTooLarge(900, 512),
    errors.BodyTooLarge: errors.BodyTooLarge(1_048_576),
    errors.AlignmentTooLarge: errors.AlignmentTooLarge(16_617_600, 2_000_000),
    errors.MissingApiKey: errors.MissingApiKey(),
    errors.InvalidApiKey: errors.InvalidApiKey(),
    errors.QuotaExceeded: errors.QuotaExceeded(100, 100),
    errors.DetectedLanguageNotServed: errors.DetectedLanguageNotServed("de", 99.0, "en", ["fr"]),
    errors.DeadlineExceeded: errors.DeadlineExceeded(2.0),
    errors.ClientGone: errors.ClientGone("gone"),
    errors.InternalError: errors.InternalError("a bug"),
    errors.TranslationFailed: errors.TranslationFailed(1, "onnxruntime failed"),
    DocumentRefused: DocumentRefused("the file declares entities (a DTD subset)"),
}


def test_every_service_error_has_a_sample_here():
    missing = set(every_subclass(errors.ServiceError)) - set(SAMPLES)
    assert not missing, f"add a sample of {missing} to SAMPLES"


def raising(error: errors.ServiceError):
    async def route() -> None:
        raise error

    return route


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    """An app (its models fail to load: there are none) with a route raising each sample."""
    app = create_app(Settings(model_dir=tmp_path_factory.mktemp("empty"), warmup=False))
    for index, error in enumerate(SAMPLES.values()):
        app.add_api_route(f"/raise/{index}", raising(error))
    return TestClient(app)


@pytest.mark.parametrize("kind", list(SAMPLES), ids=lambda kind: kind.__name__)
def test_every_error_is_answered_with_its_own_status_in_each_dialect(client: TestClient, kind):
    index = list(SAMPLES).index(kind)
    error = SAMPLES[kind]
    response = client.get(f"/raise/{index}", headers={"x-request-id": "req-7"})
    assert response.status_code == kind.status
    assert "detail" in response.json()
    for name, value in error.headers().items():
        assert response.headers[name] == value
    internal = isinstance(error, errors.InternalError)
    assert ("req-7" in response.text) == internal  # a server fault points at its log line
    assert (kind.status >= 500 and kind.status not in (503, 504)) == internal

    # A limit has each dialect's status for it (tests/http/test_dialects.py has them); any other
    # error its own, or the dialect's word for it.
    request = Request({"type": "http", "state": {"request_id": "req-7"}, "headers": []})
    limit = limit_of(error)
    libre = LIBRE.error_for(error, request)
    if limit is not None:
        assert libre.status == LIBRE.limit_status[limit]
    else:
        assert libre.status == (400 if kind.status in (401, 404, 422) else kind.status)
    assert libre.message

    deepl = DEEPL.error_for(error, request)
    if limit is not None:
        assert deepl.status == DEEPL.limit_status[limit]
    elif isinstance(error, errors.MissingApiKey | errors.InvalidApiKey):
        assert deepl.status == 403  # DeepL says 403 for any key problem
    else:
        assert deepl.status == (400 if kind.status in (401, 404, 422) else kind.status)
    assert deepl.message
