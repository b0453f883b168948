"""Checkpoints side by side: quality, size and speed, in one run (issue 38's old-and-new table).

    python -m bench.models models/fr-en build/students/s6x1-distilled

For each checkpoint (a `nmt train --out` directory):
* quality: `nmt eval` (the torch model, as docs/quality.md) on val, test_2016_flickr and
  test_2017_flickr, greedy and beam 4, BLEU and chrF (`bench.quality.evaluate`);
* size: its shape, parameters (shared embeddings once), the checkpoint's bytes and its int8
  bundle's (the encoder and decoder graphs served);
* speed: its int8 bundle (`nmt export --int8`, into --work-dir), one thread, greedy and beam 4,
  batch 1 and 32, over the first --sentences lines of test_2016_flickr tokenized by its own
  tokenizer (not timed), sorted by length. Every bundle is loaded in a process of its own at
  once, and they take turns on every 20 sentences of a pass (one batch at batch 32; the first
  one rotating), cell by cell and repeat by repeat, so that the machine's drifts fall on all
  of them alike; a pass's time is the sum of each stretch's median. Sentences/s is the
  measure that compares models (two models say the same thing in different numbers of
  tokens); tokens/s is shown too.

Writes the "models" section of docs/benchmarks.md. The first checkpoint is the baseline every
ratio is taken against.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from bench.compare.worker import turns
from bench.quality import SPLITS, evaluate
from bench.report import BENCHMARKS, opening, replace_section
from export.train_config import multi30k_dir

ROOT = Path(__file__).resolve().parent.parent
CELLS = ((1, 1), (1, 32), (4, 1), (4, 32))  # (beam, batch)


@dataclass
class Model:
    label: str
    checkpoint: Path
    bundle: Path

    @property
    def config(self) -> dict:
        return json.loads((self.checkpoint / "config.json").read_text())


def shape(config: dict) -> str:
    return (
        f"{config['encoder_layers']} + {config['decoder_layers']}, d {config['d_model']}, "
        f"vocab {config['vocab_size']}, {'pre' if config.get('pre_norm') else 'post'}-norm"
    )


def parameters(checkpoint: Path) -> int:
    """The torch model's trainable parameters (shared embeddings once; buffers not)."""
    from export.checkpoint import load_model_dir

    model, _ = load_model_dir(checkpoint)
    return sum(p.numel() for p in model.parameters())


def int8_bytes(bundle: Path) -> int:
    return sum(p.stat().st_size for p in bundle.glob("*.int8.onnx") if "shortlist" not in p.name)


