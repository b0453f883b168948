"""SIGTERM under load: closed-loop clients keep sending while the server is told to stop, once
with a shutdown timeout long enough to finish everything and once with one that runs out while
big requests are still being decoded.

"Admitted" is the server's own record: a request that reached the app has exactly one access
log line (status 499 when no answer was sent). Every admitted request must have had an answer;
requests sent after the signal may also be refused a connection, which the test causes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import Server, running_server
from bench.reliability.report import inline, lost_cell
from bench.reliability.traffic import (
    JSON,
    Outcome,
    client_limits,
    nothing_lost,
    send,
    server_errors,
    status_counts,
    translate_body,
)

CLIENT_TIMEOUT_SECONDS = 120.0

# name: (server settings, clients, request body, seconds of load before the signal). The cache
# is off: each request repeats its sentences, and only decoding keeps requests in flight.
RUNS: dict[str, tuple[dict[str, object], int, bytes, float]] = {
    # Small requests; 30 s is plenty to finish what was admitted.
    "within the shutdown timeout": (
        {"shutdown_timeout_seconds": 30, "request_timeout_seconds": 60, "cache_entries": 0},
        8,
        translate_body(4),
        3.0,
    ),
    # 64 sentences at beam 8 take seconds each on 2 cores; 1 s cannot finish them.
    "past the shutdown timeout": (
        {"shutdown_timeout_seconds": 1, "request_timeout_seconds": 60, "cache_entries": 0},
        4,
        translate_body(64, beam_size=8),
        2.0,
    ),
}


async def _load_and_signal(
    server: Server, body: bytes, clients: int, signal_after: float, exit_timeout: float
) -> tuple[list[Outcome], float, int | None]:
    """Clients send until the server process has exited; the signal comes in the middle."""
    outcomes: list[Outcome] = []
    stop = asyncio.Event()
    limits = client_limits(clients)
    async with httpx.AsyncClient(
        base_url=server.url, timeout=CLIENT_TIMEOUT_SECONDS, limits=limits
    ) as client:

        async def one_client() -> None:
            while not stop.is_set():
                outcome = await send(client, "native", "POST", "/v1/translate", content=body,
                                     headers=JSON)  # fmt: skip
                outcomes.append(outcome)
                if not outcome.answered:  # refused: the server is going; knock less often
                    await asyncio.sleep(0.05)

        async def conductor() -> tuple[float, int | None]:
            await asyncio.sleep(signal_after)
            signalled_at = time.monotonic()
            server.signal_terminate()
            exit_code = await asyncio.to_thread(server.wait_exit, exit_timeout)
            stop.set()
            return signalled_at, exit_code

        *_, (signalled_at, exit_code) = await asyncio.gather(
            *(one_client() for _ in range(clients)), conductor()
        )
    return outcomes, signalled_at, exit_code


def sigterm_run(model_dir: Path, work_dir: Path, name: str) -> dict[str, Any]:
    settings, clients, body, signal_after = RUNS[name]
    exit_timeout = float(settings["shutdown_timeout_seconds"]) + 60  # type: ignore[arg-type]
    with running_server(model_dir, work_dir, **settings) as server:
        outcomes, signalled_at, exit_code = asyncio.run(
            _load_and_signal(server, body, clients, signal_after, exit_timeout)
        )
        exited_after = time.monotonic() - signalled_at
        logged = server.access_log_ids()
        lost = nothing_lost(outcomes, server, excused=lambda o: logged[o.request_id] == 0)
        lines = [r for r in server.log_records() if r.get("logger") in ("nmt.app", "nmt.server")]
        error_lines = server.error_lines()
    before = [o for o in outcomes if o.sent_at < signalled_at]
    after = [o for o in outcomes if o.sent_at >= signalled_at]
    return {
        "test": "sigterm",
        "run": name,
        "settings": {**server.settings, "clients": clients, "signal_after_s": signal_after},
        "exit_code": exit_code,
        "exit_seconds_after_signal": round(exited_after, 2),
        "admitted": sum(1 for o in outcomes if logged[o.request_id] > 0),
        "in_flight_at_signal": sum(
            1 for o in before if o.sent_at + o.seconds > signalled_at and logged[o.request_id]
        ),
        "statuses_sent_before_signal": status_counts(before),
        "statuses_sent_after_signal": status_counts(after),
        # sent before the signal yet never reached the app: a keep-alive connection closed
        # by the server as idle just as the request was on its way
        "unanswered_before_signal_not_admitted": sum(
            1 for o in before if not o.answered and logged[o.request_id] == 0
        ),
        **server_errors(outcomes),
        "unexpected_5xx_details": [o.detail for o in outcomes if o.status == 500][:3],
        "shutdown_log": [str(r.get("message")) for r in lines][-4:],
        "server_error_log": error_lines,
        "nothing_lost": lost,
    }


def run_sigterm(model_dir: Path, work_dir: Path, runs: list[str] | None = None) -> dict[str, Any]:
    results = [sigterm_run(model_dir, work_dir, name) for name in runs or list(RUNS)]
    return {"test": "sigterm", "runs": results}


HEADER = (
    "| run | exit code | exit after signal (s) | admitted | of which in flight at the signal "
    "| admitted, no answer "
    "| 5xx (all / not 503 or 504) | answers to requests sent before the signal | after it "
    "| nothing lost |\n" + "|---" * 10 + "|"
)


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for run in result["runs"]:
        s, lost = run["settings"], run["nothing_lost"]
        rows.append(
            f"| {run['run']} (`NMT_SHUTDOWN_TIMEOUT_SECONDS={s['NMT_SHUTDOWN_TIMEOUT_SECONDS']}`, "
            f"{s['clients']} clients) | {run['exit_code']} | {run['exit_seconds_after_signal']} "
            f"| {run['admitted']} | {run['in_flight_at_signal']} | {lost['lost']} "
            f"| {run['5xx']} / {run['unexpected_5xx']} "
            f"| {inline(run['statuses_sent_before_signal'])} "
            f"| {inline(run['statuses_sent_after_signal'])} | {lost_cell(lost)} |"
        )
    logs = "\n".join(
        f"- {run['run']}: " + "; ".join(f"`{line}`" for line in run["shutdown_log"])
        for run in result["runs"]
    )
    return f"""## SIGTERM under load

```sh
.venv/bin/python -m bench.reliability sigterm
```

Closed-loop clients send translation requests without pause; after a few seconds the server
gets SIGTERM and the clients keep sending until it has exited. "Within": 4 one-sentence texts
per request. "Past": 64 texts at beam 8 per request, seconds of decoding each, with a 1 s
shutdown timeout. Targets: exit 0, 0 admitted requests without an answer, no 5xx but the 503 of
a server shutting down.

{HEADER}
{chr(10).join(rows)}

The server's last log lines of each run:

{logs}
"""
