"""Work on the event loop, measured from outside (issue 31, failures 4 and 5): while heavy
requests run, a thread probes `GET /healthz` every 20 ms on its own connection; the longest
probe is how long the loop was held.

- `markup-stall`: markup parsed on the loop. LibreTranslate `format=html` with 64 texts of
  5,000 "<" (312 KB, nothing to translate: all parsing), and DeepL `tag_handling=xml` with 64
  texts of 555 `<b>a</b>` (35,520 sentences: parsed, then refused with 413), 1 and 4 at once.
- `amplification`: 64 copies of a text of 4 long lines with `return_alignment` and
  `alignment_heads: "all"` on /v1/translate (the engine decodes the 4 distinct sentences once;
  the answer carries every copy): the answer's bytes, the server's RSS before, at its peak and
  after (/proc/PID/status), and the longest probe.

`--before-tree TREE` measures another checkout first (`git worktree add --detach /tmp/before HEAD`
before a change; it serves the same bundles), so that one run shows before and after side by
side; `--tree TREE` measures just that one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.harness import ROOT, Server, running_server
from bench.reliability.traffic import (
    JSON,
    HealthProber,
    Periodic,
    french_sentence,
    idle_healthz,
    send,
)

PROBE_INTERVAL_SECONDS = 0.02
CLIENT_TIMEOUT_SECONDS = 300.0
MIB = 1024 * 1024

# dialect: (path, request body) of the markup-stall requests.
MARKUP_REQUESTS: dict[str, tuple[str, bytes]] = {
    "LibreTranslate format=html": (
        "/translate",
        json.dumps(
            {"q": ["<" * 5000] * 64, "source": "fr", "target": "en", "format": "html"}
        ).encode(),
    ),
    "DeepL tag_handling=xml": (
        "/v2/translate",
        json.dumps(
            {
                "text": ["<b>a</b>" * 555] * 64,
                "source_lang": "FR",
                "target_lang": "EN-GB",
                "tag_handling": "xml",
            }
        ).encode(),
    ),
}
CONCURRENCY = (1, 4)


def amplification_body(copies: int = 64) -> bytes:
    """`copies` of one text of 4 lines, each one sentence of about 100 words (caption phrases
    joined by commas), with every head's cross-attention asked for."""
    lines = []
    for line in range(4):
        phrases, words = [], 0
        index = line * 50
        while words < 100:
            phrase = french_sentence(index).rstrip(".")
            phrases.append(phrase[0].lower() + phrase[1:] if phrases else phrase)
            words += len(phrase.split())
            index += 1
        lines.append(", ".join(phrases) + ".")
    body = {
        "text": ["\n".join(lines)] * copies,
        "source_lang": "fr",
        "target_lang": "en",
        "beam_size": 1,
        "return_alignment": True,
        "alignment_heads": "all",
    }
    return json.dumps(body).encode()


def _memory(server: Server) -> dict[str, int]:
    """VmRSS (now) and VmHWM (the peak since the process started), in bytes."""
    return {"VmRSS": server.rss_bytes(), "VmHWM": server.peak_rss_bytes()}


class RssSampler(Periodic):
    """VmRSS every 20 ms from a thread: the peak of one request, whatever came before it."""

    name = "rss-sampler"

    def __init__(self, server: Server) -> None:
        super().__init__(PROBE_INTERVAL_SECONDS)
        self.server, self.peak = server, 0

    def tick(self) -> None:
        self.peak = max(self.peak, self.server.rss_bytes())


async def _send_all(url: str, path: str, body: bytes, count: int) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_SECONDS) as client:
        sent = [
            send(client, "markup", "POST", path, content=body, headers=JSON) for _ in range(count)
        ]
        outcomes = await asyncio.gather(*sent)
    return [{"status": o.status, "seconds": round(o.seconds, 3)} for o in outcomes]


def _send_sync(url: str, path: str, body: bytes, count: int) -> list[dict[str, Any]]:
    return asyncio.run(_send_all(url, path, body, count))


