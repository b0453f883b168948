"""The short forms of the reliability harness (bench/reliability/, issue 9), each against its
own `nmt serve` process: what a correct server guarantees on any CPU. No 5xx that is a fault
(503 while shutting down and 504 past a deadline are answers the server means to give), every
request sent gets exactly one answer, SIGTERM exits 0 with every admitted request answered.

Latencies, capacity and memory are reported by `python -m bench.reliability`, never asserted:
they depend on the machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.reliability import sigterm
from bench.reliability.hostile import ODD_NUMBERS, hostile_bodies, json_escaped
from bench.reliability.short import SHORT
from bench.reliability.traffic import Outcome, nothing_lost

# Fast: the harness's own bookkeeping.


def test_nothing_lost_counts_unanswered_requests_unless_the_test_caused_them():
    outcomes = [
        Outcome("native", "a", 0.0, 0.1, 200),
        Outcome("native", "b", 0.0, 0.1, 503),
        Outcome("native", "c", 0.0, 0.1, None, "ReadError"),
        Outcome("native", "d", 0.0, 0.1, None, "ConnectError"),
    ]
    counts = nothing_lost(outcomes, excused=lambda o: o.error == "ConnectError")
    assert (counts["sent"], counts["answered"], counts["excused"], counts["lost"]) == (4, 2, 1, 1)
    assert counts["lost_errors"] == {"ReadError": 1}


def test_hostile_bodies_carry_what_a_json_encoder_would_refuse():
    case = hostile_bodies("k", "k", json_escaped("a\ud800b"), native_extra=', "beam_size": 1e999')
    native, _ = case.native
    assert b'"a\\ud800b"' in native  # the escape itself, not UTF-8 (which cannot encode it)
    assert b'"beam_size": 1e999' in native
    assert "1" + "0" * 5000 in ODD_NUMBERS


# Slow: a real server each.


@pytest.fixture(scope="module")
def model_dir(fr_en_bundle: Path) -> Path:
    return fr_en_bundle.parent


def assert_nothing_lost(result: dict[str, Any]) -> None:
    lost = result["nothing_lost"]
    assert lost["lost"] == 0, lost
    assert lost["sent"] > 0
    # the server's side: one access log line per answered request, never two
    assert lost.get("access_log_missing", 0) == 0, lost
    assert lost.get("access_log_duplicated", 0) == 0, lost


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_nonconforming_answer(
    model_dir: Path, tmp_path: Path
):
    result = SHORT["schemathesis"](model_dir, tmp_path)
    assert result["requests"] >= 250, result["operations"]
    assert set(result["operations"]) >= {"POST /v1/translate", "POST /translate"}
    assert result["server_errors"] == 0, result["failure_examples"]
    assert result["failed_server_error_checks"] == 0, result["failure_examples"]
    assert result["failed_conformance_checks"] == 0, result["failure_examples"]
    assert_nothing_lost(result)


@pytest.mark.slow
def test_hostile_input_gets_no_5xx_and_every_request_an_answer(model_dir: Path, tmp_path: Path):
    result = SHORT["hostile"](model_dir, tmp_path)
    assert result["requests"] >= 250
    assert result["5xx"] == 0, result["failures"]
    assert result["healthz"]["failed"] == 0, result["healthz"]
    assert_nothing_lost(result)


@pytest.mark.slow
def test_overload_is_refused_or_served_never_failed_or_lost(model_dir: Path, tmp_path: Path):
    result = SHORT["overload"](model_dir, tmp_path)
    assert result["unexpected_5xx"] == 0, result["unexpected"]
    assert result["healthz"]["failed"] == 0, result["healthz"]
    assert_nothing_lost(result)


@pytest.mark.slow
@pytest.mark.parametrize("run", list(sigterm.RUNS))
def test_sigterm_under_load_exits_0_with_every_admitted_request_answered(
    model_dir: Path, tmp_path: Path, run: str
):
    result = sigterm.sigterm_run(model_dir, tmp_path, run)
    assert result["exit_code"] == 0, result["shutdown_log"]
    assert result["admitted"] > 0
    assert result["unexpected_5xx"] == 0, result["unexpected_5xx_details"]
    # refused connections after the signal are the test's doing; an admitted request without
    # an answer is the server's
    assert_nothing_lost(result)


@pytest.mark.slow
def test_soak_keeps_answering(model_dir: Path, tmp_path: Path):
    result = SHORT["soak"](model_dir, tmp_path)
    assert result["5xx"] == 0, result["server_error_log"]
    assert_nothing_lost(result)
