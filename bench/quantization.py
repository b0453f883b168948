"""How to quantize: the int8 options of issue 14 side by side, what each costs a decoder step
and what it does to BLEU.

    python -m bench.quantization --bundle build/models/fr-en

Every variant is made from the bundle's fp32 graphs (encoder and decoder step):

* **dynamic, per tensor**: the bundle's own int8 graphs (`nmt export --int8`). One scale per
  weight matrix; each activation is quantized at every run from its own range.
* **dynamic, per channel**: a scale per output column of each weight matrix.
* **static** (per tensor, per channel): the activations' scales are fixed ahead of time, from
  the ranges (MinMax) they took while the fp32 graphs translated calibration sentences
  (Multi30k's val set, never the test set), greedy and beam 4. ONNX Runtime's histogram
  calibrations (percentile, entropy) stack every run's activations into one array and so
  need inputs of one shape; a decoder step's past grows every step.
* **static, s8 activations**: the same with signed activations, so every matmul is s8 x s8
  (ONNX Runtime's dynamic quantizer makes u8 activations only).
* **bf16**: only probed. It needs a bfloat16 MatMul kernel in ONNX Runtime's CPU provider
  and a CPU with bf16 instructions; the report says what this machine and ONNX Runtime have.

Speed: each variant's decoder step at 1 row, 32 rows and 128 rows (beam 4 over 32 sources),
and its encoder on 32 sentences, taking turns in one process (`bench.step_ab`'s way), one
thread. Quality: BLEU of test_2016_flickr, greedy and beam 4, each variant through the
engine, beside fp32. Writes its section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort

from bench.report import cpu_model, replace_section
from bench.step_ab import in_turns, step_session, stepper
from export.scoring import corpus_scores
from export.train_config import multi30k_dir
from service.runtime.bundle import load_bundle
from service.runtime.engine import Engine
from service.runtime.running_batch import RunningBatch, pad_sources, running_batch
from service.runtime.search import SearchOptions, Sentence
from service.runtime.sessions import DISABLED_OPTIMIZERS, EngineOptions, session_options
from service.runtime.translator import Translator

GRAPHS = ("encoder", "decoder")


@dataclass
class Variant:
    name: str
    make: Callable[[Path, Path, list[dict]], None] | None  # (fp32, out, calibration feeds)
    folder: Path | None = None  # a bundle whose int8 graphs are this variant's


def step_feeds(engine: Engine, batch: RunningBatch) -> dict[str, np.ndarray]:
    """The decoder step's inputs for the batch's next step, as copies (the step writes its
    caches in place): what the engine binds, read from the batch's own arrays."""
    cache, rows = batch.cache, batch.rows
    length = int(cache.positions.max(initial=0)) + 1  # room for the position it writes
    feeds = {
        "target_ids": batch.feed[:, None].copy(),
        "source_mask": cache.source_mask.copy(),
        "top_k": np.array(batch.top_k(), dtype=np.int64),
        "positions": cache.positions.copy(),
        "forced_ids": np.zeros((rows, 1), dtype=np.int64),  # (no terms: one word, unread)
    }
    feeds |= {
        name: layer.copy() for name, layer in zip(engine.cross_names, cache.cross, strict=True)
    }
    for name, buffer in zip(engine.past_names, cache.past, strict=True):
        past = np.zeros((rows, *buffer.shape[1:2], length, buffer.shape[3]), np.float32)
        used = min(length, buffer.shape[2])
        past[:, :, :used] = buffer[:rows, :, :used]
        feeds[name] = past
    return feeds


def calibration_feeds(bundle: Path, sentences: list[str]) -> dict[str, list[dict]]:
    """The inputs the fp32 encoder and decoder step see while translating `sentences`
    greedy and with beam 4, 8 sentences a batch: what the activations' ranges come from."""
    translator = Translator(load_bundle(bundle), EngineOptions(int8=False, intra_op_threads=1))
    engine = translator.engine
    sources = translator.tokenizer.encode(sentences)
    found: dict[str, list[dict]] = {"encoder": [], "decoder": []}
    for beam in (1, 4):
        options = SearchOptions(beam_size=beam)
        for start in range(0, len(sources), 8):
            chunk = sources[start : start + 8]
            ids, mask = pad_sources(chunk, engine.pad_id)
            found["encoder"].append({"source_ids": ids, "source_mask": mask})
            batch = running_batch(engine, beam)
            batch.join([Sentence(source, options) for source in chunk])
            while len(batch):
                found["decoder"].append(step_feeds(engine, batch))
                batch.step()
    return found


