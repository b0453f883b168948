"""`python -m bench.reliability SUBCOMMAND`: run one measurement (or all), print its result as
JSON and write its section of docs/reliability.md.

    .venv/bin/python -m bench.reliability schemathesis --max-time 300
    .venv/bin/python -m bench.reliability hostile --examples 2000
    .venv/bin/python -m bench.reliability overload --seconds 60
    .venv/bin/python -m bench.reliability sigterm
    .venv/bin/python -m bench.reliability soak --minutes 10
    .venv/bin/python -m bench.reliability setups --seconds 25   # threads and spinning compared
    .venv/bin/python -m bench.reliability markup-stall --before-tree /tmp/before  # /healthz
    .venv/bin/python -m bench.reliability amplification --before-tree /tmp/before  # alignment
    .venv/bin/python -m bench.reliability body-stall --before-tree /tmp/before  # 1 MB, 12 MB
    .venv/bin/python -m bench.reliability deadlines --before-tree /tmp/before  # goodput, 1 s/5 s
    .venv/bin/python -m bench.reliability connections --before-tree /tmp/before  # idle, slow
    .venv/bin/python -m bench.reliability all --short   # the CI form, a few minutes
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness import BUNDLES, ROOT, ensure_bundle
from bench.reliability import (
    body_stall,
    connection_attacks,
    deadlines,
    fuzz,
    hostile,
    loop_stall,
    overload,
    setups,
    sigterm,
    soak,
)
from bench.reliability.report import write_section
from bench.reliability.short import SHORT, markdown_short

Runner = Callable[[Path, Path, argparse.Namespace], dict[str, Any]]

MARKDOWN: dict[str, Callable[[dict[str, Any]], str]] = {
    "schemathesis": fuzz.markdown,
    "hostile": hostile.markdown,
    "overload": overload.markdown,
    "sigterm": sigterm.markdown,
    "soak": soak.markdown,
    "setups": setups.markdown,
    **loop_stall.MARKDOWN,
    **body_stall.MARKDOWN,
    "deadlines": deadlines.markdown,
    "connections": connection_attacks.markdown,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reliability",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        help="bundles to serve (default: build/models, exported from models/fr-en if missing)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="server logs and reports (default: build/reliability/<subcommand>-<time>)",
    )
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/reliability.md")
    commands = parser.add_subparsers(dest="command", required=True)
    fuzzing = commands.add_parser("schemathesis", help="schemathesis over the OpenAPI document")
    fuzzing.add_argument("--max-examples", type=int, default=400, help="per operation and phase")
    fuzzing.add_argument("--seed", type=int, default=1)
    fuzzing.add_argument("--max-time", type=int, default=300, help="seconds; 0: one cycle")
    attack = commands.add_parser("hostile", help="hypothesis-generated hostile texts")
    attack.add_argument("--examples", type=int, default=2000, help="each sent to both dialects")
    attack.add_argument("--seed", type=int, default=9)
    load = commands.add_parser("overload", help="open loop at a multiple of measured capacity")
    load.add_argument("--seconds", type=float, default=60.0)
    load.add_argument("--capacity-seconds", type=float, default=15.0)
    load.add_argument("--factor", type=float, default=4.0)
    load.add_argument("--queue-sentences", type=int, default=64)
    load.add_argument("--deadline", type=float, default=10.0, help="NMT_REQUEST_TIMEOUT_SECONDS")
    commands.add_parser("sigterm", help="SIGTERM under load, within and past the timeout")
    steady = commands.add_parser("soak", help="steady mixed traffic, RSS, fds and p99")
    steady.add_argument("--minutes", type=float, default=10.0)
    steady.add_argument("--warmup-seconds", type=float, default=60.0)
    steady.add_argument("--window-seconds", type=float, default=60.0)
    compared = commands.add_parser("setups", help="overload against servers set up differently")
    compared.add_argument("--seconds", type=float, default=25.0)
    loop_stall.add_commands(commands)
    body_stall.add_commands(commands)
    late = commands.add_parser("deadlines", help="goodput under 1 s and 5 s deadlines, compared")
    late.add_argument("--before-tree", type=Path, required=True, help="checkout to compare with")
    late.add_argument("--seconds", type=float, default=30.0)
    attacks = commands.add_parser("connections", help="idle, slow-body, big-header attacks")
    attacks.add_argument("--before-tree", type=Path, required=True, help="checkout to compare")
    everything = commands.add_parser("all", help="every measurement in turn")
    everything.add_argument("--short", action="store_true", help="the CI form (a few minutes)")
    return parser


RUNNERS: dict[str, Runner] = {
    "schemathesis": lambda m, w, a: fuzz.run_schemathesis(
        m, w, a.max_examples, a.seed, max_time=a.max_time or None
    ),
    "hostile": lambda m, w, a: hostile.run_hostile(m, w, a.examples, a.seed),
    "overload": lambda m, w, a: overload.run_overload(
        m, w, a.seconds, a.capacity_seconds, a.factor, a.queue_sentences, a.deadline
    ),
    "sigterm": lambda m, w, a: sigterm.run_sigterm(m, w),
    "soak": lambda m, w, a: soak.run_soak(m, w, a.minutes * 60, a.warmup_seconds, a.window_seconds),
    "setups": lambda m, w, a: setups.run_setups(m, w, a.seconds),
}
# Measurements that compare this checkout with another (their sections show both): not part
# of `all`, which would write them with one column.
COMPARED: dict[str, Runner] = {
    **loop_stall.RUNNERS,
    **body_stall.RUNNERS,
    "deadlines": lambda m, w, a: deadlines.run_deadlines(m, w, a.before_tree, a.seconds),
    "connections": lambda m, w, a: connection_attacks.run_compared(m, w, a.before_tree),
}


def _all(model_dir: Path, work_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    defaults = {name: _parser().parse_args([name]) for name in RUNNERS}
    if args.short:
        return {name: run(model_dir, work_dir / name) for name, run in SHORT.items()}
    return {name: run(model_dir, work_dir / name, defaults[name]) for name, run in RUNNERS.items()}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    model_dir = args.model_dir or ensure_bundle(BUNDLES)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    work_dir = args.work_dir or ROOT / "build" / "reliability" / f"{args.command}-{stamp}"
    if args.command == "all":
        results = _all(model_dir, work_dir, args)
    else:
        results = (RUNNERS | COMPARED)[args.command](model_dir, work_dir, args)
    # The measurement first, so that a report that fails to format loses no run.
    print(json.dumps(results, indent=1, default=str), flush=True)
    if args.command != "all":
        sections = {args.command: MARKDOWN[args.command](results)}
    elif args.short:
        sections = {"short": markdown_short(results)}
    else:
        sections = {name: MARKDOWN[name](result) for name, result in results.items()}
    if not args.no_docs:
        for key, markdown in sections.items():
            write_section(key, markdown)
    print(f"server logs and reports: {work_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