def export(model: Model) -> None:
    """The checkpoint's int8 bundle, exported once (a bundle newer than its weights is kept)."""
    weights = model.checkpoint / "model.safetensors"
    manifest = model.bundle / "bundle.json"
    if manifest.is_file() and manifest.stat().st_mtime > weights.stat().st_mtime:
        return
    command = ["-m", "nmt_cli", "export", "--checkpoint", str(model.checkpoint)]
    command += ["--out", str(model.bundle), "--int8"]
    subprocess.run([sys.executable, *command], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


# ---- speed: one process per bundle, taking turns -------------------------------------------


def _timing_worker(bundle: str, lines: list[str], threads: int, conn: Connection) -> None:
    """In the bundle's own process: load it, then time the stretches the parent asks for."""
    from service.runtime.bundle import load_bundle
    from service.runtime.search import SearchOptions
    from service.runtime.sessions import EngineOptions
    from service.runtime.translator import Translator

    translator = Translator(
        load_bundle(Path(bundle)), EngineOptions(int8=True, intra_op_threads=threads)
    )
    # sorted by length, as translate_ids would sort a whole pass: each stretch is then the
    # same batches a pass over all of them would make
    sources = sorted(translator.tokenizer.encode(lines), key=len)
    translator.translate_ids(sources[:32], SearchOptions(beam_size=4), 32)  # warm-up
    conn.send("ready")
    while (command := conn.recv()) is not None:
        beam, batch, first, last = command
        start = time.perf_counter()
        found = translator.translate_ids(sources[first:last], SearchOptions(beam_size=beam), batch)
        seconds = time.perf_counter() - start
        tokens = sum(len(h[0].tokens) + 1 for h in found)  # (</s> counted, as bench.compare)
        conn.send((seconds, tokens))


def stretches(sentences: int, batch: int) -> list[tuple[int, int]]:
    """A pass's turns, as sentence ranges [first, last): the batches of bench.compare's
    turns (20 sentences, or one batch at batch 32)."""
    return [
        (batches.start * batch, min(batches.stop * batch, sentences))
        for batches in turns(sentences, batch)
    ]


def pass_speed(sentences: int, timed: list[list[tuple[float, int]]]) -> tuple[float, float]:
    """(sentences/s, tokens/s) of a pass whose time is the sum of each stretch's median:
    timed[stretch] = that stretch's (seconds, tokens) in every repeat."""
    seconds = sum(statistics.median(s for s, _ in runs) for runs in timed)
    tokens = sum(runs[0][1] for runs in timed)
    return sentences / seconds, tokens / seconds


def time_bundles(models: list[Model], lines: list[str], threads: int, repeat: int) -> dict:
    """{label: {(beam, batch): (sentences/s, tokens/s)}}. The bundles take turns on every
    stretch of a pass (`stretches`), the first one rotating, `repeat` times; a pass's time
    is the sum of the stretches' medians. Turns of whole passes (a second or more each) left
    the machine's drift within a turn: bench.compare's two CTranslate2 settings that decode
    greedy search alike came out 1.12x apart that way (docs/performance.md)."""
    context = multiprocessing.get_context("spawn")
    workers = []
    for model in models:
        parent, child = context.Pipe()
        process = context.Process(
            target=_timing_worker, args=(str(model.bundle), lines, threads, child)
        )
        process.start()
        workers.append((model.label, parent, process))
    for _, conn, _ in workers:
        assert conn.recv() == "ready"
    speeds: dict = {label: {} for label, _, _ in workers}
    turn = 0
    for beam, batch in CELLS:
        ranges = stretches(len(lines), batch)
        timed: dict = {label: [[] for _ in ranges] for label, _, _ in workers}
        for _ in range(repeat):
            for index, (first, last) in enumerate(ranges):
                shift = turn % len(workers)
                for label, conn, _ in workers[shift:] + workers[:shift]:
                    conn.send((beam, batch, first, last))
                    timed[label][index].append(conn.recv())
                turn += 1
        for label, per_stretch in timed.items():
            speeds[label][(beam, batch)] = pass_speed(len(lines), per_stretch)
    for _, conn, process in workers:
        conn.send(None)
        process.join()
    return speeds


# ---- the report -----------------------------------------------------------------------------


def cell_name(cell: tuple[int, int]) -> str:
    beam, batch = cell
    return f"{'greedy' if beam == 1 else f'beam {beam}'}, batch {batch}"


def report(models: list[Model], quality: dict, speeds: dict, args: argparse.Namespace) -> str:
    base = models[0].label
    setup = (
        f"; speed: int8, {args.threads} thread, the first {args.sentences} lines of "
        f"test_2016_flickr, {args.repeat} passes taken in turns of 20 sentences (one batch at "
        "batch 32), each stretch's median summed"
    )
    lines = opening("Checkpoints side by side", "bench.models", setup)
    lines += ["", "| model | shape | parameters | checkpoint MB | int8 bundle MB |"]
    lines += ["|---|---|---:|---:|---:|"]
    for m in models:
        size = (m.checkpoint / "model.safetensors").stat().st_size / 2**20
        lines.append(
            f"| {m.label} | {shape(m.config)} | {parameters(m.checkpoint) / 1e6:.2f} M "
            f"| {size:.1f} | {int8_bytes(m.bundle) / 2**20:.1f} |"
        )
    if quality:
        lines += quality_table(models, quality)
    lines += ["", f"Speed: sentences/s (tokens/s; the ratio of sentences/s to {base}'s):", ""]
    lines += ["| model | " + " | ".join(cell_name(c) for c in CELLS) + " |"]
    lines += ["|---|" + "---:|" * len(CELLS)]
    for m in models:
        cells = []
        for cell in CELLS:
            sentences, tokens = speeds[m.label][cell]
            ratio = sentences / speeds[base][cell][0]
            cells.append(f"{sentences:.1f} ({tokens:.0f}; {ratio:.2f}x)")
        lines.append(f"| {m.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def quality_table(models: list[Model], quality: dict) -> list[str]:
    lines = ["", "Quality (`nmt eval`, the torch model; sacrebleu's BLEU / chrF):", ""]
    header = [f"{split} {search}" for split in SPLITS for search in ("greedy", "beam 4")]
    lines += ["| model | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
    for m in models:
        found = [quality[m.label][split, beam] for split in SPLITS for beam in (1, 4)]
        cells = [f"{r['bleu']:.2f} / {r['chrf']:.2f}" for r in found]
        lines.append(f"| {m.label} | " + " | ".join(cells) + " |")
    return lines


def label_of(checkpoint: Path) -> str:
    """The committed model by its path in the repository, any other by its folder's name."""
    if checkpoint.resolve() == (ROOT / "models" / "fr-en").resolve():
        return "models/fr-en"
    return checkpoint.name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints", type=Path, nargs="+", help="the first is the baseline")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--work-dir", type=Path, default=ROOT / "build" / "bench-models")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-quality", action="store_true", help="speed and size only")
    parser.add_argument("--out", type=Path, default=BENCHMARKS)
    args = parser.parse_args(argv)
    data = args.data_dir or multi30k_dir()
    labels = [label_of(c) for c in args.checkpoints]
    if len(set(labels)) != len(labels):
        parser.error(f"two checkpoints share a folder name: {labels}")
    models = [
        Model(label, checkpoint, args.work_dir / label.replace("/", "-"))
        for label, checkpoint in zip(labels, args.checkpoints, strict=True)
    ]
    for model in models:
        export(model)
    lines = (data / "test_2016_flickr.fr").read_text(encoding="utf-8").splitlines()
    speeds = time_bundles(models, lines[: args.sentences], args.threads, args.repeat)
    quality: dict = {}
    for model in [] if args.no_quality else models:
        source, target = model.config["source_lang"], model.config["target_lang"]
        quality[model.label] = {}
        for split in SPLITS:
            for beam in (1, 4):
                result = evaluate(model.checkpoint, data, split, beam, source, target)
                quality[model.label][split, beam] = result
                print(model.label, split, beam, result["bleu"], flush=True)
    replace_section("models", report(models, quality, speeds, args), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
