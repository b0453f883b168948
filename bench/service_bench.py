"""Service throughput and latency: continuous vs request-level batching, side by side in one run.

    .venv/bin/python -m bench.service_bench

Starts two `nmt serve` processes on free loopback ports, serving the same bundle (the committed
checkpoint, exported to a temporary folder, unless --model-dir is given): NMT_BATCHING=request
(a batch is decoded to its end before the next starts) and NMT_BATCHING=continuous (sentences
join and leave the running batch between decoder steps). Both get the same engine threads.

* Closed loop: 1, 8, 32 and 64 clients, greedy, each sending its next one-sentence request when
  the previous one is answered. The work alternates between the servers in rounds (halves, or
  more where the level is quick: at least 8 requests per client a round), in mirrored order
  (A, B, B, A, ...), so that a change in background load hits both alike. Throughput is the
  steady state's, without the start (all clients at once) and the end (fewer and fewer).
* Open loop: Poisson arrivals at 50%, 70% and 90% of the measured capacity (the closed-loop
  throughput of the lower of the two at 64 clients on the same mix), the same arrival times
  and requests for both servers: sentences of every length, half greedy and half beam 4. The
  arrivals are played in chunks of a few seconds, alternating between the servers in mirrored
  order: near capacity, a machine that slows by a fifth for a minute (as this one does) would
  otherwise overload whichever server ran then, and decide the p99. Each chunk starts from an
  empty server and ends with its last answer, so the p99 ratio gets a 95% bootstrap interval
  over the chunks. `--clients ''` plays the open loop only; `--continuous NAME=VALUE` tries a
  setting of the continuous server against request-level batching.
* The engine alone, on the same sentences at batch 1 and 32 with the same threads: the
  ceiling that batching in the service can reach. It runs in a process of its own at the
  servers' priority, before every closed-loop level and after the last; a level is compared
  with the mean of the runs just before and after it.
* Where the CPU goes, per request: the server's engine thread (decoding), the rest of the
  server (its event loop: HTTP, validation, tokenization), and the load generator, which shares
  the cores. Read from /proc on Linux, so that a gap to the engine alone can be told apart from
  a load generator that cannot keep up.

The clients are aiohttp's: httpx took about 5 ms of CPU a request here against aiohttp's 1 ms,
and with 2 cores shared that was enough to starve the servers of requests.

Writes the "service" section of docs/benchmarks.md. A benchmark, not a test: it reports what
it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.report import opening, replace_section

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "benchmarks.md"
SERVE = [sys.executable, "-m", "nmt_cli", "serve"]
MULTI30K_TEST = ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.fr"
FALLBACK_SENTENCES = [
    "Un homme en chemise bleue marche dans la rue.",
    "Deux enfants jouent au ballon sur la plage.",
    "Une femme lit un livre dans un parc.",
    "Le chien court après la balle.",
    "Un groupe de personnes attend le bus devant une grande gare.",
    "Une petite fille mange une glace.",
    "Un homme fait du vélo sur une route de montagne.",
    "Des gens sont assis à une table dans un restaurant.",
]
REQUEST, CONTINUOUS = "request", "continuous"
SERVERS = (REQUEST, CONTINUOUS)
ROUND_REQUESTS = 8  # closed loop: requests per client in a round, at least
MIX = (1, 4)  # open loop: half greedy, half beam 4


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile of `values` (0 <= q <= 1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Run:
    batching: str
    label: str  # "32 clients" or "70% load"
    requests: int = 0  # answered
    counted: int = 0  # answered within the measured windows (see closed_loop)
    seconds: float = 0.0  # the measured windows' length
    errors: int = 0
    steps: float = 0.0  # decoder steps the server ran
    sentence_steps: float = 0.0  # sentences decoded at those steps, summed
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds: engine, server, client
    ceiling: float = float("nan")  # the engine alone at batch 32 around this run, sentences/s
    rounds: list[float] = field(default_factory=list)  # closed loop: each round's requests/s
    # Each measured part's latencies (closed loop: a round; open loop: a chunk, played by both
    # servers)
    parts: list[list[float]] = field(default_factory=list)

    @property
    def latencies(self) -> list[float]:
        return [latency for part in self.parts for latency in part]

    @property
    def throughput(self) -> float:
        return self.counted / self.seconds

    @property
    def occupancy(self) -> float:
        return self.sentence_steps / self.steps if self.steps else float("nan")

    def percentile(self, q: float) -> float:
        return percentile(self.latencies, q)

    def cpu_ms_per_request(self, part: str) -> float:
        return 1000 * self.cpu[part] / self.requests if part in self.cpu else float("nan")


@dataclass
class Served:
    url: str
    pid: int


def load_sentences(path: Path) -> tuple[list[str], str]:
    """The first 500 lines of `path` (Multi30k's test set), or a built-in list without it;
    and where they came from, for the report."""
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines()[:500], f"from {path.name}"
    return FALLBACK_SENTENCES, "from a built-in list (Multi30k not found)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def settings(pairs: list[str]) -> dict[str, str]:
    """NAME=VALUE pairs (NMT_ prefix optional) -> the server() settings dict."""
    found = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        found[name.removeprefix("NMT_").lower()] = value
    return found


@contextmanager
def server(
    model_dir: Path,
    log_dir: Path,
    settings: dict[str, object],
    command: list[str] = SERVE,
    tree: Path = ROOT,
) -> Iterator[Served]:
    """`nmt serve` on `model_dir` with NMT_ settings, run from the checkout `tree` (another
    commit's, to compare code; it must have been installed the same way), until closed."""
    port = free_port()
    env = {
        **os.environ,
        "NMT_MODEL_DIR": str(model_dir),
        "NMT_HOST": "127.0.0.1",
        "NMT_PORT": str(port),
        "NMT_ACCESS_LOG": "false",
        # The clients repeat their sentences: the cache would answer them, not the batching.
        "NMT_CACHE_ENTRIES": "0",
        **{f"NMT_{name.upper()}": str(value) for name, value in settings.items()},
    }
    log_path = log_dir / f"server-{port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield Served(url, process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of the server `pid`'s main thread ("server": the event loop, which
    does all of a request's work but decoding), of its other threads ("engine": the scheduler's
    decoding thread and ONNX Runtime's pool threads, if any), and of this process ("client").
    Empty where /proc cannot tell (not Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {"engine": 0.0, "server": 0.0}
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            # utime and stime: the 14th and 15th fields, the 12th and 13th after the command
            # name (which may hold spaces)
            fields = (task / "stat").read_text().rpartition(")")[2].split()
            seconds = (int(fields[11]) + int(fields[12])) / tick
            found["server" if task.name == str(pid) else "engine"] += seconds
    except OSError:
        return {}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    found["client"] = usage.ru_utime + usage.ru_stime
    return found


def counters(url: str) -> dict[str, float]:
    """The server's counters that give the mean occupancy (sentences per decoder step)."""
    found = {"nmt_decode_steps_total": 0.0, "nmt_output_tokens_total": 0.0}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name] += sample.value
    return found


def payload(text: str, beam: int) -> dict:
    return {"text": text, "source_lang": "fr", "target_lang": "en", "beam_size": beam}


def client_session(url: str, connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        url,
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=300),
    )


async def translate_once(
    client: aiohttp.ClientSession, text: str, beam: int, latencies: list[float]
) -> bool:
    """One request; its latency goes to `latencies` if it was answered. True for a 200
    (False for another status, or a pooled connection the server just closed)."""
    started = time.perf_counter()
    try:
        async with client.post("/v1/translate", json=payload(text, beam)) as response:
            await response.read()
    except aiohttp.ClientError:
        return False
    latencies.append(time.perf_counter() - started)
    return response.status == 200


async def closed_loop(
    url: str, work: list[tuple[str, int]], clients: int
) -> tuple[list[float], int, float, int]:
    """`clients` concurrent clients share the requests `work` (text, beam), each sending its
    next one when the previous is answered. Returns the latencies, the errors, and the
    requests answered within a window of so many seconds (the last two).

    The window is the steady state: from the time the first `clients` requests are answered
    (the burst of all clients starting at once has passed) to the time the first client finds
    no work left (from then on fewer clients are busy). Throughput over the whole run would
    count that start and that end, which differ between schedulers, and weigh more the
    shorter the run. Falls back to the whole run where the window holds too few answers."""
    todo = iter(work)
    latencies: list[float] = []
    answered: list[float] = []  # times, in order
    errors = 0
    ran_out: float | None = None

    async def client_loop(client: aiohttp.ClientSession) -> None:
        nonlocal errors, ran_out
        for text, beam in todo:
            ok = await translate_once(client, text, beam, latencies)
            errors += not ok
            answered.append(time.perf_counter())
        if ran_out is None:
            ran_out = time.perf_counter()

    async with client_session(url, clients) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        ended = time.perf_counter()
    window = steady_window(answered, clients, ran_out)
    if window is None:
        return latencies, errors, ended - started, len(latencies)
    return latencies, errors, *window


def rounds(work: list[tuple[str, int]], clients: int) -> list[list[tuple[str, int]]]:
    """A closed loop's work cut into rounds, each played by both servers in turn: an even
    number of them, at least 8 requests per client each, two at least (halves). A lone
    client answers 96 requests in a few seconds: many short rounds let a slow spell of the
    machine fall on both servers alike."""
    count = max(2, len(work) // (ROUND_REQUESTS * clients))
    count -= count % 2
    size = -(-len(work) // count)
    return [work[start : start + size] for start in range(0, len(work), size)]


def steady_window(
    answered: list[float], clients: int, ran_out: float | None
) -> tuple[float, int] | None:
    """A closed loop's steady state (see closed_loop) from the times requests were answered
    (ascending) and the time the first client found no work left: its length in seconds and
    the answers within it; None where it would hold fewer than max(clients, 16) answers."""
    if ran_out is None or len(answered) <= clients:
        return None
    opened = answered[clients - 1]
    counted = sum(opened < at <= ran_out for at in answered)
    if counted < max(clients, 16) or ran_out <= opened:
        return None
    return ran_out - opened, counted


async def open_loop(
    url: str, work: list[tuple[str, int]], arrivals: list[float]
) -> tuple[list[float], int, float]:
    """Send work[i] at arrivals[i] seconds from the start, whatever is still unanswered.
    Returns the latencies, the errors, the wall time and the requests answered."""
    latencies: list[float] = []
    errors = 0

    async def send(client: aiohttp.ClientSession, at: float, text: str, beam: int) -> None:
        nonlocal errors
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
        errors += not await translate_once(client, text, beam, latencies)

    async with client_session(url, 1000) as client:
        started = time.perf_counter()
        await asyncio.gather(
            *(send(client, at, text, beam) for at, (text, beam) in zip(arrivals, work, strict=True))
        )
        return latencies, errors, time.perf_counter() - started, len(latencies)


def open_loop_work(
    rng: random.Random, sentences: list[str], rate: float, seconds: float
) -> tuple[list[tuple[str, int]], list[float]]:
    """Poisson arrivals at `rate` requests/s for `seconds`: the requests (a sentence, greedy
    or beam 4 at random) and their arrival times in seconds from the start."""
    arrivals, at = [], 0.0
    for _ in range(max(1, round(rate * seconds))):
        at += rng.expovariate(rate)
        arrivals.append(at)
    work = [(rng.choice(sentences), rng.choice(MIX)) for _ in range(len(arrivals))]
    return work, arrivals


def chunks(
    work: list[tuple[str, int]], arrivals: list[float], seconds: float
) -> Iterator[tuple[list[tuple[str, int]], list[float]]]:
    """The open loop's requests cut by arrival time into chunks `seconds` long, each chunk's
    arrivals counted from its own start."""
    chunk: dict[int, list[int]] = {}
    for position, at in enumerate(arrivals):
        chunk.setdefault(int(at // seconds), []).append(position)
    for number in sorted(chunk):
        start = number * seconds
        yield [work[i] for i in chunk[number]], [arrivals[i] - start for i in chunk[number]]


def play_in_chunks(
    served: dict[str, Served],
    runs: dict[str, Run],
    work: list[tuple[str, int]],
    arrivals: list[float],
    seconds: float,
    first: int = 0,
) -> None:
    """Play an open loop's chunks (`seconds` long) on every server of `runs`, each chunk from
    an empty server to its last answer, in mirrored order: A B, B A, ... (B A first when
    `first` is odd), so that a drift of the machine falls on all of them alike."""
    names = tuple(runs)
    for chunk, (chunk_work, chunk_arrivals) in enumerate(chunks(work, arrivals, seconds)):
        for name in names if (chunk + first) % 2 == 0 else names[::-1]:
            load = open_loop(served[name].url, chunk_work, chunk_arrivals)
            measure(runs[name], served[name], load)


def measure(run: Run, served: Served, load: Coroutine) -> None:
    """Add one load (a coroutine, not started yet, giving latencies, errors, and the seconds
    and answers of its measured window) to `run`."""
    url = served.url
    before, cpu_before = counters(url), cpu_seconds(served.pid)
    latencies, errors, seconds, counted = asyncio.run(load)
    cpu_after, after = cpu_seconds(served.pid), counters(url)
    for part, used in cpu_after.items():
        run.cpu[part] = run.cpu.get(part, 0.0) + used - cpu_before[part]
    steps = after["nmt_decode_steps_total"] - before["nmt_decode_steps_total"]
    tokens = after["nmt_output_tokens_total"] - before["nmt_output_tokens_total"]
    run.requests += len(latencies)
    run.rounds.append(counted / seconds)
    run.counted += counted
    run.seconds += seconds
    run.parts.append(latencies)
    run.errors += errors
    run.steps += steps
    # A sentence takes part in one step per token it produces, plus the step of its </s>.
    run.sentence_steps += tokens + len(latencies)


class EngineAlone:
    """The engine alone in a process of its own (`--engine-worker`), started before the load
    generator lowers its priority, so that it decodes at the servers' priority; `measure()`
    asks it for one run."""

    def __init__(self, model_dir: Path, sentences: list[str], threads: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.service_bench", "--engine-worker"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        job = {"model_dir": str(model_dir), "sentences": sentences, "threads": threads}
        self._ask(json.dumps(job))
        self.runs: list[dict[int, float]] = []

    def _ask(self, line: str) -> str:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise SystemExit("the engine-alone worker died")
        return answer

    def measure(self) -> dict[int, float]:
        speeds = {int(batch): value for batch, value in json.loads(self._ask("run")).items()}
        self.runs.append(speeds)
        print(
            f"engine alone: {speeds[1]:.1f} sentences/s at batch 1, {speeds[32]:.1f} at 32",
            file=sys.stderr,
        )
        return speeds

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(60)


def engine_worker() -> None:
    """`--engine-worker`: a job (JSON) on the first line of stdin, then one run per line."""
    job = json.loads(sys.stdin.readline())
    ceiling = engine_ceiling(Path(job["model_dir"]), job["sentences"], job["threads"])
    print("{}", flush=True)
    for _ in sys.stdin:
        print(json.dumps(ceiling()), flush=True)


def engine_ceiling(
    model_dir: Path, sentences: list[str], threads: int
) -> Callable[[], dict[int, float]]:
    """A function giving greedy sentences per second of the engine alone at batch 1 and 32,
    with `threads` (batch 32: the median of three passes)."""
    from service.runtime.bundle import load_bundle
    from service.runtime.engine import EngineOptions
    from service.runtime.search import SearchOptions
    from service.runtime.translator import Translator
    from service.serving.registry import find_bundles

    options = EngineOptions(intra_op_threads=threads, spinning=False)
    translator = Translator(load_bundle(find_bundles(model_dir)[0]), options)
    sources = translator.tokenizer.encode(sentences[:128])
    greedy = SearchOptions()
    translator.translate_ids(sources[:32], greedy, 32)  # warm-up

    def speed(batch: int) -> float:
        started = time.perf_counter()
        translator.translate_ids(sources, greedy, batch)
        return len(sources) / (time.perf_counter() - started)

    def run() -> dict[int, float]:
        return {1: speed(1), 32: statistics.median(speed(32) for _ in range(3))}

    return run


def _default(name: str):
    from service.serving.settings import Settings

    return Settings.model_fields[name].default


def _row(run: Run, extra: str = "") -> str:
    errors = f" ({run.errors} errors)" if run.errors else ""
    parts = ("engine", "server", "client")
    cpu = " / ".join(f"{run.cpu_ms_per_request(part):.1f}" for part in parts)
    return (
        f"| {run.label} | {run.batching} | {run.requests}{errors} | {run.throughput:.1f} | "
        f"{run.percentile(0.5) * 1000:.0f} | {run.percentile(0.95) * 1000:.0f} | "
        f"{run.percentile(0.99) * 1000:.0f} | {run.occupancy:.1f} | {cpu} |{extra}"
    )


def paired_rounds(closed: list[Run]) -> list[str]:
    """A line per closed-loop level played in 4 rounds or more: continuous over request-level
    requests/s round by round (each round's requests on both servers in turn), median and
    range. Drift of the machine between rounds falls out of each ratio."""
    runs = {(run.label, run.batching): run for run in closed}
    lines = []
    for label in dict.fromkeys(run.label for run in closed):
        request, continuous = runs[label, REQUEST], runs[label, CONTINUOUS]
        if len(request.rounds) < 4 or len(request.rounds) != len(continuous.rounds):
            continue
        ratios = [c / r for c, r in zip(continuous.rounds, request.rounds, strict=True)]
        median = statistics.median(ratios)
        lines.append(
            f"{label}, round by round ({len(ratios)} rounds, each played by both servers in "
            f"turn): continuous / request-level requests/s, median {median:.2f}x, "
            f"from {min(ratios):.2f}x to {max(ratios):.2f}x."
        )
    return lines


def p99_ratio_interval(
    request: Run, continuous: Run, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A 95% bootstrap interval of continuous's p99 over request-level's, resampling the open
    loop's chunks: each chunk's arrivals were played by both servers, and each starts from an
    empty server and ends when its last answer is in, so chunks are the independent units,
    and a resample keeps a chunk's latencies on both servers together. None with fewer than
    10 chunks."""

    def p99(latencies: list[float]) -> float:
        return percentile(latencies, 0.99)

    return paired_ratio_interval(continuous.parts, request.parts, p99, resamples, seed)


def paired_ratio_interval(
    a_parts: list[list[float]],
    b_parts: list[list[float]],
    statistic: Callable[[list[float]], float],
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A 95% bootstrap interval of statistic(A's latencies) / statistic(B's), resampling the
    chunks that both played (see p99_ratio_interval). None with fewer than 10 chunks."""
    pairs = list(zip(a_parts, b_parts, strict=True))
    if len(pairs) < 10:
        return None
    rng = random.Random(seed)

    def pooled(parts: list[list[float]]) -> list[float]:
        return [latency for part in parts for latency in part]

    ratios = []
    for _ in range(resamples):
        drawn = [rng.choice(pairs) for _ in pairs]
        ratios.append(
            statistic(pooled([a for a, _ in drawn])) / statistic(pooled([b for _, b in drawn]))
        )
    ratios.sort()
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def _closed_loop_section(
    closed: list[Run], engine: list[dict[int, float]], head: str, rule: str
) -> list[str]:
    lines = [
        "",
        "### Closed loop, greedy",
        "",
        "Each client sends its next request when the previous one is answered. req/s is "
        "the steady state's: answers from the moment the first `clients` requests are "
        "answered (the start, all clients at once, has passed) to the moment the first "
        "client finds no work left (fewer are busy from then on); latency and CPU count "
        "every request.",
        "",
        head + " vs engine alone at batch 32 |",
        rule + "---:|",
    ]
    for run in closed:
        lines.append(_row(run, f" {run.throughput / run.ceiling:.0%} |"))
    batch_1, batch_32 = ([f"{r[batch]:.1f}" for r in engine] for batch in (1, 32))
    lines += ["", *paired_rounds(closed)]
    lines += [
        "",
        "The engine alone (its own process, no HTTP), greedy, in sentences/s, before each level "
        f"and after the last: {', '.join(batch_1)} at batch 1; {', '.join(batch_32)} at batch "
        "32. Each level is compared with the mean of the runs just before and after it.",
    ]
    return lines


def report(
    closed: list[Run],
    opened: list[Run],
    engine: list[dict[int, float]],
    capacity: dict[str, float],
    setup: dict[str, str],
) -> str:
    head = (
        "| load | batching | requests | req/s | p50 ms | p95 ms | p99 ms | mean occupancy "
        "| CPU ms/request: engine / server / client |"
    )
    rule = "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    lines = opening(
        "Service: continuous vs request-level batching",
        "bench.service_bench",
        f", load average before the run {setup['load']}",
    )
    lines += [
        f"- model: {setup['model']}; engine threads: {setup['threads']} in both servers and "
        f"in the engine alone; NMT_MAX_BATCH_SIZE={_default('max_batch_size')}, other "
        "settings at their defaults, translation cache off"
        + (f"; the continuous server with {setup['continuous']}" if setup["continuous"] else ""),
        f"- the load generator shares the machine's cores with the servers, at niceness "
        f"+{setup['niceness']} (it yields to them, as on a machine of its own)",
        f"- requests: one sentence each, {setup['sentences']}; latency measured by the client; "
        "mean occupancy: sentences per decoder step, from the server's counters "
        "((output tokens + sentences) / decoder steps)",
        "- CPU ms/request: CPU time per answered request of the server's engine threads "
        "(decoding, and encoding ahead), of its event loop (HTTP, validation, tokenization) and "
        "of the load generator (aiohttp clients), from /proc",
    ]
    if closed:
        lines += _closed_loop_section(closed, engine, head, rule)
    lines += [
        "",
        "### Open loop, half greedy and half beam 4",
        "",
        "Poisson arrivals at a share of the capacity, the same arrival times and requests for "
        f"both servers, played in chunks of {setup['chunk']} s that alternate between them "
        "(mirrored). "
        + (
            f"Capacity: {setup['capacity']} requests/s, given (`--capacity`, an earlier run's)."
            if setup["capacity"]
            else "Capacity: closed-loop requests/s at 64 clients on the same mix, "
            f"{capacity[REQUEST]:.1f} request-level and {capacity[CONTINUOUS]:.1f} continuous; "
            f"the loads below are shares of the lower, {min(capacity.values()):.1f}."
        ),
        "",
        head + " p99 vs request-level (95% interval) |",
        rule + "---:|",
    ]
    by_label = {(run.label, run.batching): run for run in opened}
    for run in opened:
        if run.batching == REQUEST:
            lines.append(_row(run, " |"))
            continue
        base = by_label[run.label, REQUEST]
        ratio = run.percentile(0.99) / base.percentile(0.99)
        interval = p99_ratio_interval(base, run)
        within = f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else ""
        lines.append(_row(run, f" {ratio:.2f}x{within} |"))
    lines += [
        "",
        "The interval: 2,000 bootstrap resamples of the chunks (each played by both servers, "
        "from an empty server to its last answer), the p99 ratio of each resample; none "
        "under 10 chunks.",
    ]
    lines += [
        "",
        "What the numbers say: [service.md, Performance](service.md#performance).",
    ]
    return "\n".join(lines) + "\n"


def ensure_bundles(model_dir: Path | None, stack: ExitStack) -> Path:
    """The given bundles folder, or the committed checkpoint exported to a temporary one."""
    if model_dir is not None:
        return model_dir
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-bench-")))
    print("exporting models/fr-en to a temporary bundle…", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "nmt_cli", "export", "--out", str(folder / "fr-en")],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, help="bundles folder (default: export one)")
    parser.add_argument("--sentences", type=Path, default=MULTI30K_TEST)
    parser.add_argument(
        "--clients", default="1,8,32,64", help="closed loop client counts ('': open loop only)"
    )
    parser.add_argument("--requests-per-client", type=int, default=12)
    parser.add_argument("--min-requests", type=int, default=48)
    parser.add_argument("--loads", default="0.5,0.7,0.9", help="open loop shares of capacity")
    parser.add_argument("--open-seconds", type=float, default=60.0)
    parser.add_argument(
        "--capacity",
        type=float,
        default=0.0,
        help="open loop: requests/s the loads are shares of, instead of measuring it "
        "(to play an earlier run's arrival rate)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="engine threads (0: the server's default)"
    )
    parser.add_argument(
        "--client-niceness",
        type=int,
        default=10,
        help="niceness added to the load generator once the servers run (0: same priority)",
    )
    parser.add_argument(
        "--chunk-seconds",
        type=float,
        default=5.0,
        help="open loop: the arrivals are played in chunks this long, alternating servers",
    )
    parser.add_argument(
        "--continuous",
        nargs="*",
        default=[],
        help="NAME=VALUE settings of the continuous server only (to try a scheduling setting "
        "against request-level batching)",
    )
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument("--engine-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_worker:
        engine_worker()
        return

    sentences, source = load_sentences(args.sentences)
    threads = args.threads or max(1, (os.cpu_count() or 1) - 1)
    setup = {
        "load": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "threads": str(threads),
        "sentences": source,
        "niceness": str(args.client_niceness),
        "chunk": f"{args.chunk_seconds:g}",
        "continuous": " ".join(args.continuous),
        "capacity": f"{args.capacity:g}" if args.capacity else "",
    }
    rng = random.Random(30)
    closed: list[Run] = []
    opened: list[Run] = []
    with ExitStack() as stack:
        model_dir = ensure_bundles(args.model_dir, stack)
        engine = EngineAlone(model_dir, sentences, threads)
        stack.callback(engine.close)
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmt-bench-logs-")))
        extra = {REQUEST: {}, CONTINUOUS: settings(args.continuous)}
        served = {
            name: stack.enter_context(
                server(model_dir, log_dir, {"batching": name, "threads": threads, **extra[name]})
            )
            for name in SERVERS
        }
        setup["model"] = ", ".join(
            f"{m['name']} ({m['precision']})"
            for m in httpx.get(f"{served[REQUEST].url}/v1/models").json()["models"]
        )
        # The load generator yields to the servers (started at our priority, and measured
        # against the engine alone at that priority), as it would on a machine of its own.
        os.nice(args.client_niceness)
        order = [*SERVERS, *reversed(SERVERS)]  # halves, mirrored
        engine.measure()
        for clients in (int(c) for c in args.clients.split(",") if c.strip()):
            count = max(args.min_requests, args.requests_per_client * clients)
            work = [(rng.choice(sentences), 1) for _ in range(count)]
            level = {name: Run(name, f"{clients} clients") for name in SERVERS}
            for server_ in served.values():  # warm the connections and the shapes
                asyncio.run(closed_loop(server_.url, work[: min(clients, 8)], clients))
            for number, part in enumerate(rounds(work, clients)):
                for name in SERVERS if number % 2 == 0 else reversed(SERVERS):
                    load = closed_loop(served[name].url, part, clients)
                    measure(level[name], served[name], load)
            before, after = engine.runs[-1][32], engine.measure()[32]
            for run in level.values():
                run.ceiling = (before + after) / 2
                closed.append(run)
                print(
                    f"{run.label}, {run.batching}: {run.throughput:.1f} req/s, p99 "
                    f"{run.percentile(0.99) * 1000:.0f} ms",
                    file=sys.stderr,
                )

        mix = [(rng.choice(sentences), rng.choice(MIX)) for _ in range(768)]
        if args.capacity:  # given: the same arrival rate as an earlier run's
            capacity = {name: args.capacity for name in SERVERS}
        else:
            probes = {name: Run(name, "capacity") for name in SERVERS}
            for half, name in enumerate(order):
                part = mix[: len(mix) // 2] if half < 2 else mix[len(mix) // 2 :]
                measure(probes[name], served[name], closed_loop(served[name].url, part, 64))
            capacity = {name: probe.throughput for name, probe in probes.items()}
        print(f"capacity on the mix: {capacity}", file=sys.stderr)
        for index, share in enumerate(float(x) for x in args.loads.split(",")):
            rate = share * min(capacity.values())
            work, arrivals = open_loop_work(rng, sentences, rate, args.open_seconds)
            level = {name: Run(name, f"{share:.0%} load") for name in SERVERS}
            play_in_chunks(served, level, work, arrivals, args.chunk_seconds, first=index)
            for run in level.values():
                opened.append(run)
                print(
                    f"{run.label}, {run.batching}: p99 {run.percentile(0.99) * 1000:.0f} ms",
                    file=sys.stderr,
                )
    opened.sort(key=lambda run: (run.label, SERVERS.index(run.batching)))
    text = report(closed, opened, engine.runs, capacity, setup)
    replace_section("service", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
