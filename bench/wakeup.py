"""What it costs this machine to hand work from one CPU to another: sleeping or spinning.

    .venv/bin/python -m bench.wakeup [--round-trips 2000] [--report]

A thread pool that sleeps between its parallel regions (ONNX Runtime's with spinning off,
OpenMP's passive wait) wakes its threads at every region, and a Python thread handed the GIL
by another is woken the same way. On bare metal a wake-up takes a few microseconds; on a
virtual machine it can take a hundred, because waking a CPU that halted is a trip through the
hypervisor. That decides whether two threads per engine can pay on a machine, and this script
measures it, so that a thread count is chosen from a number and not from a guess.

Two processes, pinned to two different CPUs, pass a byte back and forth:

* **sleeping**: over a pipe, each side blocked in `read`, so the kernel must wake it. Either
  right away (the other side had just gone to sleep: the CPU may still be awake), or after a
  pause of a millisecond, by which time the idle CPU has halted: the case of a thread pool
  between two matmuls of a decoder step, or of a GIL hand-over.
* **spinning**: through shared memory, each side polling it: no wake-up at all. What a pool
  that spins pays, at the price of a CPU kept busy.

Prints round trips (median, p90; a round trip is two hand-overs) and, with --report, writes
the "wakeup" section of docs/performance.md. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from multiprocessing import Process, shared_memory
from pathlib import Path

from bench.report import replace_section

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "performance.md"
PAUSE_S = 0.001  # long enough for an idle CPU to halt


def _pin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})


def _echo_pipe(cpu: int, inbound: int, outbound: int, count: int) -> None:
    _pin(cpu)
    for _ in range(count):
        os.read(inbound, 1)
        os.write(outbound, b"x")


def _echo_shared(cpu: int, name: str, count: int) -> None:
    _pin(cpu)
    memory = shared_memory.SharedMemory(name=name)
    flag = memory.buf
    for _ in range(count):
        while flag[0] != 1:  # spin until the other side hands over
            pass
        flag[0] = 0
    memory.close()


def sleeping(cpus: tuple[int, int], count: int, pause: float) -> list[float]:
    """Round trips in seconds over a pipe (both sides sleep in read)."""
    to_echo, from_main = os.pipe()
    to_main, from_echo = os.pipe()
    echo = Process(target=_echo_pipe, args=(cpus[1], to_echo, from_echo, count + 10))
    echo.start()
    _pin(cpus[0])
    trips = []
    for round_trip in range(count + 10):
        if pause:
            time.sleep(pause)
        start = time.perf_counter()
        os.write(from_main, b"x")
        os.read(to_main, 1)
        if round_trip >= 10:  # the first few warm up
            trips.append(time.perf_counter() - start)
    echo.join()
    for descriptor in (to_echo, from_main, to_main, from_echo):
        os.close(descriptor)
    return trips


def spinning(cpus: tuple[int, int], count: int) -> list[float]:
    """Round trips in seconds through shared memory (both sides poll it)."""
    memory = shared_memory.SharedMemory(create=True, size=1)
    flag = memory.buf
    flag[0] = 0
    echo = Process(target=_echo_shared, args=(cpus[1], memory.name, count + 10))
    echo.start()
    _pin(cpus[0])
    trips = []
    try:
        for round_trip in range(count + 10):
            start = time.perf_counter()
            flag[0] = 1
            while flag[0] != 0:
                pass
            if round_trip >= 10:
                trips.append(time.perf_counter() - start)
        echo.join()
    finally:
        del flag
        memory.close()
        memory.unlink()
    return trips


def summary(trips: list[float]) -> tuple[float, float]:
    ordered = sorted(trips)
    return statistics.median(ordered) * 1e6, ordered[int(0.9 * (len(ordered) - 1))] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--report", action="store_true", help="write the section into --out")
    parser.add_argument("--out", type=Path, default=REPORT)
    args = parser.parse_args()
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        sys.exit("needs two CPUs to hand work between")
    cpus = (available[0], available[1])
    rows = [
        ("sleeping, right after the other side went to sleep", sleeping(cpus, args.round_trips, 0)),
        (
            f"sleeping, after a pause of {PAUSE_S * 1000:g} ms (the other CPU idle)",
            sleeping(cpus, args.round_trips, PAUSE_S),
        ),
        ("spinning", spinning(cpus, args.round_trips)),
    ]
    lines = [
        "## Handing work to the other CPU: a wake-up's cost",
        "",
        f"Reproduce: `python -m bench.wakeup --report` ({platform.machine()}, "
        f"{os.cpu_count()} CPUs, {args.round_trips} round trips each, CPUs {cpus[0]} and "
        f"{cpus[1]}). A round trip is two hand-overs, one each way.",
        "",
        "| hand-over | round trip, median | p90 |",
        "|---|---:|---:|",
    ]
    for label, trips in rows:
        median, p90 = summary(trips)
        lines.append(f"| {label} | {median:.1f} µs | {p90:.1f} µs |")
    text = "\n".join(lines)
    print(text)
    if args.report:
        replace_section("wakeup", text, args.out)


if __name__ == "__main__":
    main()
