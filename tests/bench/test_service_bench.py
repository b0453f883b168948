"""bench/load.py's steady-state window and closed-loop rounds, and bench/service_bench.py's
comparisons with a baseline server and its report, on made-up data (the real run takes minutes
and asserts nothing); the open loop's record of each request, against a small aiohttp server."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from bench.load import Run, paired_ratio_interval, rounds, steady_window
from bench.service_bench import BASELINE, THIS, p99_ratio_interval, paired_rounds, report


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
    def run(server: str, label: str, rounds: list[float]) -> Run:
        return Run(server, label, rounds=rounds)

    # The machine slowed down in the last two rounds: both servers alike.
    lone = [
        run(BASELINE, "1 clients", [20, 20, 10, 10]),
        run(THIS, "1 clients", [21, 19, 11, 9]),
    ]
    halves = [run(BASELINE, "32 clients", [80, 90]), run(THIS, "32 clients", [100, 110])]
    (line,) = paired_rounds(lone + halves)  # two rounds: no line
    assert line.startswith("1 clients, round by round (4 rounds")
    assert "median 1.00x, from 0.90x to 1.10x" in line


def _open_loop(server: str, parts: list[list[float]]) -> Run:
    return Run(server, "70% load", parts=parts)


def test_the_p99_interval_resamples_whole_chunks_on_both_servers() -> None:
    # 40 chunks of 100 answers; this server answers every request in 0.6 of the baseline's
    # time: any resample of chunks has the same ratio.
    baseline = [[0.01 * (i + 1) + chunk for i in range(100)] for chunk in range(40)]
    this = [[0.6 * x for x in part] for part in baseline]
    low, high = p99_ratio_interval(_open_loop(BASELINE, baseline), _open_loop(THIS, this))
    assert low == pytest.approx(0.6) and high == pytest.approx(0.6)


def test_the_p99_interval_is_wide_when_one_chunk_decides_the_tail() -> None:
    # One burst: chunk 0 holds the baseline's slowest answers; without it (in about a third of
    # the resamples) both servers' p99 come from the quiet chunks, where they are equal.
    quiet = [[0.1] * 100 for _ in range(19)]
    baseline = [[2.0] * 100, *quiet]
    this = [[1.0] * 100, *quiet]
    point = _open_loop(THIS, this).percentile(0.99) / _open_loop(BASELINE, baseline).percentile(
        0.99
    )
    low, high = p99_ratio_interval(_open_loop(BASELINE, baseline), _open_loop(THIS, this))
    assert point == pytest.approx(0.5)
    assert low == pytest.approx(0.5) and high == pytest.approx(1.0)


def test_no_p99_interval_from_fewer_than_ten_chunks() -> None:
    parts = [[0.1, 0.2]] * 9
    assert p99_ratio_interval(_open_loop(BASELINE, parts), _open_loop(THIS, parts)) is None


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


def _report_runs(servers: tuple[str, ...]) -> tuple[list[Run], list[Run]]:
    """A closed-loop level and an open-loop load on each server, with counters filled in."""

    def run(server: str, label: str, parts: list[list[float]]) -> Run:
        return Run(
            server,
            label,
            requests=sum(map(len, parts)),
            counted=sum(map(len, parts)),
            seconds=10.0,
            steps=50.0,
            sentence_steps=200.0,
            cpu={"engine": 1.0, "server": 0.5, "client": 0.25},
            ceiling=40.0,
            rounds=[10.0, 10.0],
            parts=parts,
        )

    quiet = [[0.1] * 10 for _ in range(12)]
    closed = [run(name, "8 clients", quiet) for name in servers]
    opened = [run(name, "70% load", quiet) for name in servers]
    return closed, opened


def _setup(servers: str) -> dict[str, str]:
    return {
        "load": "0.50 / 0.50 / 0.50",
        "threads": "1",
        "sentences": "from a built-in list",
        "niceness": "10",
        "chunk": "5",
        "capacity": "",
        "servers": servers,
        "model": "fr-en (fp32)",
    }


def test_the_report_of_one_server_has_no_comparison_column() -> None:
    closed, opened = _report_runs((THIS,))
    text = report(closed, opened, [{1: 20.0, 32: 40.0}] * 2, {THIS: 60.0}, _setup(""))
    assert "baseline" not in text
    assert (
        "| 8 clients | this | 120 | 12.0 | 100 | 100 | 100 | 4.0 | 8.3 / 4.2 / 2.1 | 30% |" in text
    )
    assert "| 70% load | this | 120 | 12.0 | 100 | 100 | 100 | 4.0 | 8.3 / 4.2 / 2.1 |\n" in text
    assert "same mix, 60.0 this." in text


def test_the_report_against_a_baseline_gives_this_servers_p99_over_the_baselines() -> None:
    closed, opened = _report_runs((BASELINE, THIS))
    setup = _setup("this (defaults, this checkout), baseline (defaults, from /tmp/before)")
    text = report(closed, opened, [{1: 20.0, 32: 40.0}] * 2, {BASELINE: 50.0, THIS: 60.0}, setup)
    assert "| load | server |" in text and "p99 vs baseline (95% interval) |" in text
    assert "| 70% load | baseline | 120 |" in text
    # 12 identical chunks on both: the ratio is 1 in every resample.
    assert text.count("| 1.00x (1.00-1.00) |") == 1
    assert "the loads below are shares of the lower, 50.0." in text


def test_the_open_loop_records_each_request_in_the_order_of_its_work() -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from bench.load import open_loop

    quick_answered = asyncio.Event()

    async def translate(request: web.Request) -> web.Response:
        text = (await request.json())["text"]
        if "slow" in text:  # ends after the quick one, whatever the machine's speed
            await quick_answered.wait()
            await asyncio.sleep(0.2)
        elif "quick" in text:
            quick_answered.set()
        return web.json_response({}, status=503 if "refused" in text else 200)

    async def play() -> tuple[list[dict], int]:
        app = web.Application()
        app.router.add_post("/v1/translate", translate)
        async with TestServer(app) as server:
            played: list[dict] = []
            work = [("slow one", 4), ("quick", 1), ("refused here", 1)]
            _, errors, _, _ = await open_loop(
                str(server.make_url("")), work, [0.0, 0.01, 0.02], played
            )
            return played, errors

    played, errors = asyncio.run(play())
    assert [(r["at"], r["beam"], r["words"]) for r in played] == [
        (0.0, 4, 2), (0.01, 1, 1), (0.02, 1, 2),
    ]  # fmt: skip
    slow, quick, refused = (r["latency"] for r in played)
    assert slow >= 0.2 and quick is not None  # the slow one arrived first and ended last
    assert refused is not None and errors == 1  # answered, with an error status
