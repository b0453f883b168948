"""`python -m bench.compare`: the options, the run from preparation to the written pages."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.compare.parity import parity_markdown, run_parity
from bench.compare.plot import svg_chart
from bench.compare.prepare import before_jobs, by_length, id_maps, load_sources, pad_norm, prepare
from bench.compare.profiling import profile_markdown
from bench.compare.report import label, speed_markdown, speed_rows, versions
from bench.compare.runners import ENGINES, REFERENCE, SEARCHES, needs_hf
from bench.compare.worker import make_job, run_turns, run_worker, spawn, spawn_interleaved
from bench.report import BENCHMARKS, machine, replace_section


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, default=Path("models/fr-en"))
    parser.add_argument(
        "--data", type=Path, default=None, help="source sentences (default: test_2016_flickr.fr)"
    )
    parser.add_argument("--sentences", type=int, default=200, help="lines timed (first N)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed passes (each stretch's median counts)"
    )
    parser.add_argument("--threads", type=int, default=0, help="per engine (0 = all cores)")
    parser.add_argument(
        "--engines", default=",".join(ENGINES), help=f"comma-separated subset of {list(ENGINES)}"
    )
    parser.add_argument("--work-dir", type=Path, default=Path("build/compare"))
    parser.add_argument("--out", type=Path, default=BENCHMARKS, help="markdown page to update")
    parser.add_argument(
        "--section",
        default="compare",
        help="section of the page for the speed table (e.g. compare-2-threads for a second "
        "thread setting; the chart is then compare-2-threads.svg)",
    )
    parser.add_argument(
        "--profile",
        nargs="*",
        metavar="BEAMxBATCH",
        help="also profile ours int8 in these cells, each in a process of its own (ONNX "
        "Runtime profiler): where the time goes, per operator and per decoder step; given "
        "alone: 4x32 (e.g. --profile 1x1 4x32)",
    )
    parser.add_argument(
        "--before-tree",
        type=Path,
        help="also time ours fp32 and int8 from another checkout (e.g. `git worktree add "
        "/tmp/before HEAD~3`), side by side in the same turns: its own exporter makes its "
        "bundle, its own `bench.compare` worker runs it (rows 'ours ... (before)')",
    )
    parser.add_argument(
        "--parity-lines",
        type=int,
        default=0,
        help="lines for the translation check (0 = the whole test set, -1 = skip it)",
    )


def _default_data() -> Path:
    from export.train_config import multi30k_dir

    return multi30k_dir() / "test_2016_flickr.fr"


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, as the report quotes it."""
    command = (
        f"python -m bench.compare --checkpoint {args.checkpoint} --sentences {args.sentences} "
        f"--repeat {args.repeat} --threads {args.threads}"
    )
    if args.engines != ",".join(ENGINES):
        command += f" --engines '{args.engines}'"
    if args.parity_lines:
        command += f" --parity-lines {args.parity_lines}"
    if args.section != "compare":
        command += f" --section {args.section}"
    if args.profile is not None:
        command += " --profile " + " ".join(args.profile or ["4x32"])
    if args.before_tree:
        command += f" --before-tree {args.before_tree}"
    return command


def _engine_names(engines: str) -> list[str]:
    """The engines asked for, the reference first (ratios need it)."""
    names = [n.strip() for n in engines.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ENGINES))
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; choose among {list(ENGINES)}")
    return [REFERENCE, *[n for n in names if n != REFERENCE]]


def _setup(args: argparse.Namespace, data: Path, sources: list[list[int]], threads: int) -> dict:
    """What the report says about the run: sentences, threads, machine, library versions."""
    return {
        "sentences": len(sources),
        "data": data.name,
        "mean_source": sum(len(s) for s in sources) / len(sources),
        "threads": threads,
        "repeat": args.repeat,
        "cpu": machine(),
        "versions": versions(),
        "checkpoint": str(args.checkpoint),
    }


