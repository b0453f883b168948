"""Ours against CTranslate2 and transformers, on the same weights and the same sentences.

    nmt bench --checkpoint models/fr-en            (or: python -m bench.compare ...)

One run prepares the three forms of one checkpoint (our ONNX bundle, fp32 + int8; the Hugging
Face Marian directory from `nmt export-marian`; its CTranslate2 conversion by the stock
`ct2-transformers-converter`), then times every engine on the same pre-tokenized sentences:

* ours: fp32 and int8, with and without the KV cache (ONNX Runtime);
* CTranslate2: compute_type float32 and int8;
* transformers: `MarianMTModel.generate` (torch, fp32).

Each engine runs in its own subprocess, one after the other, so that its peak memory (the
process's resident-set high-water mark, `VmHWM`: interpreter, libraries, weights and
working memory) is its own, and no engine warms the caches of the next. Sentences are sorted by
length and cut into the same batches for every engine; each configuration is timed `--repeat`
times after a warm-up batch and the median is kept. Tokens/s counts output tokens (one per
produced token, plus one for </s>) over decoding time (encoder included, tokenization not).

It also checks that the engines translate alike (beam 4, every line of the test set, each
sentence with the same length limit: ours is `min(max_length, 1.5 * source + 10)`; the others
get it per group of sentences sharing a limit). Writes two sections of docs/benchmarks.md
("compare", "compare-parity") and docs/compare.svg. Needs the `bench` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.report import BENCHMARKS, replace_section

ROOT = Path(__file__).resolve().parent.parent
# Every configuration in the table, in order. "ours" fp32 with the cache is the reference.
ENGINES = {
    "ours fp32": {"engine": "ours", "int8": False, "cache": True},
    "ours int8": {"engine": "ours", "int8": True, "cache": True},
    "ours fp32 no cache": {"engine": "ours", "int8": False, "cache": False},
    "ours int8 no cache": {"engine": "ours", "int8": True, "cache": False},
    "ctranslate2 fp32": {"engine": "ctranslate2", "compute_type": "float32"},
    "ctranslate2 int8": {"engine": "ctranslate2", "compute_type": "int8"},
    "transformers fp32": {"engine": "transformers"},
}
REFERENCE = "ours fp32"
SEARCHES = ((1, 1), (1, 32), (4, 1), (4, 32))  # (beam, batch)
PARITY_ENGINES = ("ours fp32", "transformers fp32", "ctranslate2 fp32")
MAX_LENGTH = 256  # the engine's default cap on output tokens


# ----------------------------------------------------------------------------- preparation


def prepare(checkpoint: Path, work: Path) -> dict[str, Path]:
    """Bundle, Marian directory and CTranslate2 model of one checkpoint (kept while it does
    not change: a stamp records the checksum of the weights they came from and the bundle
    format; delete the work directory to rebuild them after other changes to the exporters)."""
    from export.marian import export_marian
    from export.onnx_export import BUNDLE_FORMAT, export_bundle, sha256_of

    work.mkdir(parents=True, exist_ok=True)
    paths = {"bundle": work / "bundle", "marian": work / "marian", "ct2": work / "ct2"}
    stamp = work / "stamp.json"
    weights = {
        "checkpoint": str(checkpoint),
        "sha256": sha256_of(checkpoint / "model.safetensors"),
        "bundle_format": BUNDLE_FORMAT,
    }
    fresh = stamp.is_file() and json.loads(stamp.read_text()) == weights
    if fresh and all(p.exists() for p in paths.values()):
        return paths
    stamp.unlink(missing_ok=True)
    print(f"preparing {work}: ONNX bundle, Marian directory, CTranslate2 model", flush=True)
    export_bundle(checkpoint, paths["bundle"], int8=True)
    export_marian(checkpoint, paths["marian"])
    converter = Path(sys.executable).with_name("ct2-transformers-converter")
    converted = subprocess.run(
        [converter, "--model", paths["marian"], "--output_dir", paths["ct2"], "--force"],
        capture_output=True,
        text=True,
    )
    if converted.returncode:
        raise SystemExit(f"ct2-transformers-converter failed:\n{converted.stderr[-2000:]}")
    stamp.write_text(json.dumps(weights) + "\n")
    return paths


def length_limit(source_length: int, max_positions: int) -> int:
    from service.runtime.search import length_limit as engine_limit

    return engine_limit(source_length, MAX_LENGTH, max_positions)


def load_sources(bundle: Path, data: Path, count: int | None) -> tuple[list[str], list[list[int]]]:
    """The first `count` lines (all when None), tokenized by the bundle's own tokenizer."""
    from service.runtime.bundle import load_bundle
    from service.runtime.tokenizer import BundleTokenizer

    lines = data.read_text(encoding="utf-8").splitlines()
    lines = lines[:count] if count else lines
    return lines, BundleTokenizer(load_bundle(bundle)).encode(lines)


