"""The one scenario both servers get: LibreTranslate's `POST /translate`, one sentence a
request, fr -> en, each client sending its next request as soon as the last is answered (a
closed loop), every sentence a different one (neither server's translation cache can answer).

Run by bench.libretranslate, once per server and number of clients:

  BENCH_SENTENCES=FILE BENCH_FIRST_LINE=N locust -f bench/libretranslate/locustfile.py \\
      --headless -u 8 -r 8 -t 30s -H http://127.0.0.1:5000 --csv PREFIX

Lines are taken in order from line N of FILE, across all clients; past its end it starts
over (the report says so: the sentence pool should outlast the run).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from locust import HttpUser, constant, task

SENTENCES = Path(os.environ["BENCH_SENTENCES"]).read_text(encoding="utf-8").splitlines()
_next_line = itertools.count(int(os.environ.get("BENCH_FIRST_LINE", "0")))


class LibreTranslateClient(HttpUser):
    wait_time = constant(0)

    @task
    def translate(self) -> None:
        text = SENTENCES[next(_next_line) % len(SENTENCES)]
        body = {"q": text, "source": "fr", "target": "en", "format": "text"}
        with self.client.post(
            "/translate", json=body, name="/translate", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"status {response.status_code}: {response.text[:200]}")
            elif not response.json().get("translatedText"):
                response.failure("empty translatedText")
