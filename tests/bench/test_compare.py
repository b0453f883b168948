"""`python -m bench.compare` without engines: its options, the calls it makes, its report and
chart from fixed results. The real run takes minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import setuptools

import nmt_cli
from bench.compare.plot import svg_chart
from bench.compare.profiling import collect_profile, per_step
from bench.compare.report import speed_markdown, speed_rows
from bench.compare.runners import ENGINES, SEARCHES
from bench.compare.worker import _calls
from service.runtime.bundle import load_bundle
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator
from tests.conftest import ROOT

# Seconds a pass of 100 tokens takes each engine in the fixed results (tokens/s: 100 / it).
PASS_SECONDS = {
    "ours fp32": 0.1,
    "ours int8": 0.2,
    "ours int8 shortlist": 0.3,
    "ctranslate2 fp32": 0.6,
    "ctranslate2 int8": 0.7,
    "ctranslate2 int8 patience 1": 0.8,
    "ctranslate2 int8 vmap": 0.9,
    "transformers fp32": 1.0,
}


def fixed_results() -> dict[str, dict]:
    """Every engine, every search: 10 sentences, each engine its PASS_SECONDS a pass."""
    assert set(PASS_SECONDS) == set(ENGINES)
    results = {}
    for name in ENGINES:
        runs = [
            {"beam": beam, "batch": batch, "median": PASS_SECONDS[name], "tokens": 100}
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


def test_python_m_bench_compare_runs_from_the_repository_root_and_has_its_options() -> None:
    # bench/ is not installed: `python -m` from the root is how it runs (and how it starts its
    # engine workers); --help reads the options without loading any engine.
    done = subprocess.run(
        [sys.executable, "-m", "bench.compare", "--help"],
        cwd=ROOT,
        env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.startswith("usage: python -m bench.compare")
    for option in ("--checkpoint", "--engines", "--repeat", "--threads", "--parity-lines"):
        assert option in done.stdout


def test_the_product_neither_ships_nor_imports_the_benchmarks() -> None:
    # Not in the wheel: setuptools' package list, as pyproject.toml configures it.
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = setuptools.find_packages(str(ROOT), include=find["packages"]["find"]["include"])
    assert "service" in packages and "export" in packages
    assert not [name for name in packages if name.split(".")[0] in ("bench", "tests")]
    # Not a subcommand, and not imported by the CLI (in a fresh interpreter).
    code = "import json, sys, nmt_cli; nmt_cli.build_parser(); print(json.dumps(list(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert not [name for name in json.loads(done.stdout) if name.split(".")[0] == "bench"]
    with pytest.raises(SystemExit):
        nmt_cli.build_parser().parse_args(["bench"])


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
    markdown = speed_markdown(rows, setup, "python -m bench.compare", "compare.svg")
    assert "| ours fp32 | 1000 (1.00x) | 1000 (1.00x) | 1000 (1.00x) | 1000 (1.00x) |" in markdown
    assert "| transformers fp32 | 100 (0.10x) |" in markdown
    # Issue 39's targets: ours int8 500 tokens/s and 333 with the shortlist, CTranslate2 int8
    # 143, 125 with patience 1 and 111 with its vocabulary map.
    every_cell = (
        "greedy, batch 1 {0}, greedy, batch 32 {0}, beam 4, batch 1 {0}, beam 4, batch 32 {0}"
    )
    assert (
        f"1.2x ctranslate2 int8 in every cell: **met** ({every_cell.format('3.50x')})" in markdown
    )
    assert f"patience 1 in every cell: **met** ({every_cell.format('4.00x')})" in markdown
    assert "shortlist at least 1.2x ctranslate2 int8 vmap in every cell: **met** (" in markdown
    assert (
        f"ours int8 shortlist / ours int8: {every_cell.format('0.67x')}; "
        f"ctranslate2 int8 vmap / ctranslate2 int8: {every_cell.format('0.78x')}"
    ) in markdown
    chart = ET.fromstring(svg_chart(rows, "Tokens/s <same weights>"))
    bars = chart.findall("{http://www.w3.org/2000/svg}rect")
    assert len(bars) == len(ENGINES) * len(SEARCHES)


def test_a_turn_taking_worker_times_every_batch_but_the_warm_up(monkeypatch) -> None:
    """The worker of spawn_interleaved: one batch per command, the warm-up pass untimed; a
    run's pass time is the sum of its batches' median times (not the median pass)."""
    import json

    from bench.compare import worker

    calls = []
    # Each translate call takes the next of these many seconds on a fake clock: run 0's
    # warm-up pass, then its three timed passes of two batches each; run 1's warm-up and two.
    durations = iter([100, 200, 1, 30, 2, 10, 3, 20, 100, 5, 7])
    now = [0.0]

    class CountingRunner:
        def __init__(self, job: dict) -> None:
            pass

        def translate(self, sources, beam, limit):
            calls.append((len(sources), beam, limit))
            now[0] += next(durations)
            return [list(reversed(s)) for s in sources]

    monkeypatch.setattr(worker.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(worker, "TURN_SENTENCES", 2)  # a turn: one batch of 2, or of 3
    monkeypatch.setitem(worker.RUNNERS, "counting", CountingRunner)
    runs = [
        {"beam": 1, "batch": 2, "repeat": 3, "exact_limits": False},
        {"beam": 4, "batch": 3, "repeat": 2, "exact_limits": False},
    ]
    job = {"name": "counting", "spec": {"engine": "counting"}, "runs": runs}
    job |= {"sources": [[5, 6], [7], [8, 9, 10]], "limits": [4, 3, 5]}
    # batch 2 over 3 sentences is two turns a pass, batch 3 one
    commands = [
        {"run": 0, "chunk": chunk, "warm_up": turn == 0} for turn in range(4) for chunk in (0, 1)
    ]
    commands += [{"run": 1, "chunk": 0, "warm_up": turn == 0} for turn in range(3)]
    lines = [json.dumps(command) for command in commands] + ['{"finish": true}']
    answers = []
    result = worker.run_turns(job, iter(lines), answers.append)
    assert answers == ["loaded"] + ["done"] * 11
    assert calls == [(2, 1, 4), (1, 1, 5)] * 4 + [(3, 4, 5)] * 3
    first, second = result["runs"]
    for run in result["runs"]:
        assert run["outputs"] == [[6, 5], [7], [10, 9, 8]]
        assert run["tokens"] == 2 + 1 + 3 + 3  # every sentence's tokens and its </s>
    assert first["seconds"] == [31, 12, 23]  # the warm-up pass is not among them
    assert first["median"] == 2 + 20  # the batches' medians; the median pass would be 23
    assert second["seconds"] == [5, 7]
    assert second["median"] == 6


def test_turns_hold_twenty_sentences_or_one_batch() -> None:
    from bench.compare.worker import turns

    assert turns(45, 1) == [range(0, 20), range(20, 40), range(40, 45)]
    assert turns(45, 8) == [range(0, 2), range(2, 4), range(4, 6)]  # batches 0-5
    assert turns(200, 32) == [range(b, b + 1) for b in range(7)]


def test_the_engine_profiles_when_asked_and_the_profile_is_read_back(
    fr_en_bundle: Path, tmp_path: Path
) -> None:
    # The --profile section: the engine's own switch (no patching of its sessions), one file a
    # graph, read back into time inside the runs and by operator.
    options = EngineOptions(intra_op_threads=1, profile_prefix=str(tmp_path / "run"))
    translator = Translator(load_bundle(fr_en_bundle), options)
    sources = translator.tokenizer.encode(["Un homme marche dans la rue."])
    started = time.perf_counter()
    translator.translate_ids(sources, SearchOptions(beam_size=2), 1)
    profile = collect_profile(translator.engine, time.perf_counter() - started)
    written = sorted(path.name.split("_20")[0] for path in tmp_path.glob("run-*.json"))
    assert len(written) == 2 and written[0].startswith("run-decoder")
    assert written[1] == "run-encoder"
    assert 0 < profile["inside_run_s"] <= profile["wall_s"]
    assert "MatMul" in dict(profile["ops_us"])
    step = per_step(profile)
    assert step is not None and step["steps"] == profile["runs"]["decoder"] >= 2
    # The parts of a step add up to it, and none is negative.
    parts = ("matmul", "other_kernels", "runtime_own", "outside")
    assert sum(step[part] for part in parts) == pytest.approx(step["all_in"])
    assert all(step[part] >= 0 for part in parts) and step["matmul"] > 0
    plain = Translator(load_bundle(fr_en_bundle), EngineOptions(intra_op_threads=1))
    plain.translate_ids(sources, SearchOptions(), 1)
    assert len(list(tmp_path.iterdir())) == 2  # profiling is off unless asked
