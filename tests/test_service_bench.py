"""bench/service_bench.py's steady-state window and closed-loop rounds, on made-up data (the
real run takes minutes and asserts nothing)."""

from __future__ import annotations

import statistics

import pytest

from bench.service_bench import (
    CONTINUOUS,
    REQUEST,
    Run,
    p99_ratio_interval,
    paired_ratio_interval,
    paired_rounds,
    rounds,
    steady_window,
)


def test_the_window_leaves_out_the_start_and_the_end() -> None:
    # 4 clients; every client's answers 1 s apart, the first answers bunched (they all started
    # at once); the work ran out at 10.5 s, and the last answers trickle in after it.
    answered = [1.0, 1.0, 1.0, 1.0] + [t + 0.25 * c for t in range(2, 11) for c in range(4)]
    answered += [11.0, 11.25, 11.5, 11.75]
    seconds, counted = steady_window(sorted(answered), clients=4, ran_out=10.5)
    assert seconds == pytest.approx(9.5)
    assert (
        counted == 4 * 8 + 3
    )  # 2.0 .. 10.5: the bunched start and the answers after 10.5 s are out
    assert counted / seconds == pytest.approx(35 / 9.5)


def test_too_short_a_run_falls_back_to_the_whole_run() -> None:
    assert steady_window([1.0, 1.1, 1.2], clients=4, ran_out=1.2) is None  # fewer than clients
    few = [0.1 * i for i in range(1, 30)]
    assert steady_window(few, clients=8, ran_out=1.0) is None  # 2 answers in the window
    assert steady_window(few, clients=1, ran_out=None) is None  # the work never ran out


def test_a_closed_loop_is_cut_into_an_even_number_of_rounds_of_every_request() -> None:
    work = [(f"sentence {i}", 1) for i in range(96)]
    lone = rounds(work, clients=1)  # 8 requests a round: 12 rounds
    assert len(lone) == 12 and all(len(part) == 8 for part in lone)
    assert [item for part in lone for item in part] == work  # each once, in order
    assert len(rounds(work, clients=8)) == 2  # halves at least
    uneven = rounds(work[:90], clients=2)  # 5 rounds of 8 would do: 4, of 23 or fewer
    assert len(uneven) == 4 and sum(map(len, uneven)) == 90


def test_rounds_are_compared_pair_by_pair() -> None:
    def run(batching: str, label: str, rounds: list[float]) -> Run:
        return Run(batching, label, rounds=rounds)

    # The machine slowed down in the last two rounds: both servers alike.
    lone = [
        run(REQUEST, "1 clients", [20, 20, 10, 10]),
        run(CONTINUOUS, "1 clients", [21, 19, 11, 9]),
    ]
    halves = [run(REQUEST, "32 clients", [80, 90]), run(CONTINUOUS, "32 clients", [100, 110])]
    (line,) = paired_rounds(lone + halves)  # two rounds: no line
    assert line.startswith("1 clients, round by round (4 rounds")
    assert "median 1.00x, from 0.90x to 1.10x" in line


def _open_loop(batching: str, parts: list[list[float]]) -> Run:
    return Run(batching, "70% load", parts=parts)


def test_the_p99_interval_resamples_whole_chunks_on_both_servers() -> None:
    # 40 chunks of 100 answers; the continuous server answers every request in 0.6 of the
    # time: any resample of chunks has the same ratio.
    request = [[0.01 * (i + 1) + chunk for i in range(100)] for chunk in range(40)]
    continuous = [[0.6 * x for x in part] for part in request]
    low, high = p99_ratio_interval(_open_loop(REQUEST, request), _open_loop(CONTINUOUS, continuous))
    assert low == pytest.approx(0.6) and high == pytest.approx(0.6)


def test_the_p99_interval_is_wide_when_one_chunk_decides_the_tail() -> None:
    # One burst: chunk 0 holds request-level's slowest answers; without it (in about a third of
    # the resamples) both servers' p99 come from the quiet chunks, where they are equal.
    quiet = [[0.1] * 100 for _ in range(19)]
    request = [[2.0] * 100, *quiet]
    continuous = [[1.0] * 100, *quiet]
    point = _open_loop(CONTINUOUS, continuous).percentile(0.99) / _open_loop(
        REQUEST, request
    ).percentile(0.99)
    low, high = p99_ratio_interval(_open_loop(REQUEST, request), _open_loop(CONTINUOUS, continuous))
    assert point == pytest.approx(0.5)
    assert low == pytest.approx(0.5) and high == pytest.approx(1.0)


def test_no_p99_interval_from_fewer_than_ten_chunks() -> None:
    parts = [[0.1, 0.2]] * 9
    assert p99_ratio_interval(_open_loop(REQUEST, parts), _open_loop(CONTINUOUS, parts)) is None


def test_the_mean_interval_pairs_chunks_as_the_p99_interval_does() -> None:
    # Chunks differ a lot from each other (a chunk's arrivals decide its latencies), but A is
    # 0.8 of B within every chunk: kept together, every resample gives 0.8.
    b_parts = [[0.05 * (chunk + 1)] * 10 for chunk in range(20)]
    a_parts = [[0.8 * x for x in part] for part in b_parts]
    low, high = paired_ratio_interval(a_parts, b_parts, statistics.mean)
    assert low == pytest.approx(0.8) and high == pytest.approx(0.8)
    # Pairs torn apart (A's chunks against B's in reverse), the interval widens around 0.8.
    low, high = paired_ratio_interval(a_parts, b_parts[::-1], statistics.mean)
    assert low < 0.75 and high > 0.85