def id_maps(checkpoint: Path) -> dict:
    """Our ids -> the exported Marian directory's ids (<pad> moves to the end)."""
    from export.marian import our_ids_to_marian
    from export.model.config import ModelConfig

    config = ModelConfig.from_json(checkpoint / "config.json")
    return {"to_marian": our_ids_to_marian(config), "max_positions": config.max_positions}


# ----------------------------------------------------------------------------- workers


def _status_mib(field: str) -> float | None:
    """A memory field of /proc/self/status (Linux), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _peak_rss_mib() -> float:
    """This process's resident-set high-water mark. VmHWM belongs to the address space, so it
    starts afresh at exec; ru_maxrss (the fallback off Linux) can carry the parent's peak."""
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def _chunks(count: int, size: int) -> list[list[int]]:
    return [list(range(start, min(start + size, count))) for start in range(0, count, size)]


def _by_limit(indices: list[int], limits: list[int]) -> list[list[int]]:
    """Split a batch into groups of equal length limit (for engines with one limit a call)."""
    groups: dict[int, list[int]] = {}
    for i in indices:
        groups.setdefault(limits[i], []).append(i)
    return list(groups.values())


class OursRunner:
    def __init__(self, job: dict) -> None:
        from service.runtime.bundle import load_bundle
        from service.runtime.engine import EngineOptions
        from service.runtime.translator import Translator

        spec = job["spec"]
        options = EngineOptions(
            int8=spec["int8"], use_cache=spec["cache"], intra_op_threads=job["threads"]
        )
        self.translator = Translator(load_bundle(job["paths"]["bundle"]), options)

    def translate(self, sources: list[list[int]], beam: int, limit: int) -> list[list[int]]:
        from service.runtime.search import SearchOptions

        # The engine derives each sentence's limit from its length; `limit` is the same rule.
        found = self.translator.translate_ids(sources, SearchOptions(beam_size=beam), len(sources))
        return [h[0].tokens for h in found]


class CTranslate2Runner:
    def __init__(self, job: dict) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(
            job["paths"]["ct2"],
            device="cpu",
            compute_type=job["spec"]["compute_type"],
            intra_threads=job["threads"],
            inter_threads=1,
        )
        vocab = json.loads((Path(job["paths"]["marian"]) / "vocab.json").read_text())
        piece_of = {i: piece for piece, i in vocab.items()}
        to_marian = job["maps"]["to_marian"]
        self.pieces = [piece_of[to_marian[i]] for i in range(len(to_marian))]  # by our id
        self.our_id = {piece: i for i, piece in enumerate(self.pieces)}

    def translate(self, sources: list[list[int]], beam: int, limit: int) -> list[list[int]]:
        results = self.translator.translate_batch(
            [[self.pieces[i] for i in source] for source in sources],
            beam_size=beam,
            length_penalty=1.0,
            max_decoding_length=limit,
            min_decoding_length=0,  # ours may end at once too
            # CTranslate2 stops a sentence once beam_size * patience hypotheses have finished;
            # with its default (1) it stops earlier than Hugging Face's rule, which ours follows,
            # and returns shorter translations on ~3% of test_2016_flickr. With 2 it searches as
            # far as ours and gives the same output on every line.
            patience=2.0,
        )
        return [[self.our_id[p] for p in r.hypotheses[0]] for r in results]


