"""`nmt export`: a model directory -> an ONNX bundle the service can load without torch.

The bundle (see service/runtime/bundle.py for the reading side; nmt_contract.py for what
both sides agree on):
* `encoder.onnx`: source ids + mask -> the cross-attention keys and values of every decoder
  layer. The decoder never sees the encoder output itself: the source only enters a decoder
  step through these keys/values, so projecting them once here saves L*2 matmuls per step.
* `decoder.onnx`: one step with a self-attention KV cache (grows by one position a step).
  Inputs: target_ids [rows, 1], source_mask, top_k, past_mask [rows, P] and positions [rows]
  (rows may have joined the running batch at different steps: their caches are left-padded),
  past and cross keys/values; outputs: the top_k log-probs of the next token and their ids
  [rows, k], best first (top_k = V gives the whole distribution), the alignment (last layer's
  cross-attention weights, head mean) [rows, S], every layer's weights head by head
  `attention_0`, `attention_1`, ... [rows, H, S], and the present keys/values.
* `decoder_nocache.onnx`: recomputes the whole target prefix each step; for benchmarks only,
  so that what the cache buys is measured rather than assumed.
* `*.int8.onnx`: the same graphs with dynamically quantized (int8) MatMul weights.
* the tokenizer files and `bundle.json` (dimensions, special ids, tokenizer files by role,
  checksums, export settings). `tokenizer` is {"source", "target"}: SentencePiece models,
  the same file for our joint model; plus "vocab" (piece -> id) for Marian imports.

Keys and values travel per decoder layer, as inputs and outputs named
`{past,present,cross}_{keys,values}_{layer}`, each [rows, H, length, Dh]. The cross-attention
keys/values have one row per source sentence: in beam search the K beams of a sentence are K
queries against the same copy (see DecoderLayer), so they are never repeated K times.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from export.checkpoint import load_model_dir, read_description
from export.fused_step import fused_decoder_step
from export.model.transformer import Transformer
from nmt_contract import (
    BUNDLE_FORMAT,
    IN_PLACE_DECODER,
    SHORTLIST_FILE,
    Shortlist,
    attention_output_names,
    layer_names,
    sha256_of,
)

log = logging.getLogger("nmt.export")

OPSET = 18


def _pairs(flat: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys_0, values_0, keys_1, values_1, ...) -> [(keys_0, values_0), ...]"""
    return list(zip(flat[0::2], flat[1::2], strict=True))


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, source_ids: torch.Tensor, source_mask: torch.Tensor) -> tuple:
        """source_ids [B, S] int64, source_mask [B, S] bool
        -> cross keys_0, values_0, keys_1, ... each [B, H, S, Dh]"""
        encoder_output = self.model.encode(source_ids, source_mask)  # [B, S, D]
        cross = self.model.cross_keys_values(encoder_output)
        return tuple(tensor for pair in cross for tensor in pair)


def _top_log_probs(last_logits: torch.Tensor, top_k: torch.Tensor):
    """last_logits [B, V] -> the top_k log-probs of the next token and their ids [B, k].

    Selecting in the graph means a step hands back [B, k] instead of [B, V] to the engine:
    greedy asks for k = 1, beam search for k = beam + 1 (see service/runtime/search.py for why
    that is enough).
    (Normalizing only the k chosen, logit - logsumexp, was measured slower: ONNX Runtime's
    ReduceLogSumExp is several times slower than its LogSoftmax.)
    """
    return torch.topk(torch.log_softmax(last_logits, dim=-1), top_k, dim=-1)


