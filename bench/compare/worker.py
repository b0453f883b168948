"""One engine in its own process: the job it gets, the timed runs, its memory, the result.

A fresh interpreter per engine keeps each one's peak memory its own and stops one engine
warming the caches of the next. `spawn` runs in the parent; `run_worker` in the child.

`spawn_interleaved` times several engines side by side: every engine's process is loaded at
once and waits, and the parent has them take turns on each stretch of a pass (TURN_SENTENCES
sentences, or one batch where a batch holds more), the first one rotating, configuration by
configuration and repeat by repeat. Only one process works at a time, and each stretch's time
is its median over the repeats. This machine's speed drifts by a tenth or more within a
minute: taking turns on whole passes (a few seconds each) left two engines that decode alike
1.12x apart at greedy batch 1 (CTranslate2's patience 1 and 2, one run on an AMD EPYC); turns
of a few hundred milliseconds see the same machine. Not shorter: a call after another
process's turn finds its weights out of the caches (a sentence took ours 1.08x-1.26x and
CTranslate2 1.14x-1.15x its time after 64 MB were read, a scratch script), which a server
decoding all the time does not pay at every call.
"""

from __future__ import annotations

import json
import math
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
TURN_SENTENCES = 20  # an engine's turn: this many sentences' batches, or one batch


def turns(sentences: int, batch: int) -> list[range]:
    """The batches (by index, in order) of each turn of a pass over `sentences` sentences in
    batches of `batch`."""
    batches = math.ceil(sentences / batch)
    per_turn = max(1, TURN_SENTENCES // batch)
    return [range(start, min(start + per_turn, batches)) for start in range(0, batches, per_turn)]


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
    runs, names = jobs[0]["runs"], list(workers)
    for index, run in enumerate(runs):
        stretches = len(turns(len(jobs[0]["sources"]), run["batch"]))
        for turn in range(run["repeat"] + 1):  # the first pass of each engine warms it up
            for chunk in range(stretches):
                first = (turn + chunk) % len(names)
                for name in names[first:] + names[:first]:
                    process = workers[name][0]
                    command = {"run": index, "chunk": chunk, "warm_up": turn == 0}
                    process.stdin.write(json.dumps(command) + "\n")
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


def _batches(limits: list[int], batch: int, one_limit_per_call: bool) -> list[list[Call]]:
    """The engine calls of one pass, batch by batch: batches of `batch` sentences in order,
    each split by `_by_limit` for an engine that must get each sentence's own limit."""
    batches = []
    for start in range(0, len(limits), batch):
        chunk = list(range(start, min(start + batch, len(limits))))
        groups = _by_limit(chunk, limits) if one_limit_per_call else [chunk]
        batches.append([(group, max(limits[i] for i in group)) for group in groups])
    return batches


def _calls(limits: list[int], batch: int, one_limit_per_call: bool) -> list[Call]:
    """Every engine call of one pass, in order (`_batches`, one after the other)."""
    return [call for calls in _batches(limits, batch, one_limit_per_call) for call in calls]


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


def _run_result(
    run: dict, seconds: list[float], outputs: list[list[int]], median: float | None = None
) -> dict:
    """One configuration's result: its passes' times, the pass time reported (`median`; by
    default the median of the passes), the outputs."""
    if median is None:
        median = statistics.median(seconds) if seconds else float("nan")
    return {
        **run,
        "seconds": seconds,
        "median": median,
        "tokens": sum(len(t) + 1 for t in outputs),  # + </s>
        "outputs": outputs,
    }


def run_turns(job: dict, commands, answer) -> dict:
    """The worker of `spawn_interleaved`: load the engine, then translate one turn's batches of
    a run per command ({"run": i, "chunk": c, "warm_up": bool}: the c-th of `turns`; the first
    pass of each run is its warm-up) until {"finish": true}. A run's pass time is the sum of
    its turns' median times."""
    started = time.perf_counter()
    runner = RUNNERS[job["spec"]["engine"]](job)
    load_seconds = time.perf_counter() - started
    rss_loaded = _status_mib("VmRSS")
    answer("loaded")
    sources, limits = job["sources"], job["limits"]
    ours = job["spec"]["engine"] == "ours"
    stretches: dict[int, list[list[Call]]] = {}  # per run: each turn's calls
    times: dict[int, list[list[float]]] = {}  # per run and turn: its timed passes
    outputs: dict[int, list[list[int]]] = {}
    for line in commands:
        command = json.loads(line)
        if command.get("finish"):
            break
        index, chunk = command["run"], command["chunk"]
        run = job["runs"][index]
        if index not in stretches:
            batches = _batches(limits, run["batch"], run["exact_limits"] and not ours)
            stretches[index] = [
                [call for b in turn for call in batches[b]]
                for turn in turns(len(sources), run["batch"])
            ]
            times[index] = [[] for _ in stretches[index]]
            outputs[index] = [[] for _ in sources]
        begin = time.perf_counter()
        for group, limit in stretches[index][chunk]:
            found = runner.translate([sources[i] for i in group], run["beam"], limit)
            for i, tokens in zip(group, found, strict=True):
                outputs[index][i] = tokens
        if not command.get("warm_up"):
            times[index][chunk].append(time.perf_counter() - begin)
        answer("done")
    results = []
    for index, run in enumerate(job["runs"]):
        per_turn = times.get(index, [])
        passes = [sum(pass_) for pass_ in zip(*per_turn, strict=True)] if per_turn else []
        median = sum(statistics.median(each) for each in per_turn) if passes else None
        results.append(_run_result(run, passes, outputs.get(index, []), median))
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
