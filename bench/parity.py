"""Parity report: the ONNX Runtime engine against the torch reference on a whole test set.

    python -m bench.parity --checkpoint models/fr-en --bundle build/fr-en

Checks, on every line of the test set: greedy and beam-4 outputs of the engine equal the torch
reference's; batch 1 equals batch 32 (batch invariance); int8 BLEU against fp32. Writes
docs/parity.md with exact counts and every differing line.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from export.checkpoint import load_model_dir
from export.data import read_lines
from export.scoring import corpus_scores
from export.train_config import multi30k_dir
from export.translate import translate_texts
from service.runtime.bundle import load_bundle
from service.runtime.search import SearchOptions
from service.runtime.sessions import EngineOptions
from service.runtime.translator import Translator


@dataclass
class Comparison:
    name: str
    left: str
    right: str
    equal: int
    total: int
    differences: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.equal / self.total


def compare(name: str, left: tuple[str, list[str]], right: tuple[str, list[str]]) -> Comparison:
    pairs = list(zip(left[1], right[1], strict=True))
    differences = [(i, a, b) for i, (a, b) in enumerate(pairs) if a != b]
    return Comparison(
        name, left[0], right[0], len(pairs) - len(differences), len(pairs), differences
    )


def produce_outputs(checkpoint: Path, bundle_dir: Path, sources: list[str]) -> dict[str, list[str]]:
    """Every system's translations of the same sentences, by name."""
    model, tokenizer = load_model_dir(checkpoint)
    bundle = load_bundle(bundle_dir)
    fp32 = Translator(bundle)
    int8 = Translator(bundle, EngineOptions(int8=True))
    greedy, beam = SearchOptions(beam_size=1), SearchOptions(beam_size=4)
    runs = {
        "torch greedy": lambda: translate_texts(model, tokenizer, sources, 1, 32),
        "torch beam4": lambda: translate_texts(model, tokenizer, sources, 4, 32),
        "onnx greedy b32": lambda: [t.text for t in fp32.translate(sources, greedy, 32)],
        "onnx beam4 b32": lambda: [t.text for t in fp32.translate(sources, beam, 32)],
        "onnx greedy b1": lambda: [t.text for t in fp32.translate(sources, greedy, 1)],
        "onnx beam4 b1": lambda: [t.text for t in fp32.translate(sources, beam, 1)],
        "onnx-int8 greedy b32": lambda: [t.text for t in int8.translate(sources, greedy, 32)],
        "onnx-int8 beam4 b32": lambda: [t.text for t in int8.translate(sources, beam, 32)],
    }
    outputs = {}
    for name, run in runs.items():
        started = time.perf_counter()
        outputs[name] = run()
        print(f"{name}: {time.perf_counter() - started:.1f} s", flush=True)
    return outputs


def parity(outputs: dict[str, list[str]], references: list[str]) -> dict:
    o = outputs
    comparisons = [
        compare(
            "engine = torch, greedy", ("torch", o["torch greedy"]), ("onnx", o["onnx greedy b32"])
        ),
        compare(
            "engine = torch, beam 4", ("torch", o["torch beam4"]), ("onnx", o["onnx beam4 b32"])
        ),
        compare(
            "batch 1 = batch 32, greedy", ("b1", o["onnx greedy b1"]), ("b32", o["onnx greedy b32"])
        ),
        compare(
            "batch 1 = batch 32, beam 4", ("b1", o["onnx beam4 b1"]), ("b32", o["onnx beam4 b32"])
        ),
    ]
    bleu = {name: corpus_scores(lines, references) for name, lines in outputs.items()}
    return {"comparisons": comparisons, "scores": bleu}


def write_report(result: dict, split: str, command: str, out: Path) -> None:
    lines = [
        f"# Parity: ONNX Runtime engine vs torch reference ({split})",
        "",
        f"Reproduce: `{command}`",
        "",
        "| check | equal lines | share |",
        "|---|---|---|",
    ]
    for c in result["comparisons"]:
        lines.append(f"| {c.name} | {c.equal} / {c.total} | {c.share:.2%} |")
    lines += ["", "| system | BLEU | chrF |", "|---|---|---|"]
    for name, s in result["scores"].items():
        lines.append(f"| {name} | {s['bleu']:.2f} | {s['chrf']:.2f} |")
    for c in result["comparisons"]:
        if not c.differences:
            continue
        lines += ["", f"## Differences: {c.name}", ""]
        for index, a, b in c.differences:
            lines += [f"- line {index + 1}", f"  - {c.left}: {a}", f"  - {c.right}: {b}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, default=Path("models/fr-en"))
    parser.add_argument("--bundle", type=Path, default=Path("build/fr-en"))
    parser.add_argument("--data-dir", type=Path, default=None, help="default: Multi30k")
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--out", type=Path, default=Path("docs/parity.md"))
    args = parser.parse_args()
    data = args.data_dir or multi30k_dir()
    sources = read_lines(data / f"{args.split}.fr")
    references = read_lines(data / f"{args.split}.en")
    result = parity(produce_outputs(args.checkpoint, args.bundle, sources), references)
    command = (
        f"python -m bench.parity --checkpoint {args.checkpoint} --bundle {args.bundle}"
        f" --split {args.split}"
    )
    write_report(result, args.split, command, args.out)
    summary = {c.name: f"{c.equal}/{c.total}" for c in result["comparisons"]}
    summary.update({name: s["bleu"] for name, s in result["scores"].items()})
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
