"""The store in the server: opened at start-up before any request (migrated), reachable as
`app.state.store` and through the `get_store` dependency, counted by `nmt_glossaries` at each
scrape, closed at shutdown; a database the server cannot use stops it, saying which one with
its password masked. No model is needed: the store opens before the models load."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.http.app import create_app
from service.http.dependencies import StoreDep
from service.serving.metrics import COUNT_WAIT_SECONDS, Metrics
from service.store import Dictionary, Store
from tests.conftest import ROOT
from tests.store.conftest import settings_for

BAD_URL = "postgresql+psycopg://nmt:sekrit@127.0.0.1:1/nmt"


def glossaries_gauge(metrics_text: str) -> float:
    (family,) = [
        f for f in text_string_to_metric_families(metrics_text) if f.name == "nmt_glossaries"
    ]
    (sample,) = family.samples
    return sample.value


def test_the_app_opens_the_store_serves_it_counts_it_and_closes_it(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = []
    original_close = Store.close
    monkeypatch.setattr(Store, "close", lambda self: (closed.append(self), original_close(self)))
    app = create_app(settings_for(database_url, model_dir=tmp_path / "no-models"))

    @app.get("/test-store-count")
    def count(store: StoreDep) -> dict:
        return {"count": store.glossaries.count(), "same": store is app.state.store}

    with TestClient(app) as client:
        store = app.state.store
        assert isinstance(store, Store)
        assert glossaries_gauge(client.get("/metrics").text) == 0
        store.glossaries.create("alice", "a", [Dictionary("en", "de", (("a", "b"),))])
        store.glossaries.create("bob", "b", [])
        assert client.get("/test-store-count").json() == {"count": 2, "same": True}
        assert glossaries_gauge(client.get("/metrics").text) == 2
        assert not closed
    assert closed == [store]


def test_a_database_the_app_cannot_open_stops_it_with_the_password_masked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(settings_for(BAD_URL, model_dir=tmp_path / "no-models"))
    with pytest.raises(Exception, match="database is unavailable"), TestClient(app):
        pass
    lifecycle = app.state.service.lifecycle
    assert lifecycle.phase == "failed"
    assert "nmt:***@127.0.0.1:1/nmt" in lifecycle.reason and "sekrit" not in lifecycle.reason
    assert "could not open the database" in caplog.text and "sekrit" not in caplog.text


def test_nmt_serve_exits_on_a_database_it_cannot_open(tmp_path: Path) -> None:
    env = {**os.environ, "NMT_DATABASE_URL": BAD_URL, "NMT_MODEL_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "nmt_cli", "serve", "--port", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, done.stderr  # uvicorn's status for a failed start-up
    assert "could not open the database postgresql+psycopg://nmt:***@127.0.0.1:1/nmt" in done.stderr
    assert "sekrit" not in done.stdout + done.stderr


def test_the_gauge_is_nan_while_the_database_fails_or_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    assert glossaries_gauge(metrics.render().decode()) != glossaries_gauge(
        metrics.render().decode()
    )  # NaN: no store yet
    state = {"mode": "ok"}
    release = threading.Event()

    def count() -> int:
        if state["mode"] == "fail":
            raise RuntimeError("the database did not answer")
        if state["mode"] == "hang":
            release.wait(30)
        return 7

    metrics.watch_glossaries(count)
    assert glossaries_gauge(metrics.render().decode()) == 7
    state["mode"] = "fail"
    with caplog.at_level(logging.WARNING):
        value = glossaries_gauge(metrics.render().decode())
        metrics.render()
    assert value != value  # NaN
    assert caplog.text.count("could not read it") == 1  # once, not at every scrape
    state["mode"] = "hang"
    started = time.monotonic()
    value = glossaries_gauge(metrics.render().decode())
    assert value != value and time.monotonic() - started < COUNT_WAIT_SECONDS + 5
    started = time.monotonic()
    metrics.render()  # the hung read is not repeated, nor waited for again
    assert time.monotonic() - started < COUNT_WAIT_SECONDS
    state["mode"] = "ok"
    release.set()
    time.sleep(0.1)
    assert glossaries_gauge(metrics.render().decode()) == 7


def a_glossary_and_a_document(post: Callable[..., Any]) -> tuple[str, dict]:
    """A glossary (chien -> hound) and an uploaded document's handle, made through
    `post(path, **request)` (a TestClient's, or httpx's against a server)."""
    created = post(
        "/v2/glossaries",
        json={
            "name": "g",
            "source_lang": "fr",
            "target_lang": "en",
            "entries": "chien\thound",
            "entries_format": "tsv",
        },
    )
    assert created.status_code == 201, created.text
    upload = post(
        "/v2/document",
        data={"target_lang": "EN-US", "source_lang": "FR"},
        files={"file": ("a.txt", b"Un chien dort.")},
    )
    return created.json()["glossary_id"], upload.json()


def test_a_database_gone_away_is_a_503_to_retry_on_every_route_that_needs_it(
    postgres_server, model_dir: Path
) -> None:
    """Its database dropped under a running server (as if PostgreSQL were down): translating
    with a stored glossary, and a document's upload, status and result, answer 503 with
    Retry-After in each dialect, not a 500; translating without the store still works."""
    from tests.http.in_process import start

    url = postgres_server.create_database()
    client = start(settings_for(url, model_dir=model_dir, threads=1, warmup=False))
    try:
        glossary, upload = a_glossary_and_a_document(client.post)
        postgres_server.drop_database(url.rsplit("/", 1)[1])
        text = {"text": "Un chien dort.", "source_lang": "fr", "target_lang": "en"}
        deepl = {"text": ["Un chien dort."], "source_lang": "FR", "target_lang": "EN"}
        deepl["glossary_id"] = glossary
        answers = {
            "native": client.post("/v1/translate", json={**text, "glossary_id": glossary}),
            "deepl": client.post("/v2/translate", json=deepl),
            "upload": client.post(
                "/v2/document",
                data={"target_lang": "EN-US", "source_lang": "FR"},
                files={"file": ("b.txt", b"Un chat dort.")},
            ),
            "status": client.post(f"/v2/document/{upload['document_id']}", json=upload),
            "result": client.post(f"/v2/document/{upload['document_id']}/result", json=upload),
        }
        for name, answer in answers.items():
            assert answer.status_code == 503, (name, answer.text)
            assert answer.headers["retry-after"] == "1", name
            assert "retry later" in answer.text, name
        assert client.post("/v1/translate", json=text).status_code == 200
    finally:
        client.__exit__(None, None, None)


def test_a_database_that_hangs_holds_no_translation_and_its_requests_get_503_in_time(
    postgres_server, model_dir: Path, tmp_path: Path
) -> None:
    """The tables locked by another session (as by a migration, or a frozen server): the
    requests that need them (document status polls, translations with a stored glossary) get
    a 503 after NMT_DATABASE_TIMEOUT_SECONDS instead of hanging, and a long translation that
    needs no database, sent while a dozen of them wait, answers as usual: the store's calls
    hold threads of their own, not those that prepare translations."""
    import httpx
    from sqlalchemy import create_engine, text

    from tests.servers import running_server

    url = postgres_server.create_database()
    with running_server(
        model_dir, tmp_path, database_url=url, database_timeout_seconds=2, threads=1
    ) as server:
        glossary, upload = a_glossary_and_a_document(
            lambda path, **request: httpx.post(f"{server.url}{path}", **request)
        )
        locker = create_engine(url).connect()
        locker.execute(
            text("LOCK TABLE document_jobs, glossaries IN ACCESS EXCLUSIVE MODE")
        )  # held until the rollback below
        try:
            answers: dict[str, list] = {"store": [], "long": []}

            def poll() -> None:
                started = time.monotonic()
                answer = httpx.post(
                    f"{server.url}/v2/document/{upload['document_id']}", json=upload, timeout=60
                )
                answers["store"].append((answer.status_code, time.monotonic() - started))

            def with_glossary() -> None:
                started = time.monotonic()
                body = {"text": ["Un chien."], "target_lang": "EN", "source_lang": "FR"}
                answer = httpx.post(
                    f"{server.url}/v2/translate",
                    json={**body, "glossary_id": glossary},
                    timeout=60,
                )
                answers["store"].append((answer.status_code, time.monotonic() - started))

            waiting = [threading.Thread(target=poll) for _ in range(10)]
            waiting += [threading.Thread(target=with_glossary) for _ in range(4)]
            for thread in waiting:
                thread.start()
            time.sleep(0.5)  # every one of them waiting on the database
            long_text = " ".join(["Un homme marche dans la rue."] * 120)  # past 2,000 characters
            started = time.monotonic()
            translated = httpx.post(
                f"{server.url}/v1/translate",
                json={"text": long_text, "source_lang": "fr", "target_lang": "en"},
                timeout=60,
            )
            answers["long"].append((translated.status_code, time.monotonic() - started))
            for thread in waiting:
                thread.join(60)
        finally:
            locker.rollback()
            locker.close()
        assert translated.status_code == 200, translated.text
        statuses = sorted(status for status, _ in answers["store"])
        assert statuses == [503] * 14, answers
        # Each waited about the timeout, not for ever (nor the client's 60 s).
        assert max(seconds for _, seconds in answers["store"]) < 30, answers
        # The translation did not wait for the database's timeouts to free threads.
        assert answers["long"][0][1] < 30, answers
        after = httpx.post(f"{server.url}/v2/document/{upload['document_id']}", json=upload)
        assert after.status_code == 200, after.text
