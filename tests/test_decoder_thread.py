"""bench/decoder_thread.py's timers and table, on made-up calls (the real run takes minutes and
asserts nothing), and the methods it wraps: a rename must not leave the bench timing nothing."""

from __future__ import annotations

import importlib

import pytest

from bench.decoder_thread import TIMED, Timers, rows_bucket, table


def test_timers_add_up_each_label_even_when_the_call_raises() -> None:
    timers = Timers()

    def fail() -> None:
        raise ValueError("bad input")

    double = timers.wrap(lambda x: 2 * x, "double")
    by_argument = timers.wrap(lambda x: x, lambda x: f"label {x}")
    failing = timers.wrap(fail, "fail")
    assert double(2) == 4 and double(3) == 6
    assert by_argument("a") == "a"
    with pytest.raises(ValueError, match="bad input"):
        failing()
    assert timers.calls == {"double": 2, "label a": 1, "fail": 1}
    assert all(seconds >= 0 for seconds in timers.seconds.values())


def test_the_table_lists_the_longest_first_and_what_the_worker_does_besides_the_graphs() -> None:
    totals = {
        "worker turns": [50.0, 1000],
        "ONNX Runtime: decoder (worker thread)": [35.0, 1000],
        "ONNX Runtime: encoder (encode thread)": [10.0, 400],
        "ONNX Runtime: encoder (worker thread)": [1.0, 20],
        "moving rows": [2.0, 800],
    }
    lines = table(totals, wall=100.0).splitlines()
    names = [line.split(" | ")[0].lstrip("| ") for line in lines[2:]]
    assert names[:5] == [
        "worker turns",
        "ONNX Runtime: decoder (worker thread)",
        "ONNX Runtime: encoder (encode thread)",
        "moving rows",
        "ONNX Runtime: encoder (worker thread)",
    ]
    assert lines[3] == "| ONNX Runtime: decoder (worker thread) | 35.0 | 35% | 1000 | 35.00 |"
    # 50 s of turns, 36 s of it in ONNX Runtime on the worker thread (not the encode thread's)
    last = "| worker turns less ONNX Runtime on the worker thread | 14.0 | 14%"
    assert lines[-1].startswith(last)


@pytest.mark.parametrize(("module", "owner", "method", "label"), TIMED)
def test_every_timed_method_exists(module: str, owner: str, method: str, label: str) -> None:
    assert callable(getattr(getattr(importlib.import_module(module), owner), method))


def test_the_steps_by_rows_come_in_row_order_and_the_padding_as_a_mean() -> None:
    totals = {
        "worker turns": [10.0, 100],
        "decoder graph, rows 9-12": [0.3, 100],
        "decoder graph, rows 1-4": [0.2, 100],
        "padding share: cached positions": [40.0, 100],
    }
    text = table(totals, wall=10.0)
    assert "decoder graph" not in text.split("\n\n")[0]  # not among the parts
    assert "| 1-4 | 100 | 2.00 |\n| 9-12 | 100 | 3.00 |" in text
    assert text.endswith("Padding, mean over the decoder steps: cached positions 40%.")


def test_steps_are_told_apart_by_rows_in_powers_of_two() -> None:
    buckets = [rows_bucket(rows) for rows in (1, 2, 3, 4, 5, 8, 9, 16, 17, 128, 129)]
    assert buckets == [
        "1",
        "2",
        "3-4",
        "3-4",
        "5-8",
        "5-8",
        "9-16",
        "9-16",
        "17-32",
        "65-128",
        "129-256",
    ]