class TransformersRunner:
    def __init__(self, job: dict) -> None:
        import torch
        from transformers import MarianMTModel

        torch.set_num_threads(job["threads"])
        self.torch = torch
        self.model = MarianMTModel.from_pretrained(job["paths"]["marian"]).eval()
        self.to_marian = torch.tensor(job["maps"]["to_marian"])
        self.from_marian = torch.argsort(self.to_marian)
        self.pad = self.model.config.pad_token_id
        self.eos = self.model.config.eos_token_id

    def translate(self, sources: list[list[int]], beam: int, limit: int) -> list[list[int]]:
        torch = self.torch
        width = max(len(s) for s in sources)
        ids = torch.full((len(sources), width), self.pad, dtype=torch.long)
        for row, source in enumerate(sources):
            ids[row, : len(source)] = self.to_marian[torch.tensor(source)]
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=(ids != self.pad).long(),
                num_beams=beam,
                max_new_tokens=limit,
                do_sample=False,
                length_penalty=1.0,
                early_stopping=False,
                forced_eos_token_id=None,  # MarianConfig's default would force </s> at the limit
            )
        found = []
        for row in out[:, 1:].tolist():  # drop the decoder start token
            tokens = row[: row.index(self.eos)] if self.eos in row else row
            found.append([int(self.from_marian[t]) for t in tokens if t != self.pad])
        return found


RUNNERS = {"ours": OursRunner, "ctranslate2": CTranslate2Runner, "transformers": TransformersRunner}


def _profiling_session(path, options, prefix: str):
    """service.runtime.engine._session with ONNX Runtime's profiler on (same settings otherwise)."""
    import onnxruntime as ort

    from service.runtime.engine import session_options

    settings = session_options(options)
    settings.enable_profiling = True
    settings.profile_file_prefix = f"{prefix}-{Path(path).stem}"
    return ort.InferenceSession(str(path), settings, providers=["CPUExecutionProvider"])


def summarize_profile(files: list[str], wall_seconds: float) -> dict:
    """ONNX Runtime profile events -> time inside session runs, and per operator type."""
    inside_us, by_op = 0.0, {}
    for file in files:
        for event in json.loads(Path(file).read_text()):
            if event.get("cat") == "Session" and event.get("name") == "model_run":
                inside_us += event["dur"]
            elif event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
                op = event.get("args", {}).get("op_name", "?")
                by_op[op] = by_op.get(op, 0.0) + event["dur"]
    ops = sorted(by_op.items(), key=lambda item: -item[1])
    return {"wall_s": wall_seconds, "inside_run_s": inside_us / 1e6, "ops_us": ops}


def run_worker(job: dict) -> dict:
    """Load one engine and run every configuration of the job; in its own process."""
    if job.get("profile_prefix"):
        import service.runtime.engine

        prefix = job["profile_prefix"]
        service.runtime.engine._session = lambda path, options: _profiling_session(
            path, options, prefix
        )
    started = time.perf_counter()
    runner = RUNNERS[job["spec"]["engine"]](job)
    load_seconds = time.perf_counter() - started
    rss_loaded = _status_mib("VmRSS")
    sources, limits = job["sources"], job["limits"]
    ours = job["spec"]["engine"] == "ours"
    results = []
    runs_started = time.perf_counter()
    for run in job["runs"]:
        beam, batch, repeat, exact = run["beam"], run["batch"], run["repeat"], run["exact_limits"]
        calls = []  # (indices, limit) per engine call, in order
        for chunk in _chunks(len(sources), batch):
            # Ours applies each sentence's own limit; the others take one limit per call.
            groups = _by_limit(chunk, limits) if exact and not ours else [chunk]
            calls += [(group, max(limits[i] for i in group)) for group in groups]

        def translate_all(calls=calls, beam=beam) -> list[list[int]]:
            outputs: list[list[int]] = [[] for _ in sources]
            for group, limit in calls:
                found = runner.translate([sources[i] for i in group], beam, limit)
                for i, tokens in zip(group, found, strict=True):
                    outputs[i] = tokens
            return outputs

        group, limit = calls[0]
        runner.translate([sources[i] for i in group], beam, limit)  # warm-up
        seconds = []
        for _ in range(repeat):
            begin = time.perf_counter()
            outputs = translate_all()
            seconds.append(time.perf_counter() - begin)
        results.append(
            {
                **run,
                "seconds": seconds,
                "median": statistics.median(seconds),
                "tokens": sum(len(t) + 1 for t in outputs),  # + </s>
                "outputs": outputs,
            }
        )
        print(
            f"  {job['name']}: beam {beam} batch {batch}: {statistics.median(seconds):.2f} s",
            flush=True,
        )
    profile = None
    if job.get("profile_prefix"):
        engine = runner.translator.engine
        files = [engine.encoder.end_profiling(), engine.decoder.end_profiling()]
        # Warm-up included: the profiler saw it too.
        profile = summarize_profile(files, time.perf_counter() - runs_started)
    return {
        "name": job["name"],
        "profile": profile,
        "load_seconds": load_seconds,
        "rss_loaded_mib": rss_loaded,
        "peak_rss_mib": _peak_rss_mib(),
        "runs": results,
    }


