"""One engine in its own process: the job it gets, the timed runs, its memory, the result.

A fresh interpreter per engine keeps each one's peak memory its own and stops one engine
warming the caches of the next. `spawn` runs in the parent; `run_worker` in the child.

`spawn_interleaved` times several engines side by side: every engine's process is loaded at
once and waits, and the parent has them take turns, one timed pass each, configuration by
configuration and repeat by repeat. Only one process works at a time, and a slow spell of the
machine (this one's speed drifts by 20% over a minute) falls on every engine's pass of that
round instead of on whichever engine happened to run then.
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

from bench.compare.profiling import collect_profile
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
    job_path, result_path = _job_files(job, work)
    subprocess.run(
        [sys.executable, "-m", "bench.compare", "--worker", str(job_path), str(result_path)],
        check=True,
        cwd=ROOT,
        env=_environment(),
    )
    return json.loads(result_path.read_text())


def _job_files(job: dict, work: Path) -> tuple[Path, Path]:
    """The job written for the worker, and where its result will be (none there yet)."""
    slug = job["name"].replace(" ", "-")
    work = work.resolve()  # (absolute: a --before-tree worker runs in another folder)
    job_path, result_path = work / f"job-{slug}.json", work / f"result-{slug}.json"
    job_path.write_text(json.dumps(job))
    result_path.unlink(missing_ok=True)
    return job_path, result_path


def _environment() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"}


def spawn_interleaved(jobs: list[dict], work: Path) -> dict[str, dict]:
    """Run the jobs' engines in turns (see the module docstring); returns results by name,
    the same as `spawn` gives for each. All jobs must have the same runs."""
    workers = {}
    for job in jobs:
        job_path, result_path = _job_files(job, work)
        command = [
            sys.executable,
            "-m",
            "bench.compare",
            "--turns",
            str(job_path),
            str(result_path),
        ]
        process = subprocess.Popen(
            command,
            cwd=job.get("tree", ROOT),  # another checkout's worker (--before-tree), or ours
            env=_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        workers[job["name"]] = (process, result_path)
        _answer(process, job["name"])  # loaded: one at a time, so loads do not overlap either
    runs = jobs[0]["runs"]
    for index, run in enumerate(runs):
        for _ in range(run["repeat"] + 1):  # the first pass of each engine warms it up
            for name, (process, _) in workers.items():
                process.stdin.write(json.dumps({"run": index}) + "\n")
                process.stdin.flush()
                _answer(process, name)
        for name in workers:
            print(f"  {name}: beam {run['beam']} batch {run['batch']} done", flush=True)
    results = {}
    for name, (process, result_path) in workers.items():
        process.stdin.write(json.dumps({"finish": True}) + "\n")
        process.stdin.close()
        if process.wait() != 0:
            raise RuntimeError(f"the {name} worker failed")
        results[name] = json.loads(result_path.read_text())
    return results


def _answer(process: subprocess.Popen, name: str) -> None:
    """Wait for the worker's line saying it did what it was told."""
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"the {name} worker stopped (exit status {process.wait()})")


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
    runner: Runner,
    sources: list[list[int]],
    calls: list[Call],
    beam: int,
    repeat: int,
    warm_up: bool = True,
) -> tuple[list[float], list[list[int]]]:
    """A warm-up call, then `repeat` timed passes over every call: (seconds, outputs)."""
    if warm_up:
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


def _run_result(run: dict, seconds: list[float], outputs: list[list[int]]) -> dict:
    """One configuration's result: its passes' times, their median, the outputs."""
    return {
        **run,
        "seconds": seconds,
        "median": statistics.median(seconds) if seconds else float("nan"),
        "tokens": sum(len(t) + 1 for t in outputs),  # + </s>
        "outputs": outputs,
    }


def run_turns(job: dict, commands, answer) -> dict:
    """The worker of `spawn_interleaved`: load the engine, then do one pass of a run per
    command ({"run": i}; the first pass of each run is its warm-up) until {"finish": true}."""
    started = time.perf_counter()
    runner = RUNNERS[job["spec"]["engine"]](job)
    load_seconds = time.perf_counter() - started
    rss_loaded = _status_mib("VmRSS")
    answer("loaded")
    sources, limits = job["sources"], job["limits"]
    ours = job["spec"]["engine"] == "ours"
    passes: dict[int, list[float]] = {}
    outputs: dict[int, list[list[int]]] = {}
    for line in commands:
        command = json.loads(line)
        if command.get("finish"):
            break
        index = command["run"]
        run = job["runs"][index]
        calls = _calls(limits, run["batch"], run["exact_limits"] and not ours)
        seconds, found = _timed(runner, sources, calls, run["beam"], 1, warm_up=False)
        if index in outputs:  # the first pass was the warm-up
            passes.setdefault(index, []).extend(seconds)
        outputs[index] = found
        answer("done")
    results = [
        _run_result(run, passes.get(index, []), outputs.get(index, []))
        for index, run in enumerate(job["runs"])
    ]
    return {
        "name": job["name"],
        "profile": None,
        "load_seconds": load_seconds,
        "rss_loaded_mib": rss_loaded,
        "peak_rss_mib": _peak_rss_mib(),
        "runs": results,
    }


def run_worker(job: dict) -> dict:
    """Load one engine and run every configuration of the job; in its own process."""
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
        results.append(_run_result(run, seconds, outputs))
        where = f"{job['name']}: beam {run['beam']} batch {run['batch']}"
        print(f"  {where}: {results[-1]['median']:.2f} s", flush=True)
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
