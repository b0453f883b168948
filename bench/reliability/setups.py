"""Which server set-up keeps overload graceful: the same 4x-capacity open loop against servers
that differ in ONNX Runtime's threads and thread spinning, one after the other in one run.

On 2 cores, the event loop (admission, 429s, /healthz) competes for CPU with ONNX Runtime's
intra-op threads; spinning threads burn a core between decoder steps even when idle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.reliability.overload import run_overload

SETUPS: list[tuple[str, dict[str, Any]]] = [
    ("2 threads, spinning", {"threads": 2, "thread_spinning": "true"}),
    ("2 threads, no spinning", {"threads": 2, "thread_spinning": "false"}),
    ("1 thread, spinning", {"threads": 1, "thread_spinning": "true"}),
    ("1 thread, no spinning", {"threads": 1, "thread_spinning": "false"}),
]


def run_setups(model_dir: Path, work_dir: Path, seconds: float = 25.0) -> dict[str, Any]:
    rows = []
    for index, (name, settings) in enumerate(SETUPS):
        result = run_overload(
            model_dir, work_dir / str(index), seconds, 10.0, server_settings=settings
        )
        rows.append(
            {
                "setup": name,
                "capacity_rps": result["capacity_rps"],
                "goodput_rps": result["goodput_rps"],
                "rejected_429": result["rejected_429"],
                "server_429": result["server_side"].get("429", {}),
                "admitted_200": result["admitted_200"],
                "healthz": result["healthz"],
                "5xx": result["5xx"],
                "lost": result["nothing_lost"]["lost"],
            }
        )
    return {"test": "setups", "seconds": seconds, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "## Server set-ups under overload: threads and spinning",
        "",
        "```sh",
        f".venv/bin/python -m bench.reliability setups --seconds {result['seconds']:g}",
        "```",
        "",
        "The overload run of the section above (capacity measured by 8 closed-loop clients for "
        f"10 s, then an open loop at 4x it for {result['seconds']:g} s, NMT_MAX_QUEUE_SENTENCES="
        "64), against four servers one after the other. Latencies in ms at the client, the "
        "429's also in the server's log.",
        "",
        "| set-up | capacity req/s | goodput req/s | 429 p50 | 429 p99 | 429 p99 (server) "
        "| 200 p50 | /healthz p99 | 5xx | lost |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        refused, ok, health = row["rejected_429"], row["admitted_200"], row["healthz"]
        lines.append(
            f"| {row['setup']} | {row['capacity_rps']} | {row['goodput_rps']} "
            f"| {refused['p50_ms']} | {refused['p99_ms']} | {row['server_429'].get('p99_ms')} "
            f"| {ok['p50_ms']} | {health['p99_ms']} | {row['5xx']} | {row['lost']} |"
        )
    return "\n".join(lines)
