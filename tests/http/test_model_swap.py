"""A model version swapped under load, on a real server: closed-loop clients translate while
version 2 is copied into the repository and loaded, then a broken version 3 is tried, then
version 1 is loaded back (a rollback).

What must hold: no request fails; /readyz answers 200 throughout (a load balancer never takes
the replica out); every answer from version 1 was asked for before the switch
ended; after it, version 2 answers; version 3 is refused with its reason (409) while version 2
serves on. What it measures, printed (`pytest -s -m slow tests/http/test_model_swap.py`): the
load's duration (load, warm-up and switch), p99 latency before, during and after, and the
server's memory with one and with two versions loaded. No bound on times: they are this
machine's."""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import multi30k_path
from tests.servers import running_server
from tests.serving.test_registry import add_version, break_version

pytestmark = pytest.mark.slow

CLIENTS = 4
FALLBACK = ["Un homme fait du vélo.", "Deux chiens courent dans l'herbe.", "Une femme lit."]


@dataclass
class Answer:
    started: float  # time.monotonic()
    ended: float
    status: int
    version: int | None


def sentences() -> list[str]:
    """Distinct sentences, so the cache (off anyway) cannot answer for the engine."""
    source = multi30k_path() / "test_2016_flickr.fr"
    if source.is_file():
        return source.read_text().splitlines()[:400]
    return [f"{s} ({n})" for n in range(150) for s in FALLBACK]


def client_loop(url: str, texts: list[str], offset: int, stop: threading.Event, out: list):
    with httpx.Client(timeout=60) as http:
        n = offset
        while not stop.is_set():
            body = {"text": texts[n % len(texts)], "source_lang": "fr", "target_lang": "en"}
            started = time.monotonic()
            try:
                answer = http.post(f"{url}/v1/translate", json={**body, "beam_size": 2})
                status = answer.status_code
                version = answer.json().get("model_version") if status == 200 else None
            except httpx.HTTPError:
                status, version = 0, None
            out.append(Answer(started, time.monotonic(), status, version))
            n += CLIENTS


def readiness_loop(url: str, stop: threading.Event, out: list[int]) -> None:
    """/readyz as a load balancer's probe sees it, every 20 ms."""
    with httpx.Client(timeout=10) as http:
        while not stop.wait(0.02):
            try:
                out.append(http.get(f"{url}/readyz").status_code)
            except httpx.HTTPError:
                out.append(0)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PeakMemory(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.peak = max(self.peak, rss_mib(self.pid))


def p99(answers: list[Answer]) -> float:
    latencies = sorted(a.ended - a.started for a in answers)
    if len(latencies) < 2:
        return float("nan")
    return statistics.quantiles(latencies, n=100)[98] * 1000


def copy_in(bundle: Path, repository: Path, version: int) -> Path:
    """As an operator would: a full copy under a temporary name, then an atomic rename."""
    staging = repository / "fr-en" / f".incoming-{version}"
    shutil.copytree(bundle, staging, symlinks=False)
    final = repository / "fr-en" / str(version)
    staging.rename(final)
    return final


def test_a_version_swapped_under_load_fails_no_request(
    fr_en_bundle: Path, tmp_path: Path, logs: Path
):
    repository = tmp_path / "repository"
    add_version(repository, "fr-en", 1, fr_en_bundle)
    texts = sentences()
    answers: list[Answer] = []
    readiness: list[int] = []
    stop = threading.Event()
    with running_server(repository, logs, threads=1, cache_entries=0) as server:
        pid = server.process.pid
        clients = [
            threading.Thread(target=client_loop, args=(server.url, texts, i, stop, answers))
            for i in range(CLIENTS)
        ]
        clients.append(threading.Thread(target=readiness_loop, args=(server.url, stop, readiness)))
        for client in clients:
            client.start()
        time.sleep(6)
        one_version = rss_mib(pid)  # under the same load as the peak and after

        copy_in(fr_en_bundle, repository, 2)
        memory = PeakMemory(pid)
        memory.start()
        load_started = time.monotonic()
        loaded = httpx.post(f"{server.url}/v1/models/fr-en/load", timeout=120)
        load_ended = time.monotonic()
        time.sleep(1)  # the old version unloads once its last request is answered
        memory.done.set()
        memory.join()
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["version"] == 2
        time.sleep(6)
        after_swap = rss_mib(pid)

        break_version(copy_in(fr_en_bundle, repository, 3))
        refused = httpx.post(f"{server.url}/v1/models/fr-en/load", timeout=120)
        time.sleep(3)
        models = httpx.get(f"{server.url}/v1/models").json()["models"]

        # A rollback is the same switch, to an older version named explicitly.
        rollback_started = time.monotonic()
        rollback = httpx.post(
            f"{server.url}/v1/models/fr-en/load", json={"version": 1}, timeout=120
        )
        rolled_back = time.monotonic()
        time.sleep(3)
        stop.set()
        for client in clients:
            client.join()

    assert refused.status_code == 409, refused.text
    assert (
        "version 3" in refused.json()["detail"] and "version 2 serves" in refused.json()["detail"]
    )
    (model,) = models
    assert model["version"] == 2 and model["state"] == "ready"
    assert {(v["version"], v["state"]) for v in model["versions"]} == {(2, "ready"), (3, "failed")}

    assert rollback.status_code == 200 and rollback.json()["version"] == 1
    assert all(a.version == 1 for a in answers if a.started > rolled_back)
    assert any(a.started > rolled_back for a in answers)

    not_ready = [status for status in readiness if status != 200]
    assert readiness and not not_ready, f"/readyz: {len(not_ready)} of {len(readiness)} not 200"

    failed = [a for a in answers if a.status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed[:5]}"
    # Version 1 answered only what was asked before the switch ended; version 2 after it.
    assert all(
        a.started < load_ended or a.ended > rollback_started for a in answers if a.version == 1
    )
    assert all(a.version == 2 for a in answers if load_ended < a.started < rollback_started)
    assert any(a.version == 1 for a in answers) and any(a.version == 2 for a in answers)

    before = [a for a in answers if a.ended < load_started]
    during = [a for a in answers if a.ended >= load_started and a.started <= load_ended]
    after = [a for a in answers if load_ended < a.started < rollback_started]
    last_v1 = max(a.ended for a in answers if a.version == 1 and a.started < load_ended)
    first_v2 = min(a.ended for a in answers if a.version == 2)
    print(
        f"\nmodel swap under load ({CLIENTS} closed-loop clients, beam 2, one engine thread): "
        f"{len(answers)} requests, 0 failed; /readyz 200 in {len(readiness)} probes\n"
        f"  load of version 2 (read, warm-up, switch): {load_ended - load_started:.2f} s; "
        f"last answer of version 1 {last_v1 - load_started:+.2f} s, first of version 2 "
        f"{first_v2 - load_started:+.2f} s from the load's start\n"
        f"  p99 latency: before {p99(before):.0f} ms ({len(before)}), during "
        f"{p99(during):.0f} ms ({len(during)}), after {p99(after):.0f} ms ({len(after)})\n"
        f"  server RSS: one version {one_version:.0f} MiB, peak while loading the second "
        f"{memory.peak:.0f} MiB, after the swap {after_swap:.0f} MiB"
    )