def _probed(server: Server, work: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """work() with /healthz probed throughout; its result and the probes' summary."""
    with HealthProber(server.url, PROBE_INTERVAL_SECONDS) as prober:
        time.sleep(0.2)  # a few probes before the work starts
        result = work()
        time.sleep(0.2)
    return result, prober.summary()


def markup_stall(model_dir: Path, work_dir: Path, tree: Path, repeats: int) -> dict[str, Any]:
    """One server of `tree`: idle /healthz, then each markup request 1 and 4 at once."""
    rows = []
    with running_server(model_dir, work_dir, tree=tree) as server:
        idle = idle_healthz(server.url)
        for dialect, (path, body) in MARKUP_REQUESTS.items():
            for count in CONCURRENCY:
                probes, answers = [], []
                for _ in range(repeats):
                    work = partial(_send_sync, server.url, path, body, count)
                    found, summary = _probed(server, work)
                    answers += found
                    probes.append(summary)
                rows.append(
                    {
                        "dialect": dialect,
                        "at_once": count,
                        "body_kb": round(len(body) / 1000),
                        "statuses": sorted({a["status"] for a in answers}, key=str),
                        "request_seconds_max": max(a["seconds"] for a in answers),
                        "healthz": _pooled(probes),
                    }
                )
    return {"tree": str(tree), "idle_healthz": idle, "repeats": repeats, "rows": rows}


def _pooled(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Several probe summaries as one: the worst p50, p99 and max, probes summed."""
    return {
        "count": sum(s["count"] for s in summaries),
        "p50_ms": max(s["p50_ms"] or 0 for s in summaries),
        "p99_ms": max(s["p99_ms"] or 0 for s in summaries),
        "max_ms": max(s["max_ms"] or 0 for s in summaries),
        "failed": sum(s["failed"] for s in summaries),
    }


# The request of the issue, and one with 7 copies: under NMT_MAX_ALIGNMENT_WEIGHTS (2 million),
# whose answer is still built, to show where it is serialised.
AMPLIFICATION_COPIES = (64, 7)


def amplification(model_dir: Path, work_dir: Path, tree: Path) -> dict[str, Any]:
    """Each request on a fresh server of `tree` (so that RSS is its own): RSS and /healthz."""
    return {
        "tree": str(tree),
        "requests": [
            amplification_request(model_dir, work_dir, tree, copies)
            for copies in AMPLIFICATION_COPIES
        ],
    }


def amplification_request(
    model_dir: Path, work_dir: Path, tree: Path, copies: int
) -> dict[str, Any]:
    """One server of `tree`, one request of `copies`, RSS and /healthz around it."""
    body = amplification_body(copies)
    # The deadline is raised so that a slow, shared machine still decodes the 4 sentences.
    with running_server(model_dir, work_dir, tree=tree, request_timeout_seconds=120) as server:
        idle = idle_healthz(server.url)
        before = _memory(server)

        def request() -> tuple[int, int, str, float]:
            started = time.monotonic()
            with httpx.Client(base_url=server.url, timeout=CLIENT_TIMEOUT_SECONDS) as client:
                response = client.post("/v1/translate", content=body, headers=JSON)
            detail = response.text[:300] if response.status_code != 200 else ""
            return response.status_code, len(response.content), detail, time.monotonic() - started

        with RssSampler(server) as rss:
            (status, size, detail, seconds), probes = _probed(server, request)
        time.sleep(2.0)  # what the server keeps once the answer is gone
        after = _memory(server)
    return {
        "copies": copies,
        "request_kb": round(len(body) / 1000),
        "status": status,
        "detail": detail,
        "response_bytes": size,
        "request_seconds": round(seconds, 2),
        "rss_before_mib": round(before["VmRSS"] / MIB),
        "rss_peak_mib": round(_peak(rss.peak, before, after) / MIB),
        "rss_after_mib": round(after["VmRSS"] / MIB),
        "idle_healthz": idle,
        "healthz": probes,
    }


def _peak(sampled: int, before: dict[str, int], after: dict[str, int]) -> int:
    """The request's peak RSS: VmHWM when it grew during the request (the kernel saw what a
    20 ms sample may miss), else the highest sample."""
    return max(sampled, after["VmHWM"]) if after["VmHWM"] > before["VmHWM"] else sampled


def _trees(args: argparse.Namespace) -> list[tuple[str, Path]]:
    before = args.before_tree
    current = ("after" if before else "this tree", args.tree or ROOT)
    return ([("before", before)] if before else []) + [current]


def compared(
    test: str,
    measure: Callable[[Path, Path], dict[str, Any]],
    work_dir: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """`measure(work_dir, tree)` on each tree the arguments name (before first), as one result."""
    runs = {
        label: measure(work_dir / label.replace(" ", "-"), tree) for label, tree in _trees(args)
    }
    return {"test": test, "runs": runs}


def run_markup_stall(model_dir: Path, work_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    def measure(folder: Path, tree: Path) -> dict[str, Any]:
        return markup_stall(model_dir, folder, tree, args.repeats)

    return compared("markup-stall", measure, work_dir, args)


def run_amplification(model_dir: Path, work_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    return compared("amplification", partial(amplification, model_dir), work_dir, args)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """The subcommands of this module, for bench/reliability/__main__.py."""
    stall = commands.add_parser("markup-stall", help="/healthz while markup is parsed")
    stall.add_argument("--repeats", type=int, default=2, help="of each request and concurrency")
    amplify = commands.add_parser("amplification", help="a small request, a huge alignment")
    for command in (stall, amplify):
        add_tree_arguments(command)


def add_tree_arguments(command: argparse.ArgumentParser) -> None:
    """--tree and --before-tree, which _trees reads."""
    command.add_argument("--tree", type=Path, help="the checkout that serves (default: this)")
    command.add_argument(
        "--before-tree", type=Path, help="a checkout measured first, shown as 'before'"
    )


def _command(result: dict[str, Any], name: str) -> str:
    before = result["runs"].get("before")
    return f".venv/bin/python -m bench.reliability {name}" + (
        f" --before-tree {before['tree']}" if before else ""
    )


def _tree_note(result: dict[str, Any]) -> str:
    return "; ".join(f"{label}: `{run['tree']}`" for label, run in result["runs"].items())


def markdown_markup_stall(result: dict[str, Any]) -> str:
    runs = result["runs"]
    labels = list(runs)
    header = "| request | at once | " + " | ".join(
        f"{label}: status | {label}: longest request s | {label}: /healthz p50 / p99 / max ms"
        for label in labels
    )
    lines = [
        "## Markup parsed on the event loop (issue 31, failure 4)",
        "",
        "```sh",
        _command(result, "markup-stall"),
        "```",
        "",
        "`GET /healthz` probed every 20 ms from its own connection while markup requests run, "
        "1 and 4 at once, each "
        f"{next(iter(runs.values()))['repeats']} times (the worst of the repeats shown). "
        "LibreTranslate: 64 texts of 5,000 `<` with `format=html` (312 KB; no words, so the "
        "time is parsing). DeepL: 64 texts of 555 `<b>a</b>` with `tag_handling=xml` (35,520 "
        "sentences once parsed: 413, past NMT_MAX_SENTENCES_PER_REQUEST). Idle /healthz p50 / "
        "p99 / max: "
        + "; ".join(
            f"{label} {run['idle_healthz']['p50_ms']} / {run['idle_healthz']['p99_ms']} / "
            f"{run['idle_healthz']['max_ms']} ms"
            for label, run in runs.items()
        )
        + f". Trees: {_tree_note(result)}.",
        "",
        "Since issue 31 markup of more than 2,000 characters is read and written on one worker "
        "thread of its own (pure Python holds the GIL: one thread at a time, so the event loop "
        "competes with one holder, not four), and reading stops at the first text that passes "
        "the sentence limit.",
        "",
        header + " |",
        "|---|---|" + "---|---|---|" * len(labels),
    ]
    for index, row in enumerate(runs[labels[0]]["rows"]):
        cells = []
        for label in labels:
            found = runs[label]["rows"][index]
            health = found["healthz"]
            statuses = ", ".join(map(str, found["statuses"]))
            cells.append(
                f"{statuses} | {found['request_seconds_max']} | {health['p50_ms']} / "
                f"{health['p99_ms']} / **{health['max_ms']}**"
            )
        lines.append(
            f"| {row['dialect']} ({row['body_kb']} KB) | {row['at_once']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def _size(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count} bytes"


def markdown_amplification(result: dict[str, Any]) -> str:
    runs = result["runs"]
    labels = list(runs)
    columns = [
        (f"{request['copies']} copies ({request['request_kb']} KB): {label}", request)
        for index in range(len(AMPLIFICATION_COPIES))
        for label in labels
        for request in [runs[label]["requests"][index]]
    ]
    rows = [
        ("status", lambda r: str(r["status"])),
        ("response", lambda r: _size(r["response_bytes"])),
        ("request time", lambda r: f"{r['request_seconds']} s"),
        ("server RSS before / peak / 2 s after", lambda r: (
            f"{r['rss_before_mib']} / {r['rss_peak_mib']} / {r['rss_after_mib']} MiB")),
        ("/healthz p50 / p99 / max during the request", lambda r: (
            f"{r['healthz']['p50_ms']} / {r['healthz']['p99_ms']} / **{r['healthz']['max_ms']}** "
            "ms")),
    ]  # fmt: skip
    lines = [
        "## Response amplification (issue 31, failure 5)",
        "",
        "```sh",
        _command(result, "amplification"),
        "```",
        "",
        "One request to /v1/translate, each on a fresh server: 64 copies (the request of the "
        "issue) or 7 copies of a text of 4 lines of about 100 words (one sentence each), greedy, "
        'with `return_alignment` and `alignment_heads: "all"`. The engine decodes the 4 distinct '
        "sentences once; the answer carries the weights of every copy (64 copies: 16.6 million, "
        "past NMT_MAX_ALIGNMENT_WEIGHTS; 7 copies: 1.8 million, under it). RSS from "
        "/proc/PID/status (VmRSS, sampled every 20 ms, and VmHWM); `/healthz` probed every 20 ms "
        "meanwhile. NMT_REQUEST_TIMEOUT_SECONDS=120, the rest default. Trees: "
        f"{_tree_note(result)}.",
        "",
        "Since issue 31 the weights are counted after decoding, before any list is built "
        "(413 past the cap), and an answer of more than 2,000 characters and weights is built "
        "and serialised to JSON on a worker thread, not by FastAPI on the event loop.",
        "",
        "| | " + " | ".join(name for name, _ in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    lines += [
        f"| {name} | " + " | ".join(cell(request) for _, request in columns) + " |"
        for name, cell in rows
    ]
    details = [f"- {name}: `{request['detail']}`" for name, request in columns if request["detail"]]
    if details:
        lines += ["", "Answers other than 200:", "", *details]
    return "\n".join(lines) + "\n"


RUNNERS = {"markup-stall": run_markup_stall, "amplification": run_amplification}
MARKDOWN = {"markup-stall": markdown_markup_stall, "amplification": markdown_amplification}