def spawn(job: dict, work: Path) -> dict:
    """Run one engine's job in a fresh interpreter and read back its result."""
    slug = job["name"].replace(" ", "-")
    job_path, result_path = work / f"job-{slug}.json", work / f"result-{slug}.json"
    job_path.write_text(json.dumps(job))
    result_path.unlink(missing_ok=True)
    environment = {**os.environ, "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"}
    subprocess.run(
        [sys.executable, "-m", "bench.compare", "--worker", str(job_path), str(result_path)],
        check=True,
        cwd=ROOT,
        env=environment,
    )
    return json.loads(result_path.read_text())


# ----------------------------------------------------------------------------- parity


def parity(results: dict[str, dict], lines: list[str], decode) -> dict:
    """Each engine's beam-4 outputs against ours, line by line."""
    ours = results[REFERENCE]["runs"][0]["outputs"]
    report = {}
    for name, result in results.items():
        if name == REFERENCE:
            continue
        theirs = result["runs"][0]["outputs"]
        differences = [
            {"line": i + 1, "source": lines[i], "ours": decode(a), name: decode(b)}
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
            if a != b
        ]
        report[name] = {
            "equal": len(ours) - len(differences),
            "total": len(ours),
            "share": (len(ours) - len(differences)) / len(ours),
            "differences": differences,
        }
    return report


def _job(name: str, paths: dict, threads: int, maps: dict, sources, limits, runs) -> dict:
    """What one engine subprocess needs: its spec, the artefacts, the sentences, the runs."""
    return {
        "name": name,
        "spec": ENGINES[name],
        "paths": {k: str(v) for k, v in paths.items()},
        "threads": threads,
        "maps": maps,
        "sources": sources,
        "limits": limits,
        "runs": runs,
    }


def run_parity(
    checkpoint: Path, data: Path, work: Path, threads: int, count: int | None = None
) -> dict:
    """Beam 4 on every line (or the first `count`): ours, transformers and CTranslate2."""
    from service.runtime.bundle import load_bundle
    from service.runtime.tokenizer import BundleTokenizer

    paths = prepare(checkpoint, work)
    lines, sources = load_sources(paths["bundle"], data, count)
    maps = id_maps(checkpoint)
    # Sorted by length, so that a batch of 32 splits into few groups of equal limit.
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    sources = [sources[i] for i in order]
    limits = [length_limit(len(s), maps["max_positions"]) for s in sources]
    results = {}
    for name in PARITY_ENGINES:
        runs = [{"beam": 4, "batch": 32, "repeat": 1, "exact_limits": True}]
        result = spawn(_job(name, paths, threads, maps, sources, limits, runs), work)
        outputs = result["runs"][0]["outputs"]
        restored: list[list[int]] = [[] for _ in outputs]
        for position, index in enumerate(order):
            restored[index] = outputs[position]
        result["runs"][0]["outputs"] = restored  # back in line order
        results[name] = result
    tokenizer = BundleTokenizer(load_bundle(paths["bundle"]))
    report = parity(results, lines, tokenizer.decode)
    return {"data": str(data), "lines": len(lines), "engines": report}


