"""Big bodies and big documents against the event loop, measured from outside: while each
request runs, a thread probes `GET /healthz` every 20 ms on its own connection (loop_stall.py's
prober); the longest probe is how long the loop was held.

- three native requests of about 1 MB that break or stretch the schema: 250,000 empty lists as
  `text`, 60,000 unknown fields, an inline glossary of 22,000 terms (valid: a 200);
- three bodies of about 10 MB for `/v2/glossaries`: 800,000 keys, and a real glossary of
  100,000 entries as JSON and as a form;
- a 12 MB HTML page of heavy markup (12,000 paragraphs, each with 40 empty spans) uploaded
  through DeepL's `/v2/document`, probed during the upload and the first 20 s of its
  translation (the worker reads it again and lays out its first chunks).

`--before-tree TREE` measures another checkout first, as loop_stall.py's measurements do.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

from bench.harness import running_server
from bench.reliability.loop_stall import (
    CLIENT_TIMEOUT_SECONDS,
    _command,
    _probed,
    _tree_note,
    add_tree_arguments,
    compared,
)
from bench.reliability.traffic import JSON, french_sentence, idle_healthz

TRANSLATING_SECONDS = 20.0
PAGE_PARAGRAPHS = 12_000
NATIVE = {"source_lang": "fr", "target_lang": "en", "beam_size": 1}
FORM = "application/x-www-form-urlencoded"


def native_bodies() -> dict[str, bytes]:
    terms = [{"source": f"mot{i}", "target": f"word{i}"} for i in range(22_000)]
    fields = {f"field{i}": 1 for i in range(60_000)}
    bodies = {
        "250,000 empty lists as text": {**NATIVE, "text": [[]] * 250_000},
        "60,000 unknown fields": {**NATIVE, "text": "Un chien dort.", **fields},
        "an inline glossary of 22,000 terms": {**NATIVE, "text": "Un chien.", "glossary": terms},
    }
    return {name: json.dumps(body).encode() for name, body in bodies.items()}


def glossary_bodies() -> dict[str, tuple[bytes, str]]:
    """Bodies of about 10 MB for /v2/glossaries (NMT_MAX_GLOSSARY_BYTES): 800,000 keys, and a
    real glossary of 100,000 entries (NMT_MAX_GLOSSARY_ENTRIES) as JSON and as a form."""
    keys = "{" + ",".join(f'"k{i}":1' for i in range(800_000)) + "}"
    entries = "".join(
        f"le mot numéro {i} d'une longue liste de termes\tthe word number {i} of a long list\n"
        for i in range(100_000)
    )
    glossary = {"name": "g", "source_lang": "FR", "target_lang": "EN", "entries": entries}
    return {
        "800,000 keys to /v2/glossaries": (keys.encode(), JSON["content-type"]),
        "a glossary of 100,000 entries, JSON": (
            json.dumps(glossary).encode(),
            JSON["content-type"],
        ),
        "the same glossary as a form": (urlencode(glossary).encode(), FORM),
    }


def heavy_page(paragraphs: int = PAGE_PARAGRAPHS) -> bytes:
    padding = '<span class="c"></span>' * 40
    lines = [f"<p><b>{french_sentence(i)}</b> {padding}</p>" for i in range(paragraphs)]
    return ("<html><body>\n" + "\n".join(lines) + "\n</body></html>\n").encode()


def body_stall(model_dir: Path, work_dir: Path, tree: Path) -> dict[str, Any]:
    """One server of `tree`: idle /healthz, each native body, then the page."""
    rows = []
    state = work_dir / "state"
    with running_server(model_dir, work_dir, tree=tree, state_dir=state, threads=1) as server:
        idle = idle_healthz(server.url)
        client = httpx.Client(base_url=server.url, timeout=CLIENT_TIMEOUT_SECONDS)
        for name, body in native_bodies().items():

            def post(body: bytes = body) -> tuple[int, int, float]:
                started = time.monotonic()
                answer = client.post("/v1/translate", content=body, headers=JSON)
                return answer.status_code, len(answer.content), time.monotonic() - started

            (status, size, seconds), probes = _probed(server, post)
            rows.append(_row(name, len(body), status, size, seconds, probes))
        for name, (body, content_type) in glossary_bodies().items():

            def create(
                body: bytes = body, content_type: str = content_type
            ) -> tuple[int, int, float]:
                started = time.monotonic()
                headers = {"content-type": content_type}
                answer = client.post("/v2/glossaries", content=body, headers=headers)
                return answer.status_code, len(answer.content), time.monotonic() - started

            (status, size, seconds), probes = _probed(server, create)
            rows.append(_row(name, len(body), status, size, seconds, probes))
        page = heavy_page()

        def upload() -> tuple[int, int, float]:
            started = time.monotonic()
            answer = client.post(
                "/v2/document",
                data={"source_lang": "FR", "target_lang": "EN-US"},
                files={"file": ("page.html", page, "text/html")},
            )
            return answer.status_code, len(answer.content), time.monotonic() - started

        (status, size, seconds), probes = _probed(server, upload)
        rows.append(_row("12 MB HTML page: the upload", len(page), status, size, seconds, probes))
        _, probes = _probed(server, lambda: time.sleep(TRANSLATING_SECONDS))
        name = f"the page: its first {TRANSLATING_SECONDS:g} s of translation"
        rows.append(_row(name, 0, None, 0, TRANSLATING_SECONDS, probes))
        client.close()
    return {"tree": str(tree), "idle_healthz": idle, "rows": rows}


def _row(
    name: str, size: int, status: int | None, answer: int, seconds: float, probes: dict
) -> dict[str, Any]:
    return {
        "request": name,
        "body_mb": round(size / 1e6, 1),
        "status": status,
        "answer_bytes": answer,
        "seconds": round(seconds, 2),
        "healthz": probes,
    }


def run_body_stall(model_dir: Path, work_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    return compared("body-stall", partial(body_stall, model_dir), work_dir, args)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """The subcommand of this module, for bench/reliability/__main__.py."""
    add_tree_arguments(commands.add_parser("body-stall", help="/healthz while big bodies are read"))


def markdown_body_stall(result: dict[str, Any]) -> str:
    runs = result["runs"]
    labels = list(runs)
    lines = [
        "## Big bodies and big documents against the event loop",
        "",
        "```sh",
        _command(result, "body-stall"),
        "```",
        "",
        "`GET /healthz` probed every 20 ms from its own connection while each request runs, "
        "one at a time, on a server with one engine thread. The native requests are about 1 MB "
        "each (NMT_MAX_BODY_BYTES): 250,000 empty lists as `text`, 60,000 unknown fields, and "
        "a valid inline glossary of 22,000 terms. The glossary bodies are about 10 MB each "
        "(NMT_MAX_GLOSSARY_BYTES): 800,000 keys, and a real glossary of 100,000 entries as JSON "
        "and as a form. The page is 12 MB of HTML (12,000 paragraphs, "
        "each with 40 empty spans) uploaded through DeepL's `/v2/document`, then probed for "
        f"{TRANSLATING_SECONDS:g} s while the worker reads it again and translates its first "
        "chunks. Idle /healthz p50 / p99 / max: "
        + "; ".join(
            f"{label} {run['idle_healthz']['p50_ms']} / {run['idle_healthz']['p99_ms']} / "
            f"{run['idle_healthz']['max_ms']} ms"
            for label, run in runs.items()
        )
        + f". Trees: {_tree_note(result)}.",
        "",
        "| request | "
        + " | ".join(
            f"{label}: status, answer | {label}: seconds | {label}: /healthz p99 / max ms"
            for label in labels
        )
        + " |",
        "|---|" + "---|---|---|" * len(labels),
    ]
    for index, row in enumerate(runs[labels[0]]["rows"]):
        cells = []
        for label in labels:
            found = runs[label]["rows"][index]
            health = found["healthz"]
            status = "" if found["status"] is None else f"{found['status']}, "
            cells.append(
                f"{status}{_bytes(found['answer_bytes'])} | {found['seconds']} | "
                f"{health['p99_ms']} / **{health['max_ms']}**"
            )
        size = f" ({row['body_mb']} MB)" if row["body_mb"] else ""
        lines.append(f"| {row['request']}{size} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _bytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count} B"


RUNNERS = {"body-stall": run_body_stall}
MARKDOWN = {"body-stall": markdown_body_stall}
