"""`nmt bench` (bench/compare/) without engines: its options, the calls it makes, its report
and chart from fixed results. The real run is `nmt bench`; it takes minutes."""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET

from bench.compare import add_arguments
from bench.compare.plot import svg_chart
from bench.compare.report import speed_markdown, speed_rows
from bench.compare.runners import ENGINES, SEARCHES
from bench.compare.worker import _calls


def fixed_results() -> dict[str, dict]:
    """Every engine, every search: 10 sentences, engine e takes (1 + e) / 10 s a pass."""
    results = {}
    for e, name in enumerate(ENGINES):
        runs = [
            {"beam": beam, "batch": batch, "median": (1 + e) / 10, "tokens": 100}
            | {"outputs": [[1, 2]] * 10, "repeat": 1, "exact_limits": False}
            for beam, batch in SEARCHES
        ]
        results[name] = {
            "name": name,
            "runs": runs,
            "load_seconds": 0.5,
            "rss_loaded_mib": 100.0,
            "peak_rss_mib": 150.0,
        }
    return results


def test_nmt_bench_keeps_its_options() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = {o for action in parser._actions for o in action.option_strings}
    assert options >= {"--checkpoint", "--data", "--sentences", "--repeat", "--threads"}
    assert options >= {"--engines", "--work-dir", "--out", "--section", "--profile"}
    assert "--parity-lines" in options


def test_engines_that_take_one_limit_a_call_get_sentences_grouped_by_limit() -> None:
    limits = [10, 10, 12, 12, 15]
    assert _calls(limits, 32, False) == [([0, 1, 2, 3, 4], 15)]
    assert _calls(limits, 32, True) == [([0, 1], 10), ([2, 3], 12), ([4], 15)]
    assert _calls(limits, 2, True) == [([0, 1], 10), ([2, 3], 12), ([4], 15)]
    assert _calls(limits, 3, False) == [([0, 1, 2], 12), ([3, 4], 15)]


def test_report_and_chart_show_every_engine_and_search() -> None:
    rows = speed_rows(fixed_results())
    setup = {"sentences": 10, "data": "test.fr", "mean_source": 12.0, "threads": 1}
    setup |= {"repeat": 1, "cpu": "cpu", "versions": {}, "checkpoint": "models/fr-en"}
    markdown = speed_markdown(rows, setup, "nmt bench", "compare.svg")
    assert "| ours fp32 | 1000 (1.00x) | 1000 (1.00x) | 1000 (1.00x) | 1000 (1.00x) |" in markdown
    assert "| transformers fp32 | 143 (0.14x) |" in markdown
    assert "**met** (500 vs 167 tokens/s, 3.00x)" in markdown
    chart = ET.fromstring(svg_chart(rows, "Tokens/s <same weights>"))
    bars = chart.findall("{http://www.w3.org/2000/svg}rect")
    assert len(bars) == len(ENGINES) * len(SEARCHES)
