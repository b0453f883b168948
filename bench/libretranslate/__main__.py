"""nmt-serve against LibreTranslate, the server self-hosters run today, on the same weights.

    .venv/bin/python -m bench.libretranslate            (needs `pip install -e .[loadtest]`)

The committed checkpoint is served twice: by `nmt serve` (its int8 bundle) and by
LibreTranslate 1.9.6 (Argos Translate on CTranslate2, int8) from an Argos package built here
of the same weights (argos_package.py says how, and what differs in sentence splitting).
LibreTranslate is run in the configurations its users choose between: its default threading,
`ARGOS_INTRA_THREADS=1`, and that with `ARGOS_INTER_THREADS=2` (two translators side by side).
Both decode with beam 4, their defaults.

All servers run at once on this machine and take turns behind the same Locust scenario
(locustfile.py: LibreTranslate's `/translate`, one distinct sentence a request, a closed loop):
at each number of clients `--rounds` rounds of a `--seconds` turn each, who goes first rotating
from round to round, each figure the median of a server's turns (a 2-core cloud machine's
speed drifts by a fifth within minutes: one 30 s turn each put ours at 0.80x and 0.99x
LibreTranslate's best at one client in two runs the same hour on an AMD EPYC Zen 4). For
each: requests/s, p50 and p99 latency, the server's CPU per request (its process, all threads,
from /proc), the load generator's (Locust's FastHttpUser: it shares the servers' cores) and
the server's peak memory; then one request of 64 sentences, the median of three. Each server
is warmed up before the first turn.

`--checkpoint` serves another checkpoint of the pair on both sides (its bundle, conversion and
Argos package made under build/bench-libretranslate/checkpoints/); the report then names it.

Writes the "libretranslate" section of docs/benchmarks.md. A benchmark: it asserts nothing.
Nothing of it is part of the product.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.compare.prepare import prepare
from bench.harness import CHECKPOINT, ROOT, ensure_bundle, free_port, start_server
from bench.libretranslate.argos_package import (
    LIBRETRANSLATE_PINS,
    argos_environment,
    build_package,
    ensure_libretranslate,
    install_package,
)
from bench.report import cpu_model, replace_section, reproduce
from bench.scaleout import Nginx, nginx_binary

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
TRAIN_SOURCES = ROOT.parent / "shared" / "data" / "multi30k" / "train.fr"
WORK = ROOT / "build" / "bench-libretranslate"
OURS = "nmt-serve"
OURS_REPLICAS = "nmt-serve, 2 processes behind nginx"
# LibreTranslate's configurations: a label, and the Argos settings that make it
LIBRETRANSLATE_CONFIGURATIONS = {
    "LibreTranslate, default threads": {},
    "LibreTranslate, ARGOS_INTRA_THREADS=1": {"ARGOS_INTRA_THREADS": "1"},
    "LibreTranslate, and ARGOS_INTER_THREADS=2": {
        "ARGOS_INTRA_THREADS": "1",
        "ARGOS_INTER_THREADS": "2",
    },
}
LONG_REQUEST_SENTENCES = 64
# Ours answers a text of up to NMT_MAX_CHARS_PER_TEXT characters (5,000 by default, else 400);
# the long request's 64 sentences, one text, can be longer, and LibreTranslate has no limit by
# default: every server of ours is started with room for it.
OURS_SETTINGS = {"int8": "true", "max_chars_per_text": 20_000}
READY_TIMEOUT_SECONDS = 600.0


@dataclass
class Level:
    """One server at one number of clients."""

    requests: int
    failures: int
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_request: float
    load_cpu_ms_per_request: float  # Locust's own, on the same cores
    lines_used: int  # sentences sent, the unanswered at the end included


@dataclass
class Contender:
    """A server as the clients see it (one URL), and the processes that serve it: what its
    CPU and memory are counted over."""

    name: str
    processes: list[subprocess.Popen]
    url: str
    log_path: Path
    levels: dict[int, Level] = field(default_factory=dict)
    long_request_seconds: list[float] = field(default_factory=list)
    stop_first: list[Callable[[], None]] = field(default_factory=list)  # a proxy in front

    def wait_ready(self) -> None:
        """Until a translation comes back (LibreTranslate loads its models after listening)."""
        body = {"q": "Un homme marche.", "source": "fr", "target": "en"}
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if any(process.poll() is not None for process in self.processes):
                raise RuntimeError(f"{self.name} exited; its log: {self.log_path}")
            try:
                if httpx.post(f"{self.url}/translate", json=body, timeout=30).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(
            f"{self.name} not ready in {READY_TIMEOUT_SECONDS:.0f} s: {self.log_path}"
        )

    def cpu_seconds(self) -> float:
        """CPU time of the server's process and any processes it started, all threads."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self._pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return total

    def peak_rss_mib(self) -> float:
        """Resident memory's high-water marks, summed over the processes and their children
        (each process's own peak: an upper bound on their peak together)."""
        peak = 0.0
        for pid in self._pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
            except OSError:
                continue
            for line in status:
                if line.startswith("VmHWM:"):
                    peak += int(line.split()[1]) / 1024
        return peak

    def _pids(self) -> list[int]:
        return [pid for p in self.processes for pid in [p.pid, *_descendants(p.pid)]]

    def stop(self) -> None:
        for stop in self.stop_first:
            stop()
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _descendants(pid: int) -> list[int]:
    children_of: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children_of.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children_of.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def start_ours(bundles: Path, logs: Path, threads: int) -> Contender:
    server = start_server(bundles, logs, threads=threads, **OURS_SETTINGS)
    return Contender(OURS, [server.process], server.url, server.log_path)


