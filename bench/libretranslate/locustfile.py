"""The one scenario both servers get: LibreTranslate's `POST /translate`, one sentence a
request, fr -> en, each client sending its next request as soon as the last is answered (a
closed loop), every sentence a different one (neither server's translation cache can answer).

Run by bench.libretranslate, once per server and number of clients:

  BENCH_SENTENCES=FILE BENCH_FIRST_LINE=N locust -f bench/libretranslate/locustfile.py \\
      --headless -u 8 -r 8 -t 30s -H http://127.0.0.1:5000 --csv PREFIX

Lines are taken in order from line N of FILE, across all clients; past its end it starts
over (the report says so: the sentence pool should outlast the run). At the end it writes how
many lines it took to BENCH_LINES_USED (when set): Locust's own request count leaves out about
its first second of requests (184 counted of 262 sent in a 3 s turn at one client), and the next
level must start past every line a server has translated, or that server's cache answers it.

The clients are Locust's FastHttpUser (geventhttpclient), not its HttpUser (requests): the load
runs on the servers' cores, and FastHttpUser takes about half the CPU a request (0.7-0.85 ms
against 1.4-1.6 ms, against our server at 1, 8 and 32 clients; AMD EPYC Zen 4), which is left
to the server measured. The report gives what it took (bench.libretranslate).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from locust import constant, events, task
from locust.contrib.fasthttp import FastHttpUser

SENTENCES = Path(os.environ["BENCH_SENTENCES"]).read_text(encoding="utf-8").splitlines()
FIRST_LINE = int(os.environ.get("BENCH_FIRST_LINE", "0"))
_next_line = itertools.count(FIRST_LINE)


@events.quitting.add_listener
def _write_lines_used(**_kwargs) -> None:
    if path := os.environ.get("BENCH_LINES_USED"):
        Path(path).write_text(str(next(_next_line) - FIRST_LINE))


class LibreTranslateClient(FastHttpUser):
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
