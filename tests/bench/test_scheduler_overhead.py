"""bench/scheduler_overhead.py runs end to end on the committed model and writes its section
(a benchmark: its numbers are not checked, only that every measure was taken and reported);
its observer keeps the loop's step times and passes every report on to the metrics."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scheduler_overhead import StepTimes
from service.serving.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]


def test_both_searches_are_measured_and_written_between_the_markers(
    fr_en_bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "benchmarks.md"
    out.write_text("# Before\n\n<!-- scheduler-overhead:start -->\nold\n")
    out.write_text(out.read_text() + "<!-- scheduler-overhead:end -->\n\n# After\n")
    command = [sys.executable, "-m", "bench.scheduler_overhead", "--count", "6"]
    command += ["--model-dir", str(fr_en_bundle.parent), "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, timeout=300, capture_output=True)
    text = out.read_text()
    assert text.startswith("# Before") and text.rstrip().endswith("# After")
    assert "old" not in text
    number = r"([0-9.]+)"
    rows = re.findall(
        rf"^\| (greedy|beam 4) \| {number} / {number} \| {number} / {number} \|$", text, re.M
    )
    assert [row[0] for row in rows] == ["greedy", "beam 4"]
    for _, *values in rows:
        assert all(float(value) > 0 for value in values)


def test_the_observer_keeps_step_times_and_passes_every_report_on() -> None:
    metrics = Metrics()
    kept = StepTimes(metrics)
    kept.observe_step(("fr-en", "1"), sentences=2, rows=2, output_tokens=3, seconds=0.25)
    kept.observe_left(("fr-en", "1"), "finished", 2)  # not StepTimes' own: the metrics' method
    assert kept.seconds == [0.25]
    metrics.flush_steps()
    text = metrics.render().decode()
    assert 'nmt_decode_steps_total{model="fr-en",version="1"} 1.0' in text
    assert 'nmt_batch_left_sentences_total{model="fr-en",reason="finished",version="1"} 2.0' in text

    alone = StepTimes(None)
    alone.observe_step(("fr-en", "1"), sentences=1, rows=1, output_tokens=0, seconds=0.5)
    alone.observe_left(("fr-en", "1"), "finished", 1)  # dropped: no metrics behind it
    assert alone.seconds == [0.5]
    with pytest.raises(AttributeError):
        alone.__deepcopy__  # noqa: B018 (private names are not reports)
