"""`make loadtest`: start a local server, run Locust headless against it for a fixed time, stop
the server, and write the reports under reports/loadtest/: Locust's CSV files and HTML report,
and a summary (requests/s, failures, p50/p95/p99) as Markdown and JSON. Exits non-zero when any
request failed, so that CI fails with it. `--docs docs/benchmarks.md` also writes the summary
there as the "loadtest" section.

Locust runs as its own process (`locust` beside this interpreter): its gevent monkey-patching
never enters this process or the server's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DOCS_START, DOCS_END = "<!-- loadtest:start -->", "<!-- loadtest:end -->"


@dataclass
class Summary:
    requests: int
    failures: int
    requests_per_second: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    by_name: list[dict[str, float | int | str]]


def free_port() -> int:
    """A loopback port nobody listens on now. loadtest/ keeps its own (as bench/harness.py and
    tests/servers.py do theirs): `make loadtest` runs it as a script on a serving install with
    the loadtest extra, where neither bench/ nor tests/ is importable, and the product has no
    port to offer it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url: str, server: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer 200 within {timeout:.0f} s")


def percentile_ms(response_times: dict[str, int], count: int, share: float) -> float:
    """The percentile as Locust computes it (stats.calculate_response_time_percentile), so that
    the summary agrees with its HTML report. `response_times` maps a (rounded) time in ms to how
    many requests took it.
    """
    allowed_above = count - int(count * share)
    above = 0
    for time_ms, seen in sorted(((float(k), v) for k, v in response_times.items()), reverse=True):
        above += seen
        if above >= allowed_above:
            return time_ms
    return 0.0


def read_summary(stats_json: Path) -> Summary:
    """The summary of the stats Locust writes at its very end (`--json-file`).

    Its CSV files are rewritten once a second while it runs and may miss the last requests; the
    JSON file is written once, after the last one.
    """
    entries = json.loads(stats_json.read_text())
    merged: dict[str, int] = {}
    by_name: list[dict[str, float | int | str]] = []
    for entry in sorted(entries, key=lambda e: e["name"]):
        count, times = entry["num_requests"], entry["response_times"]
        for key, seen in times.items():
            merged[key] = merged.get(key, 0) + seen
        by_name.append(
            {
                "name": f"{entry['method']} {entry['name']}",
                "requests": count,
                "failures": entry["num_failures"],
                **{f"p{p}_ms": percentile_ms(times, count, p / 100) for p in (50, 95, 99)},
            }
        )
    requests = sum(entry["num_requests"] for entry in entries)
    started = min((entry["start_time"] for entry in entries), default=0.0)
    ended = max((entry["last_request_timestamp"] or 0.0 for entry in entries), default=0.0)
    return Summary(
        requests=requests,
        failures=sum(entry["num_failures"] for entry in entries),
        requests_per_second=requests / (ended - started) if ended > started else 0.0,
        p50_ms=percentile_ms(merged, requests, 0.50),
        p95_ms=percentile_ms(merged, requests, 0.95),
        p99_ms=percentile_ms(merged, requests, 0.99),
        by_name=by_name,
    )


def summary_markdown(summary: Summary, settings: dict[str, str], command: str) -> str:
    lines = [
        "## Load test (Locust)",
        "",
        f"Reproduce: `{command}`",
        "",
        "- " + "; ".join(f"{key}: {value}" for key, value in settings.items()),
        "- Locust and the server share the machine's cores; latency as Locust measures it "
        "(client side, HTTP included); p50/p95/p99 in ms",
        "",
        "| requests | failures | req/s | p50 ms | p95 ms | p99 ms |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {summary.requests} | {summary.failures} | {summary.requests_per_second:.1f} "
        f"| {summary.p50_ms:.0f} | {summary.p95_ms:.0f} | {summary.p99_ms:.0f} |",
        "",
        "| request | requests | failures | p50 ms | p95 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {row['name']} | {row['requests']} | {row['failures']} | {row['p50_ms']:.0f} "
        f"| {row['p95_ms']:.0f} | {row['p99_ms']:.0f} |"
        for row in summary.by_name
    ]
    return "\n".join(lines) + "\n"


def write_docs_section(path: Path, markdown: str) -> None:
    """Replace the loadtest section of `path` (appended when it has none)."""
    section = f"{DOCS_START}\n{markdown}{DOCS_END}\n"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(DOCS_START) + r".*?" + re.escape(DOCS_END) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    path.write_text(text)