def start_ours_workers(bundles: Path, logs: Path, workers: int) -> Contender:
    """One server whose model has `workers` decoding threads of one engine thread each
    (NMT_DECODING_WORKERS): the cores used as the replicas use them, in one process."""
    server = start_server(bundles, logs, threads=1, decoding_workers=workers, **OURS_SETTINGS)
    name = f"{OURS}, {workers} decoding workers"
    return Contender(name, [server.process], server.url, server.log_path)


def start_ours_replicas(bundles: Path, logs: Path) -> Contender:
    """Two 1-thread servers behind nginx: the layout docs/scaling.md measured best on 2 cores
    (replicas, as on Kubernetes). nginx's workers count in its CPU and memory."""
    servers = [start_server(bundles, logs, threads=1, **OURS_SETTINGS) for _ in range(2)]
    for server in servers:
        server.wait_for("/readyz")
    nginx = Nginx(logs / "nginx", {"ours": servers})
    return Contender(
        OURS_REPLICAS,
        [*(server.process for server in servers), nginx.process],
        nginx.url("ours"),
        servers[0].log_path,
        stop_first=[nginx.stop],
    )


def start_libretranslate(
    name: str, settings: dict[str, str], lt_python: Path, home: Path, logs: Path, spacy: bool
) -> Contender:
    port = free_port()
    environment = {**argos_environment(home), "ARGOS_COMPUTE_TYPE": "int8", **settings}
    if spacy:
        environment["ARGOS_CHUNK_TYPE"] = "SPACY"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"libretranslate-{port}.log"
    command = [
        str(lt_python.with_name("libretranslate")),
        *("--host", "127.0.0.1", "--port", str(port), "--load-only", "fr,en"),
        "--disable-web-ui",
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT)
    return Contender(name, [process], f"http://127.0.0.1:{port}", log_path)


