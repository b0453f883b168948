"""The load test (loadtest/): its sample text, its mix, its report, and that `make loadtest`'s
runner fails when a request fails. Locust itself only ever runs as a subprocess: its gevent
monkey-patching must not enter the test process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest import run
from loadtest.mix import DEFAULT_MIX, SCENARIOS, parse_mix
from loadtest.samples import PARAGRAPHS, SHORT_SENTENCES, batch_of_texts
from tests.conftest import ROOT

LOCUST = ROOT / ".venv" / "bin" / "locust"


def test_nothing_here_imports_locust_or_gevent() -> None:
    assert "locust" not in sys.modules
    assert "gevent" not in sys.modules


def split_sentences(paragraph: str) -> list[str]:
    return re.findall(r"[^.!?]+[.!?]", paragraph)


def test_samples_have_several_lengths_and_styles() -> None:
    words = [len(sentence.split()) for sentence in SHORT_SENTENCES]
    assert len(SHORT_SENTENCES) >= 20 and min(words) <= 5 and max(words) >= 9
    assert any(sentence.endswith("?") for sentence in SHORT_SENTENCES)  # questions too
    assert len(set(SHORT_SENTENCES)) == len(SHORT_SENTENCES)
    for paragraph in PARAGRAPHS:
        assert len(split_sentences(paragraph)) >= 3, paragraph
    assert batch_of_texts(len(SHORT_SENTENCES) - 1, 3) == [
        SHORT_SENTENCES[-1],
        SHORT_SENTENCES[0],
        SHORT_SENTENCES[1],
    ]


def test_samples_are_not_corpus_lines(multi30k: Path) -> None:
    def normal(text: str) -> str:
        return " ".join(text.lower().split())

    corpus = {
        normal(line) for path in multi30k.glob("*.fr") for line in path.read_text().splitlines()
    }
    ours = list(SHORT_SENTENCES) + [s for p in PARAGRAPHS for s in split_sentences(p)]
    copied = [sentence for sentence in ours if normal(sentence) in corpus]
    assert not copied


def test_mix_parsing() -> None:
    assert parse_mix(DEFAULT_MIX) == {"short": 6, "paragraph": 2, "list": 1, "libre": 1}
    assert set(parse_mix(DEFAULT_MIX)) == set(SCENARIOS)
    assert parse_mix(" list=1 ,") == {"list": 1}
    for bad in ("short=0", "", "poem=1", "short=many"):
        with pytest.raises(ValueError):
            parse_mix(bad)


def locust_entry(name: str, times: dict[str, int], failures: int = 0) -> dict[str, object]:
    """An entry as Locust's --json-file writes it (the fields the summary reads)."""
    return {
        "name": name,
        "method": "POST",
        "num_requests": sum(times.values()),
        "num_failures": failures,
        "response_times": times,
        "start_time": 100.0,
        "last_request_timestamp": 110.0,
    }


def test_summary_from_locust_stats(tmp_path: Path) -> None:
    entries = [
        locust_entry("/v1/translate short", {"10": 90, "20": 8, "300": 2}),
        locust_entry("/translate", {"50": 100}, failures=3),
    ]
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(entries))
    summary = run.read_summary(stats)
    assert (summary.requests, summary.failures) == (200, 3)
    assert summary.requests_per_second == pytest.approx(20.0)
    # Merged: 90 x 10 ms, 8 x 20 ms, 100 x 50 ms, 2 x 300 ms.
    assert (summary.p50_ms, summary.p95_ms, summary.p99_ms) == (50, 50, 300)
    short = next(row for row in summary.by_name if "short" in str(row["name"]))
    assert (short["p50_ms"], short["p95_ms"], short["p99_ms"]) == (10, 20, 300)


def test_summary_section_replaces_itself_in_the_docs(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\n<!-- other:start -->\nkept\n<!-- other:end -->\n")
    run.write_docs_section(page, "## Load test\nfirst\n")
    run.write_docs_section(page, "## Load test\nsecond\n")
    text = page.read_text()
    assert text.count(run.DOCS_START) == 1 and "second" in text and "first" not in text
    assert "kept" in text


def test_reports_never_show_secrets() -> None:
    assert run.shown("NMT_API_KEYS=k1,k2") == "NMT_API_KEYS=***"
    assert run.shown("NMT_MAX_TEXTS_PER_REQUEST=4") == "NMT_MAX_TEXTS_PER_REQUEST=4"


@pytest.mark.slow
def test_runner_fails_when_requests_fail(tmp_path: Path, committed_model: Path) -> None:
    if not LOCUST.exists():
        pytest.skip("Locust not installed in .venv (make .venv/.loadtest-installed)")
    models = tmp_path / "models"
    subprocess.run(
        [ROOT / ".venv" / "bin" / "nmt", "export", "--checkpoint", committed_model,
         "--out", models / "fr-en"],
        check=True, capture_output=True,
    )  # fmt: skip
    # The list scenario sends 8 texts; a server that takes 4 answers 422 to every one.
    result = subprocess.run(
        [sys.executable, ROOT / "loadtest" / "run.py", "--model-dir", models,
         "--out", tmp_path / "reports", "--users", "2", "--spawn-rate", "2",
         "--run-time", "4s", "--mix", "list=1",
         "--server-env", "NMT_MAX_TEXTS_PER_REQUEST=4"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "request(s) failed" in result.stderr
    summary = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert summary["requests"] > 0 and summary["failures"] == summary["requests"]
    assert (tmp_path / "reports" / "report.html").is_file()
