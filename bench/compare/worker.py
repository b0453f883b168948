"""One engine in its own process: the job it gets, the timed runs, its memory, the result.

A fresh interpreter per engine keeps each one's peak memory its own and stops one engine
warming the caches of the next. `spawn` runs in the parent; `run_worker` in the child.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.compare.profiling import collect_profile, install_profiler
from bench.compare.runners import ENGINES, RUNNERS, Runner

ROOT = Path(__file__).resolve().parents[2]
Call = tuple[list[int], int]  # the sentence indices of one engine call, and their length limit


def make_job(
    name: str,
    paths: dict[str, Path],
    threads: int,
    maps: dict,
    sources: list[list[int]],
    limits: list[int],
    runs: list[dict],
    **extra: str,
) -> dict:
    """What one engine subprocess needs: its spec, the artefacts, the sentences, the runs."""
    return {
        "name": name,
        "spec": ENGINES[name],
        "paths": {k: str(v) for k, v in paths.items()},
        "threads": threads,
        "maps": maps,
        "sources": sources,
        "limits": limits,
        "runs": runs,
        **extra,
    }


def spawn(job: dict, work: Path) -> dict:
    """Run one engine's job in a fresh interpreter and read back its result."""
    slug = job["name"].replace(" ", "-")
    job_path, result_path = work / f"job-{slug}.json", work / f"result-{slug}.json"
    job_path.write_text(json.dumps(job))
    result_path.unlink(missing_ok=True)
    environment = {**os.environ, "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"}
    subprocess.run(
        [sys.executable, "-m", "bench.compare", "--worker", str(job_path), str(result_path)],
        check=True,
        cwd=ROOT,
        env=environment,
    )
    return json.loads(result_path.read_text())


def _status_mib(field: str) -> float | None:
    """A memory field of /proc/self/status (Linux), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _peak_rss_mib() -> float:
    """This process's resident-set high-water mark. VmHWM belongs to the address space, so it
    starts afresh at exec; ru_maxrss (the fallback off Linux) can carry the parent's peak."""
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def _by_limit(indices: list[int], limits: list[int]) -> list[list[int]]:
    """Split a batch into groups of equal length limit (for engines with one limit a call)."""
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(limits[i], []).append(i)
    return list(groups.values())


def _calls(limits: list[int], batch: int, one_limit_per_call: bool) -> list[Call]:
    """Every engine call of one pass, in order: batches of `batch`,
    each split by `_by_limit` for an engine that must get each sentence's own limit."""
    calls = []
    for start in range(0, len(limits), batch):
        chunk = list(range(start, min(start + batch, len(limits))))
        groups = _by_limit(chunk, limits) if one_limit_per_call else [chunk]
        calls += [(group, max(limits[i] for i in group)) for group in groups]
    return calls


def _timed(
    runner: Runner, sources: list[list[int]], calls: list[Call], beam: int, repeat: int
) -> tuple[list[float], list[list[int]]]:
    """A warm-up call, then `repeat` timed passes over every call: (seconds, outputs)."""
    group, limit = calls[0]
    runner.translate([sources[i] for i in group], beam, limit)
    seconds, outputs = [], [[] for _ in sources]
    for _ in range(repeat):
        begin = time.perf_counter()
        for group, limit in calls:
            found = runner.translate([sources[i] for i in group], beam, limit)
            for i, tokens in zip(group, found, strict=True):
                outputs[i] = tokens
        seconds.append(time.perf_counter() - begin)
    return seconds, outputs


def run_worker(job: dict) -> dict:
    """Load one engine and run every configuration of the job; in its own process."""
    if job.get("profile_prefix"):
        install_profiler(job["profile_prefix"])
    started = time.perf_counter()
    runner = RUNNERS[job["spec"]["engine"]](job)
    load_seconds = time.perf_counter() - started
    rss_loaded = _status_mib("VmRSS")
    sources, limits = job["sources"], job["limits"]
    ours = job["spec"]["engine"] == "ours"  # applies each sentence's own limit
    results, runs_started = [], time.perf_counter()
    for run in job["runs"]:
        calls = _calls(limits, run["batch"], run["exact_limits"] and not ours)
        seconds, outputs = _timed(runner, sources, calls, run["beam"], run["repeat"])
        median = statistics.median(seconds)
        tokens = sum(len(t) + 1 for t in outputs)  # + </s>
        results.append(
            {**run, "seconds": seconds, "median": median, "tokens": tokens, "outputs": outputs}
        )
        where = f"{job['name']}: beam {run['beam']} batch {run['batch']}"
        print(f"  {where}: {median:.2f} s", flush=True)
    profile = None
    if job.get("profile_prefix"):
        # Warm-up included: the profiler saw it too.
        profile = collect_profile(runner.translator.engine, time.perf_counter() - runs_started)
    return {
        "name": job["name"],
        "profile": profile,
        "load_seconds": load_seconds,
        "rss_loaded_mib": rss_loaded,
        "peak_rss_mib": _peak_rss_mib(),
        "runs": results,
    }
