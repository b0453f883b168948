"""Scale-out on one machine: `nmt serve` processes behind nginx, as replicas behind a
Kubernetes Service, everything on 127.0.0.1. Three measurements, each writing a section of
docs/scaling.md with `--docs`:

  restart   rolling restart under Locust load (loadtest/locustfile.py): each server in turn
            is taken out of nginx's upstream (a reload: what a readiness probe failing before
            SIGTERM does to a Service), stopped with SIGTERM, started again and put back.
            Reports failed requests (the goal: none) and latency in each phase, from nginx's
            access log.
  replicas  throughput of 1 process with 2 threads against 2 processes with 1 thread each,
            cores split (taskset), measured alternately in one run; medians of the repetitions.
  coldstart process start to /healthz (imports) and to /readyz (model load and warm-up).

  .venv/bin/python -m bench.scaleout restart --docs docs/scaling.md

Servers run with NMT_CACHE_ENTRIES=0: the load repeats its sentences, and the translation
cache would answer them without translating. Needs nginx (Debian package `nginx`) and, for
`restart`, Locust (`pip install -e '.[loadtest]'`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench import harness
from bench.harness import ROOT, Server, ensure_bundle, free_port

BIN = Path(sys.executable).parent
# Settings of every measured server: no cache (see the module docstring), no per-request log.
SERVER_SETTINGS = {"cache_entries": "0", "access_log": "false"}


def nginx_binary() -> str | None:
    """nginx from PATH or Debian's /usr/sbin (not on a normal user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


# --- servers -------------------------------------------------------------------------------


def start_server(
    model_dir: Path, log_dir: Path, threads: int, cpus: str | None = None, workers: int = 1
) -> Server:
    """`nmt serve` on a free loopback port; `cpus` pins it (taskset) to split the cores;
    `workers`: its model's decoding threads (NMT_DECODING_WORKERS)."""
    prefix = ["taskset", "-c", cpus] if cpus is not None else []
    settings = {**SERVER_SETTINGS, "decoding_workers": workers}
    return harness.start_server(model_dir, log_dir, prefix=prefix, threads=threads, **settings)


def wait_for(server: Server, path: str) -> float:
    """Seconds until `path` answers 200 (the server is polled every 50 ms)."""
    return server.wait_for(path, every=0.05)


def host_port(server: Server) -> str:
    return server.url.removeprefix("http://")


# --- nginx ---------------------------------------------------------------------------------

# $msec: when the answer was sent (epoch seconds), $request_time: seconds since the request's
# first byte; $upstream_addr tells which server answered.
NGINX_CONF = """\
worker_processes 1;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    log_format timing '$msec $request_time $status $upstream_addr';
    access_log {dir}/access.log timing;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{servers}
}}
"""
NGINX_SITE = """\
    upstream {name} {{
{members}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_timeout {client_keepalive};
        location / {{
            proxy_pass http://{name};
            # Keep-alive connections to the servers, as a Service's proxies keep them.
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_read_timeout 120s;
        }}
    }}
"""