def parity_markdown(result: dict, command: str, pad_norm: float | None) -> str:
    lines = [
        "## Same weights, same translations: ours vs transformers vs CTranslate2",
        "",
        f"Reproduce: `{command}`",
        "",
        f"Beam 4, length penalty 1, {result['lines']} lines of `{Path(result['data']).name}`; "
        "every engine gets each sentence's own length limit; outputs compared token for token.",
        "",
        "| engine | lines equal to ours | share |",
        "|---|---|---|",
    ]
    for name, r in result["engines"].items():
        lines.append(f"| {name} | {r['equal']} / {r['total']} | {r['share']:.2%} |")
    if pad_norm:
        lines += [
            "",
            f"Note: this checkpoint's `<pad>` embedding is not zero (norm {pad_norm:.3g}). "
            "transformers and our engine start decoding from it (the decoder start token is "
            "<pad>); CTranslate2's Marian converter starts from a zero vector (Marian's own "
            "convention), so its translations can differ. A model trained with the `<pad>` row "
            "kept at zero is translated identically by all three.",
        ]
    for name, r in result["engines"].items():
        if not r["differences"]:
            continue
        shown = r["differences"][:20]
        lines += ["", f"### Differences: {name} ({len(r['differences'])}, first {len(shown)})", ""]
        for d in shown:
            lines += [
                f"- line {d['line']}: {d['source']}",
                f"  - ours: {d['ours']}",
                f"  - {name}: {d[name]}",
            ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- report


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("onnxruntime", "ctranslate2", "transformers", "torch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found


def speed_rows(results: dict[str, dict]) -> list[dict]:
    """One row per engine: tokens/s and ratio to ours fp32 for every (beam, batch)."""
    reference = {(r["beam"], r["batch"]): r for r in results[REFERENCE]["runs"]}
    rows = []
    for name, result in results.items():
        cells = {}
        for run in result["runs"]:
            key = (run["beam"], run["batch"])
            tps = run["tokens"] / run["median"]
            base = reference[key]
            same = sum(a == b for a, b in zip(run["outputs"], base["outputs"], strict=True))
            cells[key] = {
                "tps": tps,
                "ratio": tps / (base["tokens"] / base["median"]),
                "same": same / len(run["outputs"]),
            }
        rows.append(
            {
                "name": name,
                "cells": cells,
                "peak_rss_mib": result["peak_rss_mib"],
                "rss_loaded_mib": result["rss_loaded_mib"],
                "load_seconds": result["load_seconds"],
            }
        )
    return rows


def _label(key: tuple[int, int]) -> str:
    beam, batch = key
    return f"{'greedy' if beam == 1 else f'beam {beam}'}, batch {batch}"


def targets(rows: list[dict]) -> list[str]:
    by_name = {r["name"]: r for r in rows}
    notes = []
    key = (4, 32)
    ours, ct2 = by_name.get("ours int8"), by_name.get("ctranslate2 int8")
    hf = by_name.get("transformers fp32")
    if ours and ct2 and key in ours["cells"] and key in ct2["cells"]:
        a, b = ours["cells"][key]["tps"], ct2["cells"][key]["tps"]
        verdict = "met" if a >= b else "not met"
        notes.append(
            f"- ours int8 at or above CTranslate2 int8 (beam 4, batch 32): **{verdict}** "
            f"({a:.0f} vs {b:.0f} tokens/s, {a / b:.2f}x)"
        )
    if ours and hf and key in ours["cells"] and key in hf["cells"]:
        a, b = ours["cells"][key]["tps"], hf["cells"][key]["tps"]
        verdict = "met" if a >= 5 * b else "not met"
        notes.append(
            f"- ours int8 at least 5x transformers generate (beam 4, batch 32): **{verdict}** "
            f"({a / b:.1f}x)"
        )
    return notes


def speed_markdown(rows: list[dict], setup: dict, command: str, svg_name: str) -> str:
    keys = [k for k in SEARCHES if k in rows[0]["cells"]]
    versions = ", ".join(f"{k} {v}" for k, v in setup["versions"].items())
    lines = [
        "## Same weights: ours vs CTranslate2 vs transformers, "
        f"{setup['threads'] or 'all cores as'} thread(s) per engine",
        "",
        f"Reproduce: `{command}`",
        "",
        f"{setup['sentences']} lines of `{setup['data']}` (mean {setup['mean_source']:.1f} "
        f"source tokens), {setup['threads']} thread(s) for every engine, median of "
        f"{setup['repeat']} runs, {setup['cpu']}; {versions}. Same weights: the checkpoint "
        f"`{setup['checkpoint']}` as our ONNX bundle, as a Hugging Face Marian directory "
        "(`nmt export-marian`) and as its CTranslate2 conversion (`ct2-transformers-converter`). "
        "Sentences are sorted by length and cut into the same batches for every engine. "
        "Tokens/s = output tokens (</s> included) / decoding time (encoder included, "
        "tokenization not); in brackets, the ratio to ours fp32 with the KV cache.",
        "",
        "| engine | " + " | ".join(_label(k) for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for row in rows:
        cells = [f"{row['cells'][k]['tps']:.0f} ({row['cells'][k]['ratio']:.2f}x)" for k in keys]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"![tokens per second by engine]({svg_name})",
        "",
        "Peak memory: each engine runs in its own process; peak RSS is that process's "
        "resident-set high-water mark (`VmHWM`) over loading and every configuration "
        "above (interpreter and libraries included: transformers brings torch). "
        "'Same output' is the share of sentences whose tokens equal ours fp32's in the same "
        "configuration (beam 4, batch 32): int8 engines differ by quantization; the others get "
        "one length limit per call (the largest of its batch), so sentences that reach their "
        "limit can differ (the parity section gives every sentence its own limit).",
        "",
        "| engine | peak RSS (MiB) | RSS after loading (MiB) | load (s) | same output |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        same = row["cells"].get((4, 32), {}).get("same")
        loaded = row["rss_loaded_mib"]
        lines.append(
            f"| {row['name']} | {row['peak_rss_mib']:.0f} | "
            f"{'?' if loaded is None else f'{loaded:.0f}'} | {row['load_seconds']:.1f} | "
            f"{'' if same is None else f'{same:.1%}'} |"
        )
    notes = targets(rows)
    if notes:
        lines += ["", "Targets (issue 5):", "", *notes]
    return "\n".join(lines)


def profile_markdown(profile: dict) -> str:
    wall, inside = profile["wall_s"], profile["inside_run_s"]
    lines = [
        "### Where the time goes: ours int8, beam 4, batch 32 (ONNX Runtime profiler)",
        "",
        f"Decoding took {wall:.2f} s (warm-up and one profiled run), of which {inside:.2f} s "
        f"({inside / wall:.0%}) inside ONNX Runtime session runs; the rest is Python and "
        "numpy around them (beam bookkeeping, cache reordering, feeding inputs). Inside the "
        "runs, by operator type:",
        "",
        "| operator | seconds | share of session time |",
        "|---|---|---|",
    ]
    for op, microseconds in profile["ops_us"][:12]:
        seconds = microseconds / 1e6
        lines.append(f"| {op} | {seconds:.3f} | {seconds / inside:.0%} |")
    return "\n".join(lines)


def svg_chart(rows: list[dict], title: str) -> str:
    """A grouped horizontal bar chart of tokens/s, written by hand (no plotting library)."""
    keys = [k for k in SEARCHES if k in rows[0]["cells"]]
    colours = ["#1f77b4", "#6baed6", "#9ecae1", "#c6dbef", "#d62728", "#ff9896", "#2ca02c"]
    bar, gap, left, width = 14, 18, 250, 460
    label_width = left - 10
    height_per_group = bar * len(rows) + gap
    height = 50 + height_per_group * len(keys) + 20
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 120}" '
        f'height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{title}</text>',
    ]
    y = 40
    for key in keys:
        top = max(r["cells"][key]["tps"] for r in rows) or 1.0
        parts.append(f'<text x="10" y="{y + 10}" font-weight="bold">{_label(key)}</text>')
        y += 14
        for index, row in enumerate(rows):
            value = row["cells"][key]["tps"]
            length = max(1.0, width * value / top)
            colour = colours[index % len(colours)]
            parts += [
                f'<text x="{label_width}" y="{y + bar - 3}" text-anchor="end">{row["name"]}</text>',
                f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar - 2}" '
                f'fill="{colour}"/>',
                f'<text x="{left + length + 4:.1f}" y="{y + bar - 3}">{value:.0f} tok/s</text>',
            ]
            y += bar
        y += gap - 14
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", type=Path, default=Path("models/fr-en"))
    parser.add_argument(
        "--data", type=Path, default=None, help="source sentences (default: test_2016_flickr.fr)"
    )
    parser.add_argument("--sentences", type=int, default=200, help="lines timed (first N)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per configuration")
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
        action="store_true",
        help="also profile ours int8 at beam 4, batch 32 (ONNX Runtime profiler): where the "
        "time goes",
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
    command = (
        f"nmt bench --checkpoint {args.checkpoint} --sentences {args.sentences} "
        f"--repeat {args.repeat} --threads {args.threads}"
    )
    if args.engines != ",".join(ENGINES):
        command += f" --engines '{args.engines}'"
    if args.parity_lines:
        command += f" --parity-lines {args.parity_lines}"
    if args.section != "compare":
        command += f" --section {args.section}"
    if args.profile:
        command += " --profile"
    return command


def run_from_args(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ENGINES))
    if unknown:
        raise SystemExit(f"unknown engines {unknown}; choose among {list(ENGINES)}")
    if REFERENCE not in names:
        names.insert(0, REFERENCE)  # ratios need the reference
    threads = args.threads or os.cpu_count() or 1
    data = args.data or _default_data()
    work = args.work_dir
    paths = prepare(args.checkpoint, work)
    maps = id_maps(args.checkpoint)
    _, sources = load_sources(paths["bundle"], data, args.sentences)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    sources = [sources[i] for i in order]
    limits = [length_limit(len(s), maps["max_positions"]) for s in sources]
    runs = [
        {"beam": beam, "batch": batch, "repeat": args.repeat, "exact_limits": False}
        for beam, batch in SEARCHES
    ]
    results = {}
    for name in [REFERENCE, *[n for n in names if n != REFERENCE]]:
        print(f"{name}:", flush=True)
        results[name] = spawn(_job(name, paths, threads, maps, sources, limits, runs), work)
    rows = speed_rows(results)
    profile = None
    if args.profile:
        print("profiling ours int8, beam 4, batch 32:", flush=True)
        job = {
            "name": "ours int8 profiled",
            "spec": ENGINES["ours int8"],
            "paths": {k: str(v) for k, v in paths.items()},
            "threads": threads,
            "maps": maps,
            "sources": sources,
            "limits": limits,
            "runs": [{"beam": 4, "batch": 32, "repeat": 1, "exact_limits": False}],
            "profile_prefix": str((work / "ort-profile").resolve()),
        }
        profile = spawn(job, work)["profile"]
    setup = {
        "sentences": len(sources),
        "data": data.name,
        "mean_source": sum(len(s) for s in sources) / len(sources),
        "threads": threads,
        "repeat": args.repeat,
        "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "versions": _versions(),
        "checkpoint": str(args.checkpoint),
    }
    svg_path = args.out.parent / f"{args.section}.svg"
    svg_path.parent.mkdir(parents=True, exist_ok=True)
    svg_path.write_text(svg_chart(rows, f"Tokens/s on {len(sources)} sentences, same weights"))
    command = _command(args)
    markdown = speed_markdown(rows, setup, command, svg_path.name)
    if profile:
        markdown += "\n\n" + profile_markdown(profile)
    replace_section(args.section, markdown, args.out)
    summary = {
        r["name"]: {_label(k): round(c["tps"], 1) for k, c in r["cells"].items()} for r in rows
    }

    if args.parity_lines >= 0:
        count = args.parity_lines or None
        result = run_parity(args.checkpoint, data, work, threads, count)
        pad_norm = _pad_norm(args.checkpoint)
        replace_section("compare-parity", parity_markdown(result, command, pad_norm), args.out)
        summary["parity"] = {n: f"{r['equal']}/{r['total']}" for n, r in result["engines"].items()}
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out} and {svg_path}")
    return 0


def _pad_norm(checkpoint: Path) -> float:
    from safetensors import safe_open

    from export.model.config import ModelConfig

    config = ModelConfig.from_json(checkpoint / "config.json")
    with safe_open(str(checkpoint / "model.safetensors"), "np") as weights:
        row = weights.get_slice("embed_tokens.weight")[config.pad_id]
    return float((row.astype("float64") ** 2).sum() ** 0.5)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        job_path, result_path = Path(argv[1]), Path(argv[2])
        result = run_worker(json.loads(job_path.read_text()))
        result_path.write_text(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