class DecoderStepGraph(nn.Module):
    """One decoding step with the self-attention cache.

    Caches are inputs and outputs per layer ([B, H, length, Dh] each): stacking them over
    layers would cost an unbind and a re-stack of the whole cache in every step.
    Cross keys/values and the source mask have one row per *source*; the B rows of the step
    are K consecutive rows per source (the beams of a sentence; K = 1 in greedy search).
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        self.layers = model.config.decoder_layers

    def forward(
        self,
        target_ids: torch.Tensor,  # [B, 1] the last token of every row
        source_mask: torch.Tensor,  # [B/K, S] bool
        top_k: torch.Tensor,  # int64 scalar: how many best tokens to return per row
        past_mask: torch.Tensor,  # [B, P] bool: False for the padding in front of a row that
        # joined the running batch later than others (continuous batching)
        positions: torch.Tensor,  # [B] int64: each row's position (its real past length)
        *caches: torch.Tensor,  # past keys/values per layer [B, H, P, Dh] (P = 0 at first),
        # then cross keys/values per layer [B/K, H, S, Dh] from encoder.onnx
    ) -> tuple[torch.Tensor, ...]:
        past, cross = _pairs(caches[: 2 * self.layers]), _pairs(caches[2 * self.layers :])
        logits, present, layer_weights = self.model.decode(
            target_ids, past, cross, source_mask, past_mask, positions, all_attention=True
        )
        # logits [B, 1, V] -> [B, V]: a Reshape is free, indexing the step axis would copy
        top_log_probs, top_ids = _top_log_probs(logits.reshape(-1, logits.shape[-1]), top_k)
        # Every layer's cross-attention weights of this step, [B, H, 1, S] -> [B, H, S] each
        # (a Squeeze: ONNX Runtime runs every node whether its output is asked for or not, so
        # these stay one node a layer); alignment [B, S]: the last layer's, head mean.
        attention = tuple(weights.squeeze(2) for weights in layer_weights)
        alignment = attention[-1].mean(dim=1)
        flat_present = tuple(tensor for pair in present for tensor in pair)  # [B, H, P+1, Dh]
        return (top_log_probs, top_ids, alignment, *attention, *flat_present)


class DecoderNoCacheGraph(nn.Module):
    """The whole target prefix every step, no self-attention cache (benchmarks only)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        target_ids: torch.Tensor,  # [B, T] the whole prefix, start token first
        source_mask: torch.Tensor,  # [B/K, S]
        top_k: torch.Tensor,
        *cross_flat: torch.Tensor,  # cross keys/values per layer [B/K, H, S, Dh]
    ) -> tuple[torch.Tensor, ...]:
        cross = _pairs(cross_flat)
        config = self.model.config
        empty = torch.zeros(target_ids.shape[0], config.n_heads, 0, config.head_dim)
        past = [(empty, empty)] * len(cross)  # [B, H, 0, Dh]: nothing cached
        logits, _, _ = self.model.decode(target_ids, past, cross, source_mask)
        return _top_log_probs(logits[:, -1], top_k)


def _example_inputs(model: Transformer) -> dict:
    """Shapes chosen so that no dynamic size is 0 or 1 (the tracer would fix those):
    3 sources, 2 rows (beams) each."""
    config = model.config
    sources, rows, source, past, target = 3, 6, 7, 4, 5
    layers = config.decoder_layers
    source_mask = torch.ones((sources, source), dtype=torch.bool)
    source_mask[1, 5:] = False
    cache = (rows, config.n_heads, past, config.head_dim)
    cross = (sources, config.n_heads, source, config.head_dim)
    past_mask = torch.ones((rows, past), dtype=torch.bool)
    past_mask[2:4, :2] = False  # rows that joined two steps later
    return {
        "source_ids": torch.randint(3, config.vocab_size, (sources, source)),
        "past_mask": past_mask,
        "positions": past_mask.sum(dim=1),
        "source_mask": source_mask,
        "target_step": torch.randint(3, config.vocab_size, (rows, 1)),
        "target_prefix": torch.randint(3, config.vocab_size, (rows, target)),
        "past": tuple(torch.randn(cache) for _ in range(2 * layers)),
        "cross": tuple(torch.randn(cross) for _ in range(2 * layers)),
        "top_k": torch.tensor(4),
    }