class Nginx:
    """An nginx of our own (no root needed, nothing outside its temp dir), in the foreground.
    Each site is a port with an upstream of servers; `set_upstream` changes one and reloads."""

    def __init__(
        self, workdir: Path, sites: dict[str, list[Server]], client_keepalive: bool = True
    ) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (Debian package `nginx`)")
        self.binary = binary
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        # Started as root, nginx runs its workers as an unprivileged user: they must reach it.
        self.dir.chmod(0o755)
        self.sites = dict(sites)
        # A reload closes the idle keep-alive connections of clients; one that sent a request
        # on such a connection at that moment gets no answer at all (Locust: status 0; about 1
        # in 700 requests with a reload every 0.3 s), which says nothing of the servers behind.
        # A Service's proxies (kube-proxy) do not reload, ingress-nginx changes endpoints
        # without a reload: runs that reload turn client keep-alive off (nginx's 0).
        self.client_keepalive = "75s" if client_keepalive else "0"
        self.ports = {name: free_port() for name in sites}
        self.access_log = self.dir / "access.log"
        self._write_conf()
        self.process = subprocess.Popen(
            [*self._args(), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait_listening()

    def _args(self) -> list[str]:
        # -e: the error log from the very start (before the config is read, nginx would try
        # the compiled-in /var/log/nginx/error.log).
        return [self.binary, "-p", str(self.dir), "-c", str(self.conf), "-e", str(self.error_log)]

    @property
    def error_log(self) -> Path:
        return self.dir / "error.log"

    @property
    def conf(self) -> Path:
        return self.dir / "nginx.conf"

    def url(self, site: str) -> str:
        return f"http://127.0.0.1:{self.ports[site]}"

    def _write_conf(self) -> None:
        sites = []
        for name, servers in self.sites.items():
            members = "\n".join(f"        server {host_port(s)};" for s in servers)
            sites.append(
                NGINX_SITE.format(
                    name=name,
                    members=members,
                    port=self.ports[name],
                    client_keepalive=self.client_keepalive,
                )
            )
        self.conf.write_text(NGINX_CONF.format(dir=self.dir, servers="".join(sites)))

    def _wait_listening(self) -> None:
        for _ in range(100):
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.process.stderr.read().decode()}")
            try:
                httpx.get(self.url(next(iter(self.sites))) + "/healthz", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start listening")

    def workers(self) -> set[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return {int(pid) for pid in children.read_text().split()}

    def set_upstream(self, site: str, servers: list[Server]) -> None:
        """Rewrite the site's upstream and reload; returns once new workers run the new config.

        Old workers finish the requests they hold (including those on a server just removed)
        and exit on their own: the graceful reload is what lets a removed server drain."""
        self.sites[site] = list(servers)
        self._write_conf()
        check = subprocess.run(
            [*self._args(), "-t", "-q"],
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t: {check.stderr}")
        before = self.workers()
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not (self.workers() - before):
            if time.monotonic() > deadline:
                raise RuntimeError("nginx did not start workers with the new config")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful: finish what is in flight
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Logged:
    at: float  # epoch seconds the answer went out
    seconds: float
    status: int
    upstream: str


def read_access_log(path: Path) -> list[Logged]:
    entries = []
    for line in path.read_text().splitlines():
        at, seconds, status, upstream = line.split(" ", 3)
        entries.append(Logged(float(at), float(seconds), int(status), upstream))
    return entries


# --- statistics ----------------------------------------------------------------------------


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile (no interpolation: a value that was measured)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * share // 1))
    return ordered[int(rank) - 1]


@dataclass
class PhaseStats:
    phase: str
    seconds: float
    requests: int
    not_ok: int  # answered, but not 200 (nginx saw it)
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    by_upstream: dict[str, int] = field(default_factory=dict)


def phase_stats(phase: str, start: float, end: float, entries: list[Logged]) -> PhaseStats:
    inside = [e for e in entries if start <= e.at < end]
    ms = [e.seconds * 1000 for e in inside]
    by_upstream: dict[str, int] = {}
    for entry in inside:
        by_upstream[entry.upstream] = by_upstream.get(entry.upstream, 0) + 1
    return PhaseStats(
        phase=phase,
        seconds=round(end - start, 1),
        requests=len(inside),
        not_ok=sum(e.status != 200 for e in inside),
        p50_ms=percentile(ms, 0.50),
        p95_ms=percentile(ms, 0.95),
        p99_ms=percentile(ms, 0.99),
        max_ms=max(ms, default=float("nan")),
        by_upstream=by_upstream,
    )


# --- rolling restart -----------------------------------------------------------------------


@dataclass
class RestartReport:
    when: str
    machine: str
    settings: dict[str, str | int | float]
    locust_requests: int
    locust_failures: int
    locust_exit: int
    exit_codes: list[int | None]  # each SIGTERM'd server's exit code (0: drained)
    restarts: list[dict[str, float]]  # per server: seconds out of the upstream, ready after
    phases: list[PhaseStats]
    nginx_not_ok: int


def rolling_restart(
    model_dir: Path,
    out: Path,
    users: int,
    mix: str | None,
    steady_seconds: float,
    endpoint_delay_seconds: float,
) -> RestartReport:
    """Both servers serve under load; then each in turn: out of the upstream, a pause (the
    preStop sleep: endpoints take time to reach every proxy), SIGTERM, wait for its exit,
    start it again, wait for /readyz, back into the upstream."""
    out.mkdir(parents=True, exist_ok=True)
    servers = [start_server(model_dir, out, threads=1) for _ in range(2)]
    nginx: Nginx | None = None
    locust: subprocess.Popen[bytes] | None = None
    marks: list[tuple[str, float]] = []  # (phase starting, epoch seconds)
    exit_codes: list[int | None] = []
    restarts: list[dict[str, float]] = []
    try:
        for server in servers:
            wait_for(server, "/readyz")
        nginx = Nginx(out / "nginx", {"app": servers}, client_keepalive=False)
        locust = start_locust(nginx.url("app"), out, users, mix)
        time.sleep(3)  # users spawned (spawn rate = users per second)
        marks.append(("steady, 2 servers", time.time()))
        time.sleep(steady_seconds)
        for index in range(len(servers)):
            name = "ab"[index]
            others = [s for i, s in enumerate(servers) if i != index]
            marks.append((f"restart of {name}", time.time()))
            taken_out = time.monotonic()
            nginx.set_upstream("app", others)
            time.sleep(endpoint_delay_seconds)
            exit_codes.append(servers[index].stop())
            stopped = time.monotonic()
            servers[index] = start_server(model_dir, out, threads=1)
            ready = wait_for(servers[index], "/readyz")
            nginx.set_upstream("app", servers)
            restarts.append(
                {
                    "drain_seconds": round(stopped - taken_out - endpoint_delay_seconds, 2),
                    "ready_seconds": round(ready, 2),
                    "out_seconds": round(time.monotonic() - taken_out, 2),
                }
            )
            marks.append((f"after {name}, 2 servers", time.time()))
            time.sleep(steady_seconds)
        marks.append(("end", time.time()))
    finally:
        if locust is not None and locust.poll() is None:
            locust.send_signal(signal.SIGTERM)  # Locust writes its JSON stats on SIGTERM
            locust.wait(60)
        if nginx is not None:
            nginx.stop()
        for server in servers:
            server.stop()

    stats = json.loads((out / "locust_stats.json").read_text())
    entries = read_access_log(out / "nginx" / "access.log")
    phases = [
        phase_stats(name, start, end, entries)
        for (name, start), (_, end) in itertools.pairwise(marks)
    ]
    return RestartReport(
        when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=machine(),
        settings={
            "servers": "2 x `nmt serve`, NMT_THREADS=1, NMT_CACHE_ENTRIES=0",
            "users": users,
            "mix": mix or "locustfile default (short=6, paragraph=2, list=1, libre=1)",
            "pause before SIGTERM (preStop)": endpoint_delay_seconds,
        },
        locust_requests=sum(e["num_requests"] for e in stats),
        locust_failures=sum(e["num_failures"] for e in stats),
        locust_exit=locust.returncode if locust is not None else -1,
        exit_codes=exit_codes,
        restarts=restarts,
        phases=phases,
        nginx_not_ok=sum(e.status != 200 for e in entries),
    )


def start_locust(host: str, out: Path, users: int, mix: str | None) -> subprocess.Popen[bytes]:
    """Locust headless as its own process (its gevent patching stays out of ours); it runs
    until SIGTERM, with a run time only as a backstop."""
    command = [
        str(BIN / "locust"),
        "-f", str(ROOT / "loadtest" / "locustfile.py"),
        "--headless", "--host", host, "--users", str(users), "--spawn-rate", str(users),
        "--run-time", "15m", "--stop-timeout", "30",
        "--json-file", str(out / "locust_stats"), "--only-summary",
    ]  # fmt: skip
    if mix:
        command += ["--mix", mix]
    log = open(out / "locust.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def restart_markdown(report: RestartReport, command: str) -> str:
    lines = [
        "### Rolling restart (measured)",
        "",
        f"Reproduce: `{command}` ({report.when}; {report.machine})",
        "",
        "- " + "; ".join(f"{k}: {v}" for k, v in report.settings.items()),
        f"- Locust: **{report.locust_requests} requests, {report.locust_failures} failed**; "
        f"nginx answered {report.nginx_not_ok} with a status other than 200; "
        f"servers' exit codes after SIGTERM: {report.exit_codes}",
        "- per server restarted: "
        + "; ".join(
            f"{'ab'[i]}: drained in {r['drain_seconds']} s after the pause, ready "
            f"{r['ready_seconds']} s after its start, {r['out_seconds']} s out of the upstream"
            for i, r in enumerate(report.restarts)
        ),
        "- latency at nginx (request in to answer out), ms:",
        "",
        "| phase | seconds | requests | not 200 | p50 | p95 | p99 | max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {p.phase} | {p.seconds:.0f} | {p.requests} | {p.not_ok} | {p.p50_ms:.0f} "
        f"| {p.p95_ms:.0f} | {p.p99_ms:.0f} | {p.max_ms:.0f} |"
        for p in report.phases
    ]
    return "\n".join(lines) + "\n"


# --- throughput with 1 and 2 processes -----------------------------------------------------


@dataclass
class LoadResult:
    seconds: float
    requests: int
    sentences: int
    failures: int
    p50_ms: float
    p95_ms: float


async def _closed_loop(
    url: str, seconds: float, concurrency: int, sentences: int, beam: int
) -> LoadResult:
    from loadtest.samples import SHORT_SENTENCES, batch_of_texts

    latencies: list[float] = []
    failures = 0
    deadline = time.monotonic() + seconds

    async def client(index: int, http: httpx.AsyncClient) -> None:
        nonlocal failures
        turn = index
        while time.monotonic() < deadline:
            texts = batch_of_texts(turn % len(SHORT_SENTENCES), sentences)
            turn += concurrency
            body = {"text": texts, "source_lang": "fr", "target_lang": "en", "beam_size": beam}
            started = time.monotonic()
            try:
                response = await http.post(f"{url}/v1/translate", json=body)
                ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.monotonic() - started)
            else:
                failures += 1

    started = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await asyncio.gather(*(client(i, http) for i in range(concurrency)))
    elapsed = time.monotonic() - started
    ms = [s * 1000 for s in latencies]
    return LoadResult(
        seconds=round(elapsed, 2),
        requests=len(latencies),
        sentences=len(latencies) * sentences,
        failures=failures,
        p50_ms=percentile(ms, 0.5),
        p95_ms=percentile(ms, 0.95),
    )


def run_load(url: str, seconds: float, concurrency: int, sentences: int, beam: int) -> LoadResult:
    """The closed-loop load generator, in its own process: its CPU time is not ours."""
    command = [
        sys.executable, "-m", "bench.scaleout", "load", "--url", url, "--seconds", str(seconds),
        "--concurrency", str(concurrency), "--sentences", str(sentences), "--beam", str(beam),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return LoadResult(**json.loads(done.stdout.splitlines()[-1]))


@dataclass
class ReplicasReport:
    when: str
    machine: str
    settings: dict[str, str | int | float]
    runs: dict[str, list[LoadResult]]

    def median(self, layout: str, name: str) -> float:
        return statistics.median(getattr(run, name) for run in self.runs[layout])

    def sentences_per_second(self, layout: str) -> float:
        return statistics.median(r.sentences / r.seconds for r in self.runs[layout])


# Per layout, its servers: (engine threads, cores, decoding workers)
LAYOUTS = {
    "1 process x 1 thread (the default on 2 cores)": [(1, "0,1", 1)],
    "1 process x 2 threads": [(2, "0,1", 1)],
    "1 process x 2 decoding workers of 1 thread": [(1, "0,1", 2)],
    "2 processes x 1 thread": [(1, "0", 1), (1, "1", 1)],
}


def replicas(
    model_dir: Path, out: Path, repeats: int, seconds: float, concurrency: int, beam: int
) -> ReplicasReport:
    """Both layouts run at once (idle servers cost nothing), each behind its own nginx port;
    the load alternates between them, so that slow drifts of the machine hit both alike."""
    out.mkdir(parents=True, exist_ok=True)
    if os.cpu_count() is None or os.cpu_count() < 2:
        raise RuntimeError("the core split needs 2 cores")
    layouts = {
        name: [
            start_server(model_dir, out, threads, cpus, workers) for threads, cpus, workers in spec
        ]
        for name, spec in LAYOUTS.items()
    }
    sentences = 8
    runs: dict[str, list[LoadResult]] = {name: [] for name in layouts}
    nginx = None
    try:
        for servers in layouts.values():
            for server in servers:
                wait_for(server, "/readyz")
        sites = {f"layout{i}": servers for i, servers in enumerate(layouts.values())}
        nginx = Nginx(out / "nginx", sites)
        urls = {name: nginx.url(f"layout{i}") for i, name in enumerate(layouts)}
        for name in layouts:  # one short untimed round each: connections, first batches
            run_load(urls[name], 2, concurrency, sentences, beam)
        for _ in range(repeats):
            for name in layouts:
                runs[name].append(run_load(urls[name], seconds, concurrency, sentences, beam))
    finally:
        if nginx is not None:
            nginx.stop()
        for servers in layouts.values():
            for server in servers:
                server.stop()
    return ReplicasReport(
        when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=machine(),
        settings={
            "request": f"{sentences} short sentences, beam {beam}",
            "concurrent clients": concurrency,
            "seconds per run": seconds,
            "repetitions": repeats,
            "server settings": "NMT_CACHE_ENTRIES=0, others default",
        },
        runs=runs,
    )


def replicas_markdown(report: ReplicasReport, command: str) -> str:
    lines = [
        "### 1 and 2 processes on 2 cores (measured)",
        "",
        f"Reproduce: `{command}` ({report.when}; {report.machine})",
        "",
        "- " + "; ".join(f"{k}: {v}" for k, v in report.settings.items()),
        "- both behind nginx on 127.0.0.1; each process pinned to its cores with taskset; "
        "the load generator (asyncio + httpx, closed loop) and nginx share the same 2 cores",
        "",
        "| layout | sentences/s (median) | requests | failures | p50 ms | p95 ms | runs, sent./s |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, runs in report.runs.items():
        each = ", ".join(f"{r.sentences / r.seconds:.0f}" for r in runs)
        lines.append(
            f"| {name} | **{report.sentences_per_second(name):.1f}** "
            f"| {sum(r.requests for r in runs)} | {sum(r.failures for r in runs)} "
            f"| {report.median(name, 'p50_ms'):.0f} | {report.median(name, 'p95_ms'):.0f} "
            f"| {each} |"
        )
    return "\n".join(lines) + "\n"


# --- cold start ----------------------------------------------------------------------------


def cold_start(model_dir: Path, out: Path, repeats: int, threads: int) -> dict[str, list[float]]:
    """Seconds from the process start to /healthz (Python and the packages imported, the app
    up) and to /readyz (every model loaded and warmed up), and the load time the server itself
    reports (nmt_model_load_seconds: load + warm-up of the model)."""
    result: dict[str, list[float]] = {"healthz": [], "readyz": [], "model_load": []}
    for _ in range(repeats):
        server = start_server(model_dir, out, threads=threads)
        try:
            result["healthz"].append(round(wait_for(server, "/healthz"), 2))
            result["readyz"].append(round(wait_for(server, "/readyz"), 2) + result["healthz"][-1])
            metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
            found = re.search(r"^nmt_model_load_seconds\{[^}]*\} ([0-9.e+-]+)$", metrics, re.M)
            result["model_load"].append(round(float(found.group(1)), 2) if found else float("nan"))
        finally:
            server.stop()
    return result


def cold_start_markdown(result: dict[str, list[float]], threads: int, command: str) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = {
        "process start to /healthz (interpreter, imports, app)": "healthz",
        "process start to /readyz (+ model load and warm-up)": "readyz",
        "model load and warm-up alone (nmt_model_load_seconds)": "model_load",
    }
    lines = [
        "### Cold start of the process (measured)",
        "",
        f"Reproduce: `{command}` ({when}; {machine()}; NMT_THREADS={threads}, fr-en bundle)",
        "",
        "| step | median s | runs |",
        "|---|---:|---|",
    ]
    lines += [
        f"| {label} | **{statistics.median(result[key]):.2f}** "
        f"| {', '.join(f'{v:.2f}' for v in result[key])} |"
        for label, key in rows.items()
    ]
    return "\n".join(lines) + "\n"


# --- reporting and command line ------------------------------------------------------------


def machine() -> str:
    load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    return f"{os.cpu_count()} cores, load average {load} at the end"


def write_docs_section(path: Path, name: str, markdown: str) -> None:
    """Replace the `name` section of `path` (between its markers; appended when absent)."""
    start, end = f"<!-- scaleout:{name}:start -->", f"<!-- scaleout:{name}:end -->"
    section = f"{start}\n{markdown}{end}\n"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    path.write_text(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("restart", "replicas", "coldstart"):
        sub = commands.add_parser(name)
        sub.add_argument("--model-dir", type=Path, default=ROOT / "build" / "models")
        sub.add_argument("--out", type=Path, default=ROOT / "reports" / "scaleout" / name)
        sub.add_argument("--docs", type=Path, help="write the result into this page")
        if name == "restart":
            sub.add_argument("--users", type=int, default=8)
            sub.add_argument("--mix", help="Locust scenario weights (loadtest/locustfile.py)")
            sub.add_argument("--steady-seconds", type=float, default=8)
            sub.add_argument("--pause-seconds", type=float, default=2, help="preStop pause")
        if name == "replicas":
            sub.add_argument("--repeats", type=int, default=3)
            sub.add_argument("--seconds", type=float, default=10)
            sub.add_argument("--concurrency", type=int, default=16)
            sub.add_argument("--beam", type=int, default=1)
        if name == "coldstart":
            sub.add_argument("--repeats", type=int, default=3)
            sub.add_argument("--threads", type=int, default=1)
    load = commands.add_parser("load", help="(internal) the closed-loop load generator")
    load.add_argument("--url", required=True)
    load.add_argument("--seconds", type=float, required=True)
    load.add_argument("--concurrency", type=int, required=True)
    load.add_argument("--sentences", type=int, required=True)
    load.add_argument("--beam", type=int, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "load":
        result = asyncio.run(
            _closed_loop(args.url, args.seconds, args.concurrency, args.sentences, args.beam)
        )
        print(json.dumps(asdict(result)))
        return 0
    if nginx_binary() is None and args.command != "coldstart":
        print("nginx is not installed (Debian package `nginx`)", file=sys.stderr)
        return 2
    model_dir = ensure_bundle(args.model_dir)
    command = "python -m bench.scaleout " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.command == "restart":
        report = rolling_restart(
            model_dir, args.out, args.users, args.mix, args.steady_seconds, args.pause_seconds
        )
        markdown = restart_markdown(report, command)
        (args.out / "report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
        ok = report.locust_failures == 0 and report.nginx_not_ok == 0
        ok = ok and all(code == 0 for code in report.exit_codes)
    elif args.command == "replicas":
        result = replicas(
            model_dir, args.out, args.repeats, args.seconds, args.concurrency, args.beam
        )
        markdown = replicas_markdown(result, command)
        (args.out / "report.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
        ok = all(r.failures == 0 for runs in result.runs.values() for r in runs)
    else:
        times = cold_start(model_dir, args.out, args.repeats, args.threads)
        markdown = cold_start_markdown(times, args.threads, command)
        (args.out / "report.json").write_text(json.dumps(times, indent=2) + "\n")
        ok = True
    print(markdown)
    if args.docs:
        write_docs_section(args.docs, args.command, markdown)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
