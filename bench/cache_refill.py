"""What a core's caches being emptied costs the Python that runs next.

    python -m bench.cache_refill [--repeat 2000]

A few numpy calls on tiny arrays, the kind a search step makes (an add, a compare, `any`,
`flatnonzero`, a `concatenate`), are timed in a row, and right after summing an array of
1 to 16 MB, as a decoder step's graph reads its megabytes of weights. Once the array is
larger than the core's L2, the calls read the interpreter's and numpy's code and data back
from L3, once: ten rounds of the calls pay it as one round does. An array read with a
stride of a page, which touches a page's translation but little of the cache, shows what
the TLB's share is. Medians of --repeat; writes the "cache-refill" section of
docs/performance.md (bench.time_split measures the same in the engine's own loop).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.report import cpu_model, replace_section, reproduce

MB = 2**20
SWEEPS_MB = (0, 0.5, 1, 2, 4, 16)
FLOAT32 = 4
PAGE = 4096


def search_like_calls(rounds: int) -> Callable[[], None]:
    """`rounds` rounds of five small numpy calls on arrays made once."""
    row, sequences = np.arange(4), np.zeros((4, 20), dtype=np.int64)

    def calls() -> None:
        for _ in range(rounds):
            moved = row + 1
            (sequences[:, -5:-1] == sequences[:, -1:]).any()
            np.flatnonzero(moved > 2)
            np.concatenate([sequences, moved[:, None]], axis=1)

    return calls


def median_us(calls: Callable[[], None], sweep: Callable[[], object], repeat: int) -> float:
    """The median time of `calls` right after `sweep`, in µs."""
    times = []
    for _ in range(repeat):
        sweep()
        started = time.perf_counter()
        calls()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def measure(repeat: int) -> list[tuple[str, float, float]]:
    """(what was read before the calls, µs of one round, µs of ten rounds) per sweep."""
    big = np.ones(16 * MB // FLOAT32, dtype=np.float32)
    sweeps: list[tuple[str, Callable[[], object]]] = [
        ("nothing", lambda: None),
        *[
            (f"{size:g} MB", lambda n=int(size * MB) // FLOAT32: big[:n].sum())
            for size in SWEEPS_MB
            if size
        ],
        ("one float a page of 16 MB (4,096 pages)", lambda: big[:: PAGE // FLOAT32].sum()),
    ]
    one, ten = search_like_calls(1), search_like_calls(10)
    return [(name, median_us(one, s, repeat), median_us(ten, s, repeat)) for name, s in sweeps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("docs/performance.md"))
    args = parser.parse_args()
    rows = [f"| {name} | {one:.1f} | {ten:.1f} |" for name, one, ten in measure(args.repeat)]
    for row in rows:
        print(row, flush=True)
    table = "\n".join(
        [
            f"Reproduce: `{reproduce('bench.cache_refill')}` ({cpu_model()}; medians of "
            f"{args.repeat}; pin it to one core, e.g. `taskset -c 0`)",
            "",
            "| read right before | five numpy calls, µs | ten rounds of them, µs |",
            "|---|---:|---:|",
            *rows,
        ]
    )
    replace_section("cache-refill", table, args.out)


if __name__ == "__main__":
    main()