def typed_for_the_quantizer(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model with every weight matmul's input declared float, and those matmuls' names.

    The fused step's contrib operators (MultiHeadAttention) have no ONNX shape inference, so
    the type of everything downstream of them is unknown to the quantizer, which then leaves
    those activations unquantized and quantizes the weights alone: ONNX Runtime turns such a
    weight-only matmul into MatMulNBits, the slow path of docs/performance.md. Declared float,
    each activation gets its QuantizeLinear/DequantizeLinear pair."""
    weights = {initializer.name for initializer in model.graph.initializer}
    known = {value.name for value in (*model.graph.value_info, *model.graph.input)}
    matmuls = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            matmuls.append(node.name)
            if node.input[0] not in known:
                declared = onnx.helper.make_tensor_value_info(
                    node.input[0], onnx.TensorProto.FLOAT, None
                )
                model.graph.value_info.append(declared)
                known.add(node.input[0])
    return model, matmuls


def static_quantizer(
    per_channel: bool, signed_activations: bool = False
) -> Callable[[Path, Path, list[dict]], None]:
    """Static scales for the matmuls' inputs, calibrated on `feeds`; s8 activations
    (`signed_activations`) make every matmul s8 x s8 instead of u8 x s8."""

    def make(fp32: Path, out: Path, feeds: list[dict]) -> None:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.remaining = iter(feeds)

            def get_next(self) -> dict | None:
                return next(self.remaining, None)

        model, matmuls = typed_for_the_quantizer(onnx.load(fp32))
        with tempfile.TemporaryDirectory() as folder:
            typed = Path(folder) / fp32.name
            onnx.save(model, typed)
            quantize_static(
                str(typed),
                str(out),
                Reader(),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=["MatMul"],
                nodes_to_quantize=matmuls,
                per_channel=per_channel,
                activation_type=QuantType.QInt8 if signed_activations else QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                extra_options={
                    "DefaultTensorType": onnx.TensorProto.FLOAT,
                    # The matmul's output stays float, as in the dynamic graphs: ONNX Runtime
                    # then runs MatMulIntegerToFloat with the fixed input scale.
                    "OpTypesToExcludeOutputQuantization": ["MatMul"],
                },
            )

    return make


def dynamic_quantizer(per_channel: bool) -> Callable[[Path, Path, list[dict]], None]:
    def make(fp32: Path, out: Path, feeds: list[dict]) -> None:
        from export.onnx_export import quantize_graph

        quantize_graph(fp32, out, per_channel=per_channel)

    return make


VARIANTS = [
    Variant("dynamic, per tensor (the bundle's)", None),
    Variant("dynamic, per channel", dynamic_quantizer(per_channel=True)),
    Variant("static, per tensor", static_quantizer(per_channel=False)),
    Variant("static, per channel", static_quantizer(per_channel=True)),
    Variant(
        "static, per tensor, s8 activations (s8 x s8)",
        static_quantizer(per_channel=False, signed_activations=True),
    ),
]


def variant_bundle(bundle: Path, folder: Path) -> Path:
    """A copy of the bundle (links to its files) whose int8 graphs are written afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in bundle.iterdir():
        link = folder / file.name
        if not link.exists():
            link.symlink_to(file.resolve())
    return folder


def bf16_probe() -> str:
    """Whether ONNX Runtime's CPU provider runs a bfloat16 MatMul, and whether this CPU has
    bf16 instructions."""
    flags = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    cpu = ", ".join(sorted(flags & {"avx512_bf16", "amx_bf16", "avx512f", "avx2"})) or "none"
    bf16 = onnx.TensorProto.BFLOAT16
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["a", "b"], ["c"])],
        "bf16_matmul",
        [
            onnx.helper.make_tensor_value_info("a", bf16, [4, 8]),
            onnx.helper.make_tensor_value_info("b", bf16, [8, 8]),
        ],
        [onnx.helper.make_tensor_value_info("c", bf16, [4, 8])],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=9
    )
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        runtime = "runs a bfloat16 MatMul"
    except Exception as error:  # any failure is the answer
        runtime = f"has no bfloat16 MatMul: `{str(error).splitlines()[0][:140]}`"
    return (
        f"ONNX Runtime {ort.__version__}'s CPU provider {runtime}. This CPU's relevant flags: "
        f"{cpu} (bf16 arithmetic needs avx512_bf16 or amx_bf16)."
    )


