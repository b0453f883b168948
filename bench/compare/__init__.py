"""Ours against CTranslate2 and transformers, on the same weights and the same sentences.

    python -m bench.compare --checkpoint models/fr-en      (from the repository root)

One run prepares the three forms of one checkpoint (our ONNX bundle, fp32 + int8; the Hugging
Face directory from `nmt export-hf`; a CTranslate2 model), then times every engine on the same
pre-tokenized sentences. A Marian-shaped checkpoint becomes a Marian directory, converted by
the stock `ct2-transformers-converter`. A pre-norm student is converted to CTranslate2 straight
from its weights (`ct2_convert`, tested token for token against the torch reference), and has
a Hugging Face directory (M2M-100's), so a transformers engine, only when trained in M2M-100's
layout.

* ours: fp32 and int8, with and without the KV cache (ONNX Runtime);
* CTranslate2: compute_type float32 and int8;
* transformers: `generate` of MarianMTModel or M2M100ForConditionalGeneration (torch, fp32).

Each engine runs in its own subprocess, so that its peak memory (the process's resident-set
high-water mark, `VmHWM`: interpreter, libraries, weights and working memory) is its own.
Sentences are sorted by length and cut into the same batches for every engine. The engines'
processes are loaded at once and take turns on each stretch of 20 sentences (or one batch,
where a batch holds more), the first one rotating, one process working at a time
(`worker.spawn_interleaved`): a warm-up pass, then `--repeat` timed passes; a configuration's
time is the sum of its stretches' median times. Tokens/s counts output tokens (one per
produced token, plus one for </s>) over decoding time (encoder included, tokenization not).

It also checks that the engines translate alike (beam 4, every line of the test set, each
sentence with the same length limit: ours is `min(max_length, 1.5 * source + 10)`; the others
get it per group of sentences sharing a limit). Writes two sections of docs/benchmarks.md
("compare", "compare-parity") and docs/compare.svg. Needs the `bench` extra.

Modules, one job each: `prepare` (artefacts and sentences), `runners` (the engines),
`ct2_convert` (a CTranslate2 model of any of our shapes), `worker` (one engine in its own
process), `profiling` (ONNX Runtime's profiler), `parity` (same translations?), `report` (the
speed tables), `plot` (the chart), `cli` (the command).
Measured numbers live in docs/benchmarks.md, never here: rerun the command to refresh them.
"""

from bench.compare.cli import add_arguments, main, run_from_args
from bench.compare.parity import run_parity

__all__ = ["add_arguments", "main", "run_from_args", "run_parity"]
