"""What a smaller vocabulary costs and saves a student, before training one: tokens per sentence
and the decoder step's time, per joint vocabulary size.

    python -m bench.vocabulary --sizes 8000 4000 2000

Each size's SentencePiece model is trained as `nmt train` trains one (joint, on Multi30k's
training sources and references; 8000 is the committed one), into build/vocabulary/. Its tokens
per sentence are counted on val (with </s>). A model of the student's shape (6 + 1, pre-norm,
random weights: a step costs the same whatever the weights) is exported int8 with each
vocabulary, and the decoder steps take turns in one process (bench.step_ab), at batch 1 and 32
rows. A sentence's decoder time scales with its target tokens times the step, so the last
columns are that product, against the first size. The encoder's cost is left out: it runs once
a sentence and changes only with the source's tokens. Writes the "vocabulary" section of
docs/training.md; the BLEU each size gives is in its training runs (the "runs" section).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import sentencepiece as spm

from bench.report import opening, replace_section
from bench.step_ab import in_turns, step_session, stepper
from export.train_config import multi30k_dir

COMMITTED_SIZE, COMMITTED_TOKENIZER = 8000, Path("models/fr-en/sentencepiece.model")


def tokenizer_of(size: int, work: Path, data: Path) -> Path:
    if size == COMMITTED_SIZE:
        return COMMITTED_TOKENIZER
    from export.tokenizer import train_sentencepiece

    path = work / f"spm{size}.model"
    if not path.is_file():
        path = train_sentencepiece(
            [data / "train.fr", data / "train.en"], work / f"spm{size}", size
        )
    return path


def tokens_per_sentence(tokenizer: Path, lines: list[str]) -> float:
    processor = spm.SentencePieceProcessor(model_file=str(tokenizer))
    return sum(len(ids) + 1 for ids in processor.encode(lines)) / len(lines)  # + </s>


def student_bundle(tokenizer: Path, shape: str, out: Path) -> Path:
    """An int8 bundle of a random model of the shape, in M2M-100's layout, with the tokenizer."""
    import torch

    from export.checkpoint import save_model_dir
    from export.model.config import ModelConfig
    from export.model.transformer import Transformer
    from export.onnx_export import export_bundle

    if (out / "bundle" / "decoder.int8.onnx").is_file():
        return out / "bundle"
    encoder_layers, decoder_layers = map(int, shape.split("x"))
    vocab_size = spm.SentencePieceProcessor(model_file=str(tokenizer)).get_piece_size()
    config = ModelConfig(
        vocab_size=vocab_size, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
        pre_norm=True, final_layer_norm=True, positions="sinusoidal_offset", decoder_start_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    save_model_dir(Transformer(config).eval(), tokenizer, out / "model")
    export_bundle(out / "model", out / "bundle", int8=True)
    return out / "bundle"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vocabulary", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8000, 4000])
    parser.add_argument("--shape", default="6x1", help="encoder x decoder layers")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--work", type=Path, default=Path("build/vocabulary"))
    parser.add_argument("--out", type=Path, default=Path("docs/training.md"))
    args = parser.parse_args(argv)
    data = multi30k_dir()
    args.work.mkdir(parents=True, exist_ok=True)
    sources = (data / "val.fr").read_text(encoding="utf-8").splitlines()
    targets = (data / "val.en").read_text(encoding="utf-8").splitlines()

    tokenizers = [tokenizer_of(size, args.work, data) for size in args.sizes]
    source_tokens = [tokens_per_sentence(t, sources) for t in tokenizers]
    target_tokens = [tokens_per_sentence(t, targets) for t in tokenizers]
    graphs = [
        student_bundle(t, args.shape, args.work / f"{args.shape}-{size}") / "decoder.int8.onnx"
        for size, t in zip(args.sizes, tokenizers, strict=True)
    ]
    steps = {}  # rows -> median seconds of each graph
    for rows in args.rows:
        shape = argparse.Namespace(
            rows=rows, rows_per_source=1, past=10, source=round(source_tokens[0]), candidates=0
        )
        sessions = [step_session(graph, 1, shape) for graph in graphs]
        times = in_turns([stepper(*session) for session in sessions], args.turns)
        steps[rows] = [statistics.median(t) for t in times]
        print(rows, [f"{s * 1e3:.3f} ms" for s in steps[rows]], flush=True)

    rows_header = " | ".join(f"step, {r} row{'s' * (r > 1)}" for r in args.rows)
    sentence_header = " | ".join(f"decoder time a sentence, {r}" for r in args.rows)
    lines = opening(
        "Vocabulary size: tokens and decoder steps",
        "bench.vocabulary",
        f"; a {args.shape.replace('x', ' + ')} student (pre-norm, d 256, random weights), "
        f"int8, one thread; val ({len(sources)} sentences); median of {20 * args.turns} steps "
        "each, the graphs taking turns",
    )
    lines += [
        "",
        f"| vocabulary | source tokens a sentence | target tokens a sentence | {rows_header} "
        f"| {sentence_header} |",
        "|---:|---:|---:|" + "---:|" * (2 * len(args.rows)),
    ]
    for i, size in enumerate(args.sizes):
        step_cells = " | ".join(
            f"{steps[r][i] * 1e3:.3f} ms ({steps[r][i] / steps[r][0]:.2f}x)" for r in args.rows
        )
        sentence_cells = " | ".join(
            f"{steps[r][i] * target_tokens[i] / (steps[r][0] * target_tokens[0]):.2f}x"
            for r in args.rows
        )
        lines.append(
            f"| {size} | {source_tokens[i]:.2f} | {target_tokens[i]:.2f} | {step_cells} "
            f"| {sentence_cells} |"
        )
    replace_section("vocabulary", "\n".join(lines), args.out)
    print("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
