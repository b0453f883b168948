"""Load for the service benchmarks: sentences, closed and open loops of aiohttp clients, and
what a server did meanwhile (its decoder steps from /metrics, CPU time from /proc).

The clients are aiohttp's: httpx took about 5 ms of CPU a request here against aiohttp's 1 ms,
and with 2 cores shared that was enough to starve the servers of requests. Servers come from
bench.harness; bench.service_bench, bench.service_ab and bench.lone_client play these loads.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import ROOT, Server

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
ROUND_REQUESTS = 8  # closed loop: requests per client in a round, at least
MIX = (1, 4)  # open loop: half greedy, half beam 4
# What a measured server runs with: no per-request log line, and no translation cache (the
# clients repeat their sentences: the cache would answer them, not the decoding).
SERVED = {"access_log": "false", "cache_entries": 0}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile of `values` (0 <= q <= 1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Run:
    server: str  # which server played it
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
    # Each measured part's latencies (closed loop: a round; open loop: a chunk, played by
    # every server)
    parts: list[list[float]] = field(default_factory=list)
    # Open loop: each request as played (chunk, arrival in the chunk, beam, words, latency or
    # None when no answer came), to compare servers request by request (--requests-log).
    played: list[dict] = field(default_factory=list)

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


def load_sentences(path: Path) -> tuple[list[str], str]:
    """The first 500 lines of `path` (Multi30k's test set), or a built-in list without it;
    and where they came from, for the report."""
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines()[:500], f"from {path.name}"
    return FALLBACK_SENTENCES, "from a built-in list (Multi30k not found)"


def settings(pairs: list[str]) -> dict[str, str]:
    """NAME=VALUE pairs (NMT_ prefix optional) -> start_server() settings."""
    found = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        found[name.removeprefix("NMT_").lower()] = value
    return found


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
    count that start and that end, which differ between servers, and weigh more the
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
    """A closed loop's work cut into rounds, each played by every server in turn: an even
    number of them, at least 8 requests per client each, two at least (halves). A lone
    client answers 96 requests in a few seconds: many short rounds let a slow spell of the
    machine fall on every server alike."""
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
    url: str,
    work: list[tuple[str, int]],
    arrivals: list[float],
    played: list[dict] | None = None,
) -> tuple[list[float], int, float, int]:
    """Send work[i] at arrivals[i] seconds from the start, whatever is still unanswered.
    Returns the latencies, the errors, the wall time and the requests answered; each request
    is also added to `played`, when given, in the order of `work`."""
    latencies: list[float] = []
    errors = 0
    records = [
        {"at": round(at, 4), "beam": beam, "words": len(text.split()), "latency": None}
        for at, (text, beam) in zip(arrivals, work, strict=True)
    ]

    async def send(client: aiohttp.ClientSession, index: int) -> None:
        nonlocal errors
        at, (text, beam) = arrivals[index], work[index]
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
        answered: list[float] = []
        # Awaited first: `errors += not await ...` would read `errors` before the wait and
        # write back a stale count over the failures of the requests answered meanwhile.
        ok = await translate_once(client, text, beam, answered)
        errors += not ok
        latencies.extend(answered)
        if answered:
            records[index]["latency"] = round(answered[0], 5)

    async with client_session(url, 1000) as client:
        started = time.perf_counter()
        await asyncio.gather(*(send(client, index) for index in range(len(work))))
        if played is not None:
            played.extend(records)
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
    served: dict[str, Server],
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
            played: list[dict] = []
            load = open_loop(served[name].url, chunk_work, chunk_arrivals, played)
            measure(runs[name], served[name], load)
            runs[name].played.extend({"chunk": chunk, **record} for record in played)


def measure(run: Run, served: Server, load: Coroutine) -> None:
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


def paired_ratio_interval(
    a_parts: list[list[float]],
    b_parts: list[list[float]],
    statistic: Callable[[list[float]], float],
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A 95% bootstrap interval of statistic(A's latencies) / statistic(B's), resampling the
    chunks that both played: each chunk's arrivals were played by both servers, and each
    starts from an empty server and ends when its last answer is in, so chunks are the
    independent units, and a resample keeps a chunk's latencies on both servers together.
    None with fewer than 10 chunks."""
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