def stop(server: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM, as an orchestrator stops it: the server finishes what it admitted, exits 0."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return server.returncode


def shown(setting: str) -> str:
    """NAME=VALUE as reports show it: the values of keys and other secrets masked."""
    name, _, value = setting.partition("=")
    secret = re.search(r"KEY|SECRET|TOKEN|PASSWORD", name, re.I)
    return f"{name}=***" if secret and value else setting


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "build" / "models")
    parser.add_argument("--users", type=int, default=8, help="concurrent Locust users")
    parser.add_argument("--spawn-rate", type=float, default=4, help="users started per second")
    parser.add_argument("--run-time", default="30s", help="Locust run time, e.g. 30s, 2m")
    parser.add_argument("--mix", help="scenario weights (locustfile.py), e.g. short=1,list=1")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "loadtest")
    parser.add_argument("--docs", type=Path, help="also write the summary into this page")
    parser.add_argument(
        "--cache",
        action="store_true",
        help="keep the server's translation cache on: the samples repeat, so most requests "
        "would then be cache hits and the test would measure the cache, not the model",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra NMT_* setting for the server (repeatable)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    port = free_port()
    host = f"http://127.0.0.1:{port}"
    server_env = {
        **os.environ,
        "NMT_MODEL_DIR": str(args.model_dir),
        "NMT_HOST": "127.0.0.1",
        "NMT_PORT": str(port),
        "NMT_ACCESS_LOG": "false",  # Locust's report has every request; keep the log readable
        **({} if args.cache else {"NMT_CACHE_ENTRIES": "0"}),
        **dict(item.split("=", 1) for item in args.server_env),
    }
    with (args.out / "server.log").open("wb") as server_log:
        server = subprocess.Popen(
            [str(BIN / "nmt"), "serve"], env=server_env, stdout=server_log, stderr=server_log
        )
        try:
            wait_ready(f"{host}/readyz", server, timeout=180)
            locust = [
                str(BIN / "locust"),
                "-f", str(ROOT / "loadtest" / "locustfile.py"),
                "--headless", "--host", host,
                "--users", str(args.users), "--spawn-rate", str(args.spawn_rate),
                "--run-time", args.run_time, "--stop-timeout", "30",
                "--csv", str(args.out / "locust"), "--html", str(args.out / "report.html"),
                "--json-file", str(args.out / "locust_stats"),
            ]  # fmt: skip
            if args.mix:
                locust += ["--mix", args.mix]
            locust_rc = subprocess.run(locust, cwd=ROOT, check=False).returncode
        finally:
            server_rc = stop(server, timeout=60)

    summary = read_summary(args.out / "locust_stats.json")
    settings = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, "
        f"load average before the run {load_before}",
        "users": str(args.users),
        "run time": args.run_time,
        "mix": args.mix or "locustfile default (short=6, paragraph=2, list=1, libre=1)",
        "translation cache": "on" if args.cache else "off (NMT_CACHE_ENTRIES=0)",
        "other server settings": ", ".join(map(shown, args.server_env)) or "defaults",
    }
    command = f"make loadtest LOADTEST_USERS={args.users} LOADTEST_TIME={args.run_time}"
    extra = [f"--mix {args.mix}"] if args.mix else []
    extra += ["--cache"] if args.cache else []
    extra += [f"--server-env {shown(item)}" for item in args.server_env]
    if extra:
        command += f" LOADTEST_ARGS='{' '.join(extra)}'"
    markdown = summary_markdown(summary, settings, command)
    (args.out / "summary.md").write_text(markdown)
    (args.out / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    if args.docs:
        write_docs_section(args.docs, markdown)
    print(markdown)
    print(f"reports: {args.out} (report.html, locust_*.csv, summary.md, server.log)")

    problems = []
    if summary.requests == 0:
        problems.append("no request was sent")
    if summary.failures:
        problems.append(
            f"{summary.failures} request(s) failed (see {args.out}/locust_failures.csv)"
        )
    if locust_rc != 0:
        problems.append(f"locust exited with {locust_rc}")
    if server_rc != 0:
        problems.append(f"the server exited with {server_rc} after SIGTERM")
    for problem in problems:
        print(f"loadtest FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