def run_from_args(args: argparse.Namespace) -> int:
    names = _engine_names(args.engines)
    threads = args.threads or os.cpu_count() or 1
    data = args.data or _default_data()
    work = args.work_dir
    paths = prepare(args.checkpoint, work)
    if "hf" not in paths and (unheld := [n for n in names if needs_hf(n)]):
        raise SystemExit(
            f"{args.checkpoint} has no Hugging Face form (Marian's or M2M-100's layout): "
            f"no {', '.join(unheld)}"
        )
    maps = id_maps(args.checkpoint)
    _, sources = load_sources(paths["bundle"], data, args.sentences)
    _, sources, limits = by_length(sources, maps["max_positions"])

    def job(name: str, runs: list[dict], **extra: str) -> dict:
        return make_job(name, paths, threads, maps, sources, limits, runs, **extra)

    runs = [
        {"beam": beam, "batch": batch, "repeat": args.repeat, "exact_limits": False}
        for beam, batch in SEARCHES
    ]
    jobs = [job(name, runs) for name in names]
    if args.before_tree:
        jobs += before_jobs(args.before_tree, args.checkpoint, work, jobs[0])
    listed = ", ".join(j["name"] for j in jobs)
    print(f"{listed}: loaded at once, taking turns on each stretch", flush=True)
    results = spawn_interleaved(jobs, work)
    rows = speed_rows(results)
    profiles = []
    for cell in [] if args.profile is None else args.profile or ["4x32"]:
        beam, batch = (int(n) for n in cell.lower().split("x"))
        print(f"profiling ours int8, beam {beam}, batch {batch}:", flush=True)
        one_run = [{"beam": beam, "batch": batch, "repeat": 1, "exact_limits": False}]
        prefix = str((work / f"ort-profile-{beam}x{batch}").resolve())
        # Its own name, so that its job and result files do not overwrite the timed ones.
        profiled = job("ours int8", one_run, profile_prefix=prefix) | {
            "name": f"ours int8 profiled {beam}x{batch}"
        }
        result = spawn(profiled, work)
        profiles.append((beam, batch, result["profile"], result["runs"][0]))
    setup = _setup(args, data, sources, threads)
    svg_path = args.out.parent / f"{args.section}.svg"
    svg_path.parent.mkdir(parents=True, exist_ok=True)
    svg_path.write_text(svg_chart(rows, f"Tokens/s on {len(sources)} sentences, same weights"))
    command = _command(args)
    markdown = speed_markdown(rows, setup, command, svg_path.name)
    timed = {r["name"]: r["cells"] for r in rows}.get("ours int8", {})
    for beam, batch, profile, profiled_run in profiles:
        tps = timed.get((beam, batch), {}).get("tps")  # the same pass, unprofiled
        slowdown = profiled_run["median"] * tps / profiled_run["tokens"] if tps else None
        markdown += "\n\n" + profile_markdown(profile, beam, batch, slowdown)
    replace_section(args.section, markdown, args.out)
    summary = {
        r["name"]: {label(k): round(c["tps"], 1) for k, c in r["cells"].items()} for r in rows
    }

    if args.parity_lines >= 0:
        count = args.parity_lines or None
        result = run_parity(args.checkpoint, data, work, threads, count)
        note = pad_norm(args.checkpoint)
        replace_section("compare-parity", parity_markdown(result, command, note), args.out)
        summary["parity"] = {n: f"{r['equal']}/{r['total']}" for n, r in result["engines"].items()}
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out} and {svg_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # one engine's process, started by worker.spawn
        job_path, result_path = Path(argv[1]), Path(argv[2])
        result = run_worker(json.loads(job_path.read_text()))
        result_path.write_text(json.dumps(result))
        return 0
    if argv[:1] == ["--turns"]:  # one engine's process, driven by worker.spawn_interleaved
        job_path, result_path = Path(argv[1]), Path(argv[2])
        # Answers go to the parent over the original stdout; anything an engine prints (from
        # Python or from C) goes to stderr instead, so that it cannot garble them.
        answers = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

        def answer(word: str) -> None:
            answers.write(word + "\n")
            answers.flush()

        result = run_turns(json.loads(job_path.read_text()), sys.stdin, answer)
        result_path.write_text(json.dumps(result))
        return 0
    from bench.compare import __doc__ as description

    parser = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))
