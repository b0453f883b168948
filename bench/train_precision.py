"""A training step in float32 against bfloat16 mixed precision (`nmt train --bf16`), in turns.

    python -m bench.train_precision --encoder-layers 6 --decoder-layers 1 --threads 1 2

A model of the given shape (random weights, the committed vocabulary size) takes training
steps on one random batch of about `--max-tokens` padded tokens, as `nmt train` does
(forward, label-smoothed loss, backward, clipping, Adam): in float32, and with the forward
pass's matmuls in bfloat16 under torch.autocast (weights, optimizer and loss float32). The
two take turns, a few steps each, so a slow spell of the machine falls on both; medians.
bf16 pays where the CPU multiplies bf16 natively (AMX, AVX-512 BF16); elsewhere oneDNN
converts and may be slower. Writes the "train-precision" section of docs/training.md.
Whether bf16 trains as good a model is measured on val by whole runs (docs/training.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.report import opening, replace_section
from export.model.config import ModelConfig
from export.model.transformer import Transformer

SOURCE_TOKENS, TARGET_TOKENS = 17, 16  # Multi30k's mean lengths, about


def step_seconds(shape: argparse.Namespace, threads: int, turns: int) -> dict[str, float]:
    """Median seconds of one training step, float32 and bf16, at `threads` threads."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=shape.vocab_size,
        d_model=shape.d_model,
        n_heads=shape.d_model // 64,
        ffn_dim=4 * shape.d_model,
        encoder_layers=shape.encoder_layers,
        decoder_layers=shape.decoder_layers,
        dropout=0.1,
        pre_norm=True,
        final_layer_norm=True,
    )
    model = Transformer(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    rows = shape.max_tokens // SOURCE_TOKENS
    sources = torch.randint(4, shape.vocab_size, (rows, SOURCE_TOKENS))
    source_mask = torch.ones(rows, SOURCE_TOKENS, dtype=torch.bool)
    target_in = torch.randint(4, shape.vocab_size, (rows, TARGET_TOKENS))
    target_out = torch.randint(4, shape.vocab_size, (rows, TARGET_TOKENS))

    def step(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(sources, source_mask, target_in)  # [B, T, V]
        loss = F.cross_entropy(
            logits.reshape(-1, shape.vocab_size).float(),
            target_out.reshape(-1),
            label_smoothing=0.1,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    times: dict[str, list[float]] = {"float32": [], "bf16": []}
    for bf16 in (False, True):  # warm-up: oneDNN builds its kernels on first use
        step(bf16)
    for _ in range(turns):
        for label, bf16 in (("float32", False), ("bf16", True)):
            start = time.perf_counter()
            for _ in range(3):
                step(bf16)
            times[label].append((time.perf_counter() - start) / 3)
    return {label: statistics.median(seconds) for label, seconds in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.train_precision", description=__doc__)
    parser.add_argument("--encoder-layers", type=int, default=6)
    parser.add_argument("--decoder-layers", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=Path("docs/training.md"))
    args = parser.parse_args(argv)

    rows = []
    for threads in args.threads:
        found = step_seconds(args, threads, args.turns)
        ratio = found["float32"] / found["bf16"]
        rows.append(
            f"| {threads} | {found['float32'] * 1e3:.0f} | {found['bf16'] * 1e3:.0f} "
            f"| {ratio:.2f}x |"
        )
        print(rows[-1], flush=True)
    shape = f"{args.encoder_layers} + {args.decoder_layers} layers, d {args.d_model}"
    lines = opening(
        "A training step: float32 against bf16 mixed precision",
        "bench.train_precision",
        f"; torch {torch.__version__}; {shape}, pre-norm, vocabulary {args.vocab_size}, "
        f"a batch of {args.max_tokens // SOURCE_TOKENS} pairs ({SOURCE_TOKENS} + "
        f"{TARGET_TOKENS} tokens); median of {args.turns} turns of 3 steps each",
    )
    lines += [
        "",
        "| threads | float32, ms a step | bf16, ms a step | bf16 speed-up |",
        "|---:|---:|---:|---:|",
        *rows,
    ]
    replace_section("train-precision", "\n".join(lines), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
