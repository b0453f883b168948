"""The app in process, for the tests that need no real server: FastAPI's TestClient (lifespan
included) once its models have loaded, and a model served under another language pair.
tests/servers.py runs a real `nmt serve` process instead."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fastapi.testclient import TestClient

from service.http.app import create_app
from service.serving.settings import Settings


def start(settings: Settings, timeout: float = 120) -> TestClient:
    """An entered TestClient whose models are loaded (or failed to load); the caller exits it
    (`client.__exit__(None, None, None)`)."""
    client = TestClient(create_app(settings))
    client.__enter__()
    deadline = time.monotonic() + timeout
    while client.get("/healthz").json()["status"] == "starting":
        assert time.monotonic() < deadline, "models did not load in time"
        time.sleep(0.05)
    return client


def pair_bundle(bundle: Path, folder: Path, source: str, target: str) -> Path:
    """The same model served under another language pair (only routing is tested with it):
    its files linked, bundle.json rewritten (its checksums cover the other files)."""
    folder.mkdir(parents=True)
    for file in bundle.iterdir():
        if file.name != "bundle.json":
            (folder / file.name).symlink_to(file)
    manifest = json.loads((bundle / "bundle.json").read_text())
    manifest.update(name=f"{source}-{target}", source_lang=source, target_lang=target)
    (folder / "bundle.json").write_text(json.dumps(manifest))
    return folder
