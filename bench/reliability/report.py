"""docs/reliability.md: one marked section per measurement, each rewritten by its own command
(the rest of the page is kept), with the machine and the code it was measured on."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.harness import ROOT
from bench.report import replace_section

REPORT = ROOT / "docs" / "reliability.md"
HEADER = """# Reliability

Measured by `bench/reliability/` (issue 9), each section by the command it shows; every
measurement starts its own `nmt serve` on a free loopback port (the committed model, exported
once to `build/models/fr-en`) with the default settings unless the section names others.
"Nothing lost" counts every request the harness sent: each must get exactly one HTTP answer
(checked on both sides: the client's outcome and the server's access log, one line per request
id); an unanswered request is lost unless the test itself caused it (a server told to stop).
The machine has 2 cores, shared by the server and the load generator: timings are noisy and
are reported, not asserted. `make test-slow` runs the short forms
(`tests/bench/test_reliability.py`), which assert only what a correct server guarantees on any
CPU: no 5xx that is a fault, nothing lost, exit 0 after SIGTERM.
"""


def write_section(key: str, markdown: str, path: Path = REPORT) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HEADER)
    replace_section(f"reliability:{key}", markdown + "\n" + provenance(), path)


def provenance() -> str:
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = " (with uncommitted changes)" if _git("status", "--porcelain", "service") else ""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{report.machine()}, Python {platform.python_version()}"
    # Other work on the machine slows the server and the load generator alike: say how much.
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return (
        f"_Measured {when} on {machine}, at commit {commit}{dirty}; load average at the end "
        f"{load} (1, 5, 15 min)._\n"
    )


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def inline(counts: dict[str, Any]) -> str:
    return ", ".join(f"{key}: {value}" for key, value in counts.items()) or "none"


def lat(summary: dict[str, Any]) -> str:
    """p50 / p99 / max of a latency_summary, in ms."""
    if not summary.get("count"):
        return "none"
    return f"{summary['p50_ms']} / {summary['p99_ms']} / {summary['max_ms']} ms"


def lost_cell(lost: dict[str, Any]) -> str:
    excused = f" / {lost['excused']} caused by the test" if lost.get("excused") else ""
    return f"{lost['sent']} sent / {lost['answered']} answered{excused} / **{lost['lost']} lost**"


def access_log_cell(lost: dict[str, Any]) -> str:
    return f"{lost.get('access_log_missing')} / {lost.get('access_log_duplicated')}"


def table_head(columns: list[str]) -> str:
    """A markdown table's header row and rule."""
    return "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)