def run_locust(
    contender: Contender, clients: int, seconds: int, first_line: int, work: Path
) -> Level:
    prefix = work / f"locust-{contender.processes[0].pid}-{clients}"
    command = [
        sys.executable,
        *("-m", "locust", "-f", str(LOCUSTFILE), "--headless"),
        *("-u", str(clients), "-r", str(clients), "-t", f"{seconds}s"),
        *("-H", contender.url, "--csv", str(prefix), "--only-summary", "--loglevel", "ERROR"),
    ]
    environment = {
        **os.environ,
        "BENCH_SENTENCES": str(TRAIN_SOURCES),
        "BENCH_FIRST_LINE": str(first_line),
        "BENCH_LINES_USED": f"{prefix}_lines_used",
    }
    cpu_before, load_before = contender.cpu_seconds(), children_cpu_seconds()
    finished = subprocess.run(command, env=environment, capture_output=True, text=True)
    cpu_used = contender.cpu_seconds() - cpu_before
    load_used = children_cpu_seconds() - load_before
    if not Path(f"{prefix}_stats.csv").is_file():  # locust missing (`make loadtest` installs it)
        raise RuntimeError(f"locust wrote no statistics: {finished.stderr[-2000:]}")
    with open(f"{prefix}_stats.csv") as stats:
        rows = list(csv.DictReader(stats))
    if not rows:
        raise RuntimeError(f"locust wrote no statistics: {finished.stderr[-2000:]}")
    total = next(row for row in rows if row["Name"] == "Aggregated")
    lines_used = Path(f"{prefix}_lines_used")
    if not lines_used.is_file():
        raise RuntimeError(f"locust wrote no count of the lines it sent: {finished.stderr[-2000:]}")
    sent = int(lines_used.read_text())
    requests = int(total["Request Count"])
    return Level(
        requests=requests,
        failures=int(total["Failure Count"]),
        requests_per_second=float(total["Requests/s"]),
        p50_ms=float(total["50%"]),
        p99_ms=float(total["99%"]),
        # Over every request sent (Locust's count leaves out about its first second)
        cpu_ms_per_request=1000 * cpu_used / max(sent, 1),
        load_cpu_ms_per_request=1000 * load_used / max(sent, 1),
        lines_used=sent,
    )


def median_level(rounds: list[Level]) -> Level:
    """A server's turns at one number of clients: each figure's median over the turns (the
    machine's speed drifts between them), the requests and lines summed."""
    return Level(
        requests=sum(level.requests for level in rounds),
        failures=sum(level.failures for level in rounds),
        requests_per_second=statistics.median(level.requests_per_second for level in rounds),
        p50_ms=statistics.median(level.p50_ms for level in rounds),
        p99_ms=statistics.median(level.p99_ms for level in rounds),
        cpu_ms_per_request=statistics.median(level.cpu_ms_per_request for level in rounds),
        load_cpu_ms_per_request=statistics.median(
            level.load_cpu_ms_per_request for level in rounds
        ),
        lines_used=sum(level.lines_used for level in rounds),
    )