def _export(module: nn.Module, args: tuple, path: Path, names: dict, dynamic: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=names["inputs"],
            output_names=names["outputs"],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    onnx.checker.check_model(str(path), full_check=True)


DECODER_GRAPHS = ("fused", "traced")
IN_PLACE_FILE = "decoder_in_place.onnx"


def export_graphs(
    model: Transformer, out_dir: Path, nocache: bool = True, decoder: str = "fused"
) -> list[str]:
    """Write the fp32 graphs; returns their file names. `nocache`: also the no-cache decoder,
    which only benchmarks use (what the KV cache buys). `decoder`: how the step graph is made,
    "fused" (export/fused_step.py: ONNX Runtime's fused attention, a third of the nodes) or
    "traced" (torch.onnx.export of `Transformer.decode`); both have the same inputs and
    outputs, and tests hold both to the torch model."""
    if decoder not in DECODER_GRAPHS:
        raise ValueError(f"decoder must be one of {DECODER_GRAPHS}, got {decoder!r}")
    model.eval()
    x = _example_inputs(model)
    cross_names = layer_names("cross", model.config.decoder_layers)
    by_source = {0: "sources", 1: "source"}  # [B/K, S]
    cross = {0: "sources", 2: "source"}  # [B/K, H, S, Dh]
    top = {0: "batch", 1: "k"}
    with torch.no_grad():
        _export(
            EncoderGraph(model),
            (x["source_ids"], x["source_mask"]),
            out_dir / "encoder.onnx",
            {"inputs": ["source_ids", "source_mask"], "outputs": cross_names},
            {"source_ids": by_source, "source_mask": by_source} | dict.fromkeys(cross_names, cross),
        )
        graphs = ["encoder.onnx", "decoder.onnx"]
        if decoder == "fused":
            _save_fused_step(fused_decoder_step(model), out_dir / "decoder.onnx")
            # The same step writing its self-attention caches in place (what the engine runs)
            _save_fused_step(fused_decoder_step(model, in_place=True), out_dir / IN_PLACE_FILE)
            graphs.append(IN_PLACE_FILE)
        else:
            _export_traced_step(model, out_dir)
        if not nocache:
            return graphs
        _export(
            DecoderNoCacheGraph(model),
            (x["target_prefix"], x["source_mask"], x["top_k"], *x["cross"]),
            out_dir / "decoder_nocache.onnx",
            {
                "inputs": ["target_ids", "source_mask", "top_k", *cross_names],
                "outputs": ["top_log_probs", "top_ids"],
            },
            {"target_ids": {0: "batch", 1: "target"}, "source_mask": by_source}
            | {"top_log_probs": top, "top_ids": top}
            | dict.fromkeys(cross_names, cross),
        )
    return [*graphs, "decoder_nocache.onnx"]


def _export_traced_step(model: Transformer, out_dir: Path) -> None:
    """decoder.onnx from torch.onnx.export of DecoderStepGraph."""
    x = _example_inputs(model)
    layers = model.config.decoder_layers
    cross_names = layer_names("cross", layers)
    past_names, present_names = layer_names("past", layers), layer_names("present", layers)
    attention_names = attention_output_names(layers)
    by_source = {0: "sources", 1: "source"}  # [B/K, S]
    cross = {0: "sources", 2: "source"}  # [B/K, H, S, Dh]
    past = {0: "batch", 2: "past"}  # [B, H, P, Dh]
    present = {0: "batch", 2: "past_plus_one"}
    weights = {0: "batch", 2: "source"}  # [B, H, S]
    top = {0: "batch", 1: "k"}
    head = {"top_log_probs": top, "top_ids": top}
    _export(
        DecoderStepGraph(model),
        (
            x["target_step"],
            x["source_mask"],
            x["top_k"],
            x["past_mask"],
            x["positions"],
            *x["past"],
            *x["cross"],
        ),
        out_dir / "decoder.onnx",
        {
            "inputs": [
                "target_ids",
                "source_mask",
                "top_k",
                "past_mask",
                "positions",
                *past_names,
                *cross_names,
            ],
            "outputs": [
                "top_log_probs",
                "top_ids",
                "alignment",
                *attention_names,
                *present_names,
            ],
        },
        {"target_ids": {0: "batch"}, "source_mask": by_source}
        | {"past_mask": {0: "batch", 1: "past"}, "positions": {0: "batch"}}
        | {"alignment": {0: "batch", 1: "source"}}
        | dict.fromkeys(attention_names, weights)
        | head
        | dict.fromkeys(past_names, past)
        | dict.fromkeys(cross_names, cross)
        | dict.fromkeys(present_names, present),
    )


def _save_fused_step(step: onnx.ModelProto, path: Path) -> None:
    onnx.checker.check_model(step)  # no full check: ONNX has no schemas for contrib ops
    onnx.save(step, str(path))


def _export_shortlist(model: Transformer, checkpoint: Path, out_dir: Path) -> dict | None:
    """When the model directory has a shortlist (`nmt shortlist`): the shortlist itself, the
    output projection [D, V] the runtime gathers a batch's candidate columns from, and the
    decoder step that scores only them. None without one."""
    if not (checkpoint / SHORTLIST_FILE).is_file():
        return None
    vocab_size = model.config.vocab_size
    if not Shortlist.load(checkpoint / SHORTLIST_FILE).fits(vocab_size):
        raise ValueError(
            f"{checkpoint / SHORTLIST_FILE} does not fit this model's {vocab_size} words "
            "(built for another vocabulary?): rebuild it with `nmt shortlist`"
        )
    shutil.copyfile(checkpoint / SHORTLIST_FILE, out_dir / SHORTLIST_FILE)
    projection = model.embed_tokens.weight.detach().T.contiguous().numpy()  # [D, V]
    with open(out_dir / "output_projection.npy", "wb") as f:
        np.save(f, projection)
    _save_fused_step(fused_decoder_step(model, shortlist=True), out_dir / "decoder_shortlist.onnx")
    return {
        "file": SHORTLIST_FILE,
        "projection": "output_projection.npy",
        "graph": "decoder_shortlist.onnx",
    }


def quantize_graph(fp32_path: Path, out: Path | None = None, per_channel: bool = False) -> Path:
    """Dynamic int8 quantization of the MatMul weights, into `out` (by default beside the
    graph, as NAME.int8.onnx). The activations are quantized at every run from their own
    range. `per_channel`: a scale per output column of each weight matrix instead of one per
    matrix (measured in docs/performance.md: no better BLEU, slower at batch 1; off)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    int8_path = out or fp32_path.with_suffix(".int8.onnx")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer's advice to pre-process is noise here
    try:
        quantize_dynamic(
            str(fp32_path),
            str(int8_path),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm"],
            per_channel=per_channel,
            # The fused decoder's contrib operators have no shape inference: their outputs'
            # type is unknown to the quantizer, and it is float.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        root.setLevel(level)
    return int8_path


def export_bundle(
    checkpoint: Path,
    out_dir: Path,
    int8: bool = False,
    serving_only: bool = False,
    description: str | None = None,
    decoder: str = "fused",
) -> dict:
    """Export a model directory to a bundle at out_dir (replaced atomically).
    `serving_only` leaves out the benchmark-only no-cache decoder (a smaller image).
    `description` (what the model was trained on, what it is for): by default the model
    directory's description.txt. `decoder`: how the step graph is made (see export_graphs)."""
    model, tokenizer = load_model_dir(checkpoint)
    config = model.config
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        files = export_graphs(model, staging, nocache=not serving_only, decoder=decoder)
        shortlist = _export_shortlist(model, Path(checkpoint), staging)
        if shortlist:
            files.append(shortlist["graph"])
        if int8:
            files += [quantize_graph(staging / name).name for name in files]
        if shortlist:
            files += [shortlist["file"], shortlist["projection"]]
        # Every tokenizer file under its own name, recorded by role ("source", "target", ...).
        tokenizer_files = {role: path.name for role, path in tokenizer.files.items()}
        for role, path in tokenizer.files.items():
            shutil.copyfile(path, staging / tokenizer_files[role])
        files += sorted(set(tokenizer_files.values()))
        manifest = {
            "format": BUNDLE_FORMAT,
            "name": f"{config.source_lang}-{config.target_lang}",
            "source_lang": config.source_lang,
            "target_lang": config.target_lang,
            "description": read_description(checkpoint) if description is None else description,
            "model": {
                "vocab_size": config.vocab_size,
                "d_model": config.d_model,
                "n_heads": config.n_heads,
                "head_dim": config.head_dim,
                "encoder_layers": config.encoder_layers,
                "decoder_layers": config.decoder_layers,
                "max_positions": config.max_positions,
            },
            "special_ids": {
                "pad": config.pad_id,
                "eos": config.eos_id,
                "unk": config.unk_id,
                "decoder_start": config.decoder_start_id,
            },
            # How the runtime must decode this model, beyond the length limit every bundle has.
            "decoding": {"force_eos_at_limit": config.force_eos_at_limit},
            "tokenizer": tokenizer_files,
            "graphs": {
                "encoder": "encoder.onnx",
                "decoder": "decoder.onnx",
                **({IN_PLACE_DECODER: IN_PLACE_FILE} if IN_PLACE_FILE in files else {}),
                **({} if serving_only else {"decoder_nocache": "decoder_nocache.onnx"}),
                **({"decoder_shortlist": shortlist["graph"]} if shortlist else {}),
            },
            "int8": int8,
            # The vocabulary shortlist (opt-in at serving time), when the model has one.
            **(
                {"shortlist": {k: shortlist[k] for k in ("file", "projection")}}
                if shortlist
                else {}
            ),
            "export": {
                "opset": OPSET,
                "decoder": decoder,
                "torch": torch.__version__,
                "onnx": onnx.__version__,
                "checkpoint": str(checkpoint),
            },
            "files": {name: sha256_of(staging / name) for name in sorted(files)},
        }
        (staging / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("exported %s to %s", checkpoint, out_dir)
    return manifest