def step_times(variants: list[Variant], turns: int) -> dict[str, list[float]]:
    """Median ms of each variant's decoder step at each shape and of its encoder, in turns."""
    shapes = {
        "step, 1 row": SimpleNamespace(rows=1, rows_per_source=1),
        "step, 32 rows": SimpleNamespace(rows=32, rows_per_source=1),
        "step, 128 rows (beam 4)": SimpleNamespace(rows=128, rows_per_source=4),
    }
    results: dict[str, list[float]] = {}
    for label, shape in shapes.items():
        shape.past, shape.source, shape.candidates = 10, 12, 1000
        runs = [stepper(*step_session(v.folder / "decoder.int8.onnx", 1, shape)) for v in variants]
        results[label] = [statistics.median(t) * 1e3 for t in in_turns(runs, turns)]
    rng = np.random.default_rng(0)
    feeds = {
        "source_ids": rng.integers(3, 8000, (32, 16)),
        "source_mask": np.ones((32, 16), dtype=bool),
    }
    runs = []
    for variant in variants:
        session = ort.InferenceSession(
            str(variant.folder / "encoder.int8.onnx"),
            session_options(EngineOptions(intra_op_threads=1)),
            providers=["CPUExecutionProvider"],
            disabled_optimizers=DISABLED_OPTIMIZERS,
        )
        runs.append(lambda session=session: session.run(None, feeds))
    times = in_turns(runs, max(turns // 4, 2), per_turn=5)
    results["encoder, 32 sentences"] = [statistics.median(t) * 1e3 for t in times]
    return results


def quality(folder: Path, int8: bool, sources: list[str], references: list[str]) -> list[dict]:
    """BLEU (and the translations) greedy and with beam 4, 32 sentences a batch."""
    # (the variants replace decoder.int8.onnx)
    options = EngineOptions(int8=int8, intra_op_threads=1)
    translator = Translator(load_bundle(folder, verify=False), options)
    found = []
    for beam in (1, 4):
        texts = [t.text for t in translator.translate(sources, SearchOptions(beam_size=beam))]
        found.append(corpus_scores(texts, references) | {"texts": texts})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quantization", description=__doc__)
    parser.add_argument("--bundle", type=Path, default=Path("build/models/fr-en"))
    parser.add_argument("--data", type=Path, default=None, help="Multi30k (default: ../shared)")
    parser.add_argument("--calibration", type=int, default=200, help="val sentences")
    parser.add_argument("--work", type=Path, default=Path("build/quantization"))
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("docs/performance.md"))
    args = parser.parse_args(argv)
    data = args.data or multi30k_dir()
    manifest = json.loads((args.bundle / "bundle.json").read_text())
    source, target = manifest["source_lang"], manifest["target_lang"]
    val = (data / f"val.{source}").read_text().splitlines()[: args.calibration]
    test_sources = (data / f"test_2016_flickr.{source}").read_text().splitlines()
    references = (data / f"test_2016_flickr.{target}").read_text().splitlines()

    logging.getLogger().setLevel(logging.ERROR)  # the quantizers' advice is noise here
    feeds = calibration_feeds(args.bundle, val)
    print(f"calibration: {len(feeds['encoder'])} encoder and {len(feeds['decoder'])} step runs")
    for number, variant in enumerate(VARIANTS):
        if variant.make is None:
            variant.folder = args.bundle
            continue
        variant.folder = variant_bundle(args.bundle, args.work / f"variant{number}")
        for graph in GRAPHS:
            out = variant.folder / f"{graph}.int8.onnx"
            out.unlink(missing_ok=True)  # a link to the bundle's own
            variant.make(args.bundle / f"{graph}.onnx", out, feeds[graph])
        print(f"made: {variant.name}")

    times = step_times(VARIANTS, args.turns)
    fp32 = quality(args.bundle, False, test_sources, references)
    rows = []
    for variant, *costs in zip(VARIANTS, *times.values(), strict=True):
        scores = quality(variant.folder, True, test_sources, references)
        same = [
            sum(a == b for a, b in zip(s["texts"], f["texts"], strict=True)) / len(references)
            for s, f in zip(scores, fp32, strict=True)
        ]
        first = [column[0] for column in times.values()]
        speed = " | ".join(f"{c:.3f} ({c / f:.2f}x)" for c, f in zip(costs, first, strict=True))
        rows.append(
            f"| {variant.name} | {speed} | {scores[0]['bleu']:.2f} / {scores[1]['bleu']:.2f} "
            f"| {same[0]:.0%} / {same[1]:.0%} |"
        )
        print(rows[-1])

    header = " | ".join(f"{label}, ms" for label in times)
    markdown = "\n".join(
        [
            "## How to quantize: per tensor or per channel, dynamic or static",
            "",
            f"Reproduce: `python -m bench.quantization --bundle {args.bundle}` "
            f"({cpu_model()}, {platform.machine()}, one thread, ONNX Runtime {ort.__version__}).",
            "",
            "Each variant's int8 encoder and decoder step, made from the same fp32 graphs. "
            "Times are medians, the variants taking turns in one process (ratios to the "
            "first row); the step has a 10-token past and a 12-token source. Static "
            f"variants are calibrated on the first {len(val)} sentences of val, greedy and "
            f"beam 4 ({len(feeds['decoder'])} decoder steps). BLEU and the share of "
            "sentences equal to fp32's are on all of test_2016_flickr, greedy / beam 4. "
            f"fp32: BLEU {fp32[0]['bleu']:.2f} / {fp32[1]['bleu']:.2f}.",
            "",
            f"| variant | {header} | BLEU | same as fp32 |",
            "|---|" + "---|" * (len(times) + 2),
            *rows,
            "",
            f"bf16: {bf16_probe()}",
        ]
    )
    replace_section("quantization", markdown, args.out)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