def children_cpu_seconds() -> float:
    """CPU time of this process's finished children (Locust, once it has exited)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def long_request(contender: Contender, sentences: list[str]) -> float:
    body = {"q": " ".join(sentences), "source": "fr", "target": "en", "format": "text"}
    started = time.perf_counter()
    answer = httpx.post(f"{contender.url}/translate", json=body, timeout=600)
    answer.raise_for_status()
    elapsed = time.perf_counter() - started
    # A translation of every sentence, not an error or an empty answer with a 200.
    if len(answer.json().get("translatedText") or "") < len(body["q"]) // 3:
        raise RuntimeError(f"the long request's answer is too short: {answer.text[:300]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,8,32", help="numbers of closed-loop clients")
    parser.add_argument("--seconds", type=int, default=10, help="each server's turn at a level")
    parser.add_argument(
        "--rounds", type=int, default=3, help="turns of every server at each level (medians)"
    )
    parser.add_argument("--threads", type=int, default=1, help="our engine's threads")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=CHECKPOINT,
        help="the fr-en checkpoint both serve (default: the committed one)",
    )
    parser.add_argument(
        "--configurations",
        default=",".join(str(i) for i in range(len(LIBRETRANSLATE_CONFIGURATIONS))),
        help="which LibreTranslate configurations, by index: "
        + "; ".join(f"{i} {name}" for i, name in enumerate(LIBRETRANSLATE_CONFIGURATIONS)),
    )
    parser.add_argument(
        "--replicas",
        action=argparse.BooleanOptionalAction,
        default=nginx_binary() is not None,
        help="also ours as 2 one-thread processes behind nginx (on when nginx is installed)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="also ours with this many decoding workers of one thread (NMT_DECODING_WORKERS; "
        "1: not)",
    )
    parser.add_argument("--minisbd-model", type=Path, help="a MiniSBD fr model (fr.onnx)")
    parser.add_argument("--libretranslate-venv", type=Path, default=WORK / "venv")
    parser.add_argument("--no-report", action="store_true", help="print, leave the docs alone")
    parser.add_argument(
        "--section",
        default="libretranslate",
        help="section of docs/benchmarks.md to write (e.g. one per CPU measured on)",
    )
    args = parser.parse_args(argv)
    if not TRAIN_SOURCES.is_file():
        raise SystemExit(f"needs Multi30k's training sources (distinct sentences): {TRAIN_SOURCES}")
    levels = [int(n) for n in args.clients.split(",")]
    chosen = [list(LIBRETRANSLATE_CONFIGURATIONS)[int(i)] for i in args.configurations.split(",")]

    lt_python = ensure_libretranslate(args.libretranslate_venv)
    committed = args.checkpoint.resolve() == CHECKPOINT.resolve()
    # (another checkpoint's conversion, package and bundle in a folder of its own)
    work_dir = WORK if committed else WORK / "checkpoints" / args.checkpoint.resolve().name
    paths = prepare(args.checkpoint, work_dir / "prepared")  # bench.compare's CTranslate2 model
    archive = build_package(
        paths["ct2"],
        args.checkpoint / "sentencepiece.model",
        work_dir,
        lt_python,
        args.minisbd_model,
    )
    argos_home = work_dir / "argos-home"
    install_package(lt_python, archive, argos_home)
    if committed:
        bundles = ensure_bundle()
    else:  # a folder of bundles holding the prepared one as fr-en
        bundles = work_dir / "bundles"
        bundles.mkdir(exist_ok=True)
        if not (bundles / "fr-en").exists():
            (bundles / "fr-en").symlink_to(paths["bundle"].resolve())
    sentences = TRAIN_SOURCES.read_text(encoding="utf-8").splitlines()

    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-lt-")))
        work.chmod(0o755)  # nginx's workers run as another user
        contenders = [start_ours(bundles, work, args.threads)]
        stack.callback(contenders[0].stop)
        contenders[0].wait_ready()
        if args.workers > 1:
            contenders.append(start_ours_workers(bundles, work, args.workers))
            stack.callback(contenders[-1].stop)
            contenders[-1].wait_ready()
        if args.replicas:
            contenders.append(start_ours_replicas(bundles, work))
            stack.callback(contenders[-1].stop)
            contenders[-1].wait_ready()
        # One at a time: offline, a LibreTranslate spends a minute or more retrying its model
        # index before it serves, and several at once would also share its package folder.
        for name in chosen:
            contender = start_libretranslate(
                name,
                LIBRETRANSLATE_CONFIGURATIONS[name],
                lt_python,
                argos_home,
                work,
                spacy=args.minisbd_model is None,
            )
            stack.callback(contender.stop)
            contender.wait_ready()
            contenders.append(contender)
        # Warm-up, on lines from the end of the pool; the measured runs start at its beginning.
        for contender in contenders:
            run_locust(contender, 4, 5, len(sentences) - 2000, work)
        first_line = 0
        for index, clients in enumerate(levels):
            rounds: dict[str, list[Level]] = {c.name: [] for c in contenders}
            for round_ in range(args.rounds):
                start = (index + round_) % len(contenders)  # who goes first rotates
                for contender in contenders[start:] + contenders[:start]:
                    level = run_locust(contender, clients, args.seconds, first_line, work)
                    rounds[contender.name].append(level)
                    print(f"{contender.name}, {clients} clients: {level}", flush=True)
                # Past every line sent: a line a server translated before is in its cache.
                first_line += max(rounds[c.name][-1].lines_used for c in contenders)
            for contender in contenders:
                contender.levels[clients] = median_level(rounds[contender.name])
        for round_ in range(3):
            chunk = sentences[first_line : first_line + LONG_REQUEST_SENTENCES]
            first_line += LONG_REQUEST_SENTENCES
            for contender in contenders if round_ % 2 == 0 else contenders[::-1]:
                contender.long_request_seconds.append(long_request(contender, chunk))
        peaks = {c.name: c.peak_rss_mib() for c in contenders}

    reused = first_line > len(sentences) - 2000
    markdown = report(contenders, levels, peaks, args, reused)
    print(markdown)
    (work_dir / "results.json").write_text(
        json.dumps(
            {
                c.name: {
                    "levels": {n: vars(level) for n, level in c.levels.items()},
                    "long_request_seconds": c.long_request_seconds,
                    "peak_rss_mib": peaks[c.name],
                }
                for c in contenders
            },
            indent=2,
        )
    )
    if not args.no_report:
        replace_section(args.section, markdown)
    return 0


def report(
    contenders: list[Contender], levels: list[int], peaks: dict[str, float], args, reused: bool
) -> str:
    ours = [c for c in contenders if c.name.startswith(OURS)]
    others = [c for c in contenders if c not in ours]
    names = [c.name for c in contenders]

    def best_other(clients: int) -> Contender:
        return max(others, key=lambda c: c.levels[clients].requests_per_second)

    lines = [
        "## nmt-serve against LibreTranslate, on the same weights",
        "",
        f"Measured on {cpu_model()}, {os.cpu_count()} cores, all servers on the same machine as "
        "the load (Locust's FastHttpUser), taking turns. "
        + (
            "The committed fr-en checkpoint"
            if args.checkpoint.resolve() == CHECKPOINT.resolve()
            else f"The fr-en checkpoint `{args.checkpoint}`"
        )
        + ": ours int8 "
        f"(`NMT_INT8=true`, `NMT_THREADS={args.threads}`, "
        f"`NMT_MAX_CHARS_PER_TEXT={OURS_SETTINGS['max_chars_per_text']}` for the long request"
        + (
            f"; and one such process with `NMT_DECODING_WORKERS={args.workers}`"
            if args.workers > 1
            else ""
        )
        + ("; and two such processes with 1 thread behind nginx" if args.replicas else "")
        + "), LibreTranslate "
        f"({', '.join(LIBRETRANSLATE_PINS)}) int8 (`ARGOS_COMPUTE_TYPE=int8`) from an Argos "
        "package of the same weights built by the benchmark; beam 4 on both (their defaults). "
        "Each request one distinct Multi30k training sentence through LibreTranslate's "
        f"`/translate`, closed loop; at each number of clients {args.rounds} rounds of a "
        f"{args.seconds} s turn each, who goes first rotating, and each figure the median of a "
        "server's turns. "
        + (
            "LibreTranslate splits sentences with MiniSBD (the model given)."
            if args.minisbd_model
            else "LibreTranslate splits sentences with spaCy's rule-based sentencizer: its "
            "default, MiniSBD, downloads a model from GitHub, which this machine cannot reach; "
            "the rules cost less than MiniSBD's model, so this favours LibreTranslate."
        )
        + (" The sentence pool ran out: some sentences were sent twice." if reused else ""),
        "",
        f"Reproduce: `{reproduce('bench.libretranslate')}`",
        "",
        "Requests/s (and failed requests, where any):",
        "",
        "| clients | "
        + " | ".join(names + [f"{c.name} / LibreTranslate's best" for c in ours])
        + " |",
        "|---:|" + "---:|" * (len(names) + len(ours)),
    ]
    for clients in levels:
        cells = []
        for contender in contenders:
            level = contender.levels[clients]
            failed = f" ({level.failures} failed)" if level.failures else ""
            cells.append(f"{level.requests_per_second:.1f}{failed}")
        best = best_other(clients).levels[clients].requests_per_second
        cells += [f"{c.levels[clients].requests_per_second / best:.2f}x" for c in ours]
        lines.append(f"| {clients} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Latency p50 / p99 (ms), and the server's CPU per request (ms, all its threads):",
        "",
        "| clients | " + " | ".join(names) + " |",
        "|---:|" + "---|" * len(names),
    ]
    for clients in levels:
        cells = [
            f"{c.levels[clients].p50_ms:.0f} / {c.levels[clients].p99_ms:.0f}; "
            f"CPU {c.levels[clients].cpu_ms_per_request:.1f}"
            for c in contenders
        ]
        lines.append(f"| {clients} | " + " | ".join(cells) + " |")
    load = [level.load_cpu_ms_per_request for c in contenders for level in c.levels.values()]
    lines += [
        "",
        f"The load itself (Locust, on the same cores) took {min(load):.1f}-{max(load):.1f} ms of "
        "CPU a request (its start included).",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
        f"| one request of {LONG_REQUEST_SENTENCES} sentences (s, median of 3) | "
        + " | ".join(f"{statistics.median(c.long_request_seconds):.2f}" for c in contenders)
        + " |",
        "| peak memory (MiB, resident) | "
        + " | ".join(f"{peaks[c.name]:.0f}" for c in contenders)
        + " |",
        "",
        "Targets (issue 39): at least 1.2x LibreTranslate's best configuration at 1 client, "
        "and 2.5x at 32 clients.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
