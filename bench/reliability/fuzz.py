"""schemathesis against the live OpenAPI document: every operation, every check.

The CLI (not the Python API) so that the command in the report is exactly what a reader can
run against any server; its NDJSON event stream holds every request and response, which is
where the status counts and the "nothing lost" count come from.
"""

from __future__ import annotations

import base64
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness import running_server
from bench.reliability.report import inline, lost_cell

# What each schemathesis check is about, for the report.
SERVER_ERROR_CHECKS = {"not_a_server_error"}
CONFORMANCE_CHECKS = {
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
}


def schemathesis_binary() -> str:
    beside = Path(sys.executable).parent / "schemathesis"
    return str(beside) if beside.exists() else (shutil.which("schemathesis") or "schemathesis")


def schemathesis_command(
    url: str, max_examples: int, seed: int, workers: int, report_dir: Path, max_time: int | None
) -> list[str]:
    # --max-time makes schemathesis repeat its generation cycles until the budget is spent:
    # one cycle stops at about 1,000 cases here, whatever --max-examples says.
    budget = ["--max-time", str(max_time)] if max_time else []
    return [
        schemathesis_binary(), "run", f"{url}/openapi.json",
        "--checks", "all",
        "--max-examples", str(max_examples),
        "--seed", str(seed),
        "--workers", str(workers),
        "--continue-on-failure",
        "--max-failures", "100000",
        "--request-timeout", "60",
        "--generation-database", "none",
        "--no-color",
        "--report", "ndjson,json",
        *budget,
        "--report-dir", str(report_dir),
    ]  # fmt: skip


def run_schemathesis(
    model_dir: Path,
    work_dir: Path,
    max_examples: int = 400,
    seed: int = 1,
    workers: int = 2,
    max_time: int | None = None,
) -> dict[str, Any]:
    report_dir = (work_dir / "schemathesis").resolve()
    # As a production server runs: model administration behind an admin key the fuzzer does
    # not have (else its stateful tests unload the model they found in /v1/models, and every
    # translation after is a 404 or a readiness 503).
    with running_server(model_dir, work_dir, admin_keys="fuzz-has-no-admin-key") as server:
        command = schemathesis_command(
            server.url, max_examples, seed, workers, report_dir, max_time
        )
        started = time.monotonic()
        # in the work folder: schemathesis keeps a .schemathesis/ cache where it runs
        finished = subprocess.run(
            command, cwd=report_dir.parent, capture_output=True, text=True, check=False
        )
        seconds = time.monotonic() - started
        (work_dir / "schemathesis.out").write_text(finished.stdout + finished.stderr)
        events = _read_events(report_dir)
        tally = _tally(events)
        error_lines = server.error_lines()
    shown = [Path(command[0]).name, *command[1:]]
    shown[2] = "http://127.0.0.1:PORT/openapi.json"
    shown[-1] = "REPORT_DIR"
    return {
        "test": "schemathesis",
        "max_examples": max_examples,
        "max_time": max_time,
        "command": shlex.join(shown),
        "exit_code": finished.returncode,
        "seconds": round(seconds, 1),
        **tally,
        "server_error_log": error_lines,
        "nothing_lost": {
            "sent": tally["requests"],
            "answered": tally["requests"] - tally["no_response"],
            "lost": tally["no_response"],
        },
    }


def _read_events(report_dir: Path) -> list[dict[str, Any]]:
    newest = max(report_dir.glob("ndjson-*.ndjson"), key=lambda p: p.stat().st_mtime)
    return [json.loads(line) for line in newest.read_text().splitlines() if line.strip()]


def _tally(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests, statuses and failed checks, from the recorder of every finished scenario."""
    statuses: Counter[str] = Counter()
    operations: Counter[str] = Counter()
    failed_checks: Counter[str] = Counter()
    examples: dict[str, str] = {}
    no_response = 0
    for event in events:
        scenario = event.get("ScenarioFinished")
        if not scenario:
            continue
        recorder = scenario["recorder"]
        for interaction in recorder.get("interactions", {}).values():
            operations[recorder["label"]] += 1
            response = interaction.get("response")
            if response is None:
                no_response += 1
            else:
                statuses[str(response["status_code"])] += 1
        interactions = recorder.get("interactions", {})
        for case_id, checks in recorder.get("checks", {}).items():
            for check in checks:
                if check["status"] != "failure":
                    continue
                failure = check["failure_info"]["failure"]
                key = f"{check['name']}: {failure['title']} ({failure['operation']})"
                failed_checks[key] += 1
                if key not in examples and case_id in interactions:
                    examples[key] = _example(interactions[case_id])
    return {
        "requests": sum(operations.values()),
        "operations": dict(sorted(operations.items())),
        "statuses": dict(sorted(statuses.items())),
        "no_response": no_response,
        "server_errors": sum(n for s, n in statuses.items() if s.startswith("5")),
        "failed_server_error_checks": _count(failed_checks, SERVER_ERROR_CHECKS),
        "failed_conformance_checks": _count(failed_checks, CONFORMANCE_CHECKS),
        "failed_checks": dict(failed_checks.most_common()),
        "failure_examples": examples,
    }


def _decoded(payload: dict[str, Any] | None, limit: int = 120) -> str:
    if not payload:
        return ""
    data = base64.b64decode(payload["$base64"]) if "$base64" in payload else b""
    return data[:limit].decode("utf-8", "replace").replace("|", "\\|").replace("\n", " ")


def _example(interaction: dict[str, Any]) -> str:
    """The request and the answer of one failing case, short enough for a table cell."""
    request, response = interaction["request"], interaction.get("response") or {}
    answer = f"{response.get('status_code')} `{_decoded(response.get('content'))}`"
    sent = f"{request['method']} {request['uri'].split('/', 3)[-1]}"
    return f"{answer} to {sent} `{_decoded(request.get('body'))}`"


def _count(failed: Counter[str], names: set[str]) -> int:
    return sum(n for key, n in failed.items() if key.split(":")[0] in names)


def markdown(result: dict[str, Any]) -> str:
    budget = f" --max-time {result['max_time']}" if result.get("max_time") else ""
    checks = "\n".join(
        f"| {key} | {count} | {result['failure_examples'].get(key, '')} |"
        for key, count in result["failed_checks"].items()
    )
    lost = result["nothing_lost"]
    return f"""## schemathesis: every operation of the live OpenAPI document

```sh
.venv/bin/python -m bench.reliability schemathesis --max-examples {result["max_examples"]}{budget}
# runs, against a fresh `nmt serve`:
{result["command"]}
```

| | target | measured |
|---|---|---|
| requests (test cases sent) | at least 2000 | {result["requests"]} |
| server errors (5xx) | 0 | {result["server_errors"]} |
| failed response-conformance checks | 0 | {result["failed_conformance_checks"]} |
| nothing lost | 0 lost | {lost_cell(lost)} |

Requests per operation: {inline(result["operations"])}. Statuses: {inline(result["statuses"])}.
Run time {result["seconds"]} s, schemathesis exit code {result["exit_code"]}.

Every failed check (all checks ran; "count" is test cases):

| check | count | example |
|---|---|---|
{checks or "| (none) | 0 | |"}
"""
