"""`nmt export`: a model directory -> an ONNX bundle the service can load without torch.

The bundle (see service/bundle.py for the reading side):
* `encoder.onnx`: source ids + mask -> the cross-attention keys and values of every decoder
  layer. The decoder never sees the encoder output itself: the source only enters a decoder
  step through these keys/values, so projecting them once here saves L*2 matmuls per step.
* `decoder.onnx`: one step with a self-attention KV cache (grows by one position a step).
* `decoder_nocache.onnx`: recomputes the whole target prefix each step; for benchmarks only,
  so that what the cache buys is measured rather than assumed.
* `*.int8.onnx`: the same graphs with dynamically quantized (int8) MatMul weights.
* the tokenizer files and `bundle.json` (dimensions, special ids, tokenizer files by role,
  checksums, export settings). `tokenizer` is {"source", "target"}: SentencePiece models,
  the same file for our joint model; plus "vocab" (piece -> id) for Marian imports.

All caches are stacked over layers, so that the engine reorders one array per step (beam
search) instead of one per layer: [L, B, H, length, Dh].
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

from export.checkpoint import load_model_dir
from export.model.transformer import Transformer

log = logging.getLogger("nmt.export")

OPSET = 18
BUNDLE_FORMAT = 2  # 2: decoder graphs select the top-k in the graph


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, source_ids: torch.Tensor, source_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """source_ids [B, S] int64, source_mask [B, S] bool -> cross keys/values [L, B, H, S, Dh]"""
        encoder_output = self.model.encode(source_ids, source_mask)  # [B, S, D]
        cross = self.model.cross_keys_values(encoder_output)
        return torch.stack([k for k, _ in cross]), torch.stack([v for _, v in cross])


def _per_layer(keys: torch.Tensor, values: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Stacked [L, B, H, len, Dh] keys and values -> one (keys, values) pair per layer."""
    return list(zip(keys.unbind(0), values.unbind(0), strict=True))


def _log_probs_and_top(logits: torch.Tensor, top_k: torch.Tensor):
    """logits [B, T, V] -> log-probs of the next token [B, V] and their top_k [B, k].

    Selecting in the graph means a step hands back [B, k] instead of [B, V] to the engine:
    greedy asks for k = 1, beam search for k = 2 * beam (enough: a sentence's 2K best
    continuations are always among its beams' own 2K best tokens).
    """
    log_probs = torch.log_softmax(logits[:, -1], dim=-1)
    top_log_probs, top_ids = torch.topk(log_probs, top_k, dim=-1)
    return log_probs, top_log_probs, top_ids


class DecoderStepGraph(nn.Module):
    """One decoding step with the self-attention cache."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        target_ids: torch.Tensor,  # [B, 1] the last token of every row
        past_keys: torch.Tensor,  # [L, B, H, P, Dh] (P = 0 at the first step)
        past_values: torch.Tensor,  # [L, B, H, P, Dh]
        cross_keys: torch.Tensor,  # [L, B, H, S, Dh] from encoder.onnx
        cross_values: torch.Tensor,  # [L, B, H, S, Dh]
        source_mask: torch.Tensor,  # [B, S] bool
        top_k: torch.Tensor,  # int64 scalar: how many best tokens to return per row
    ) -> tuple[torch.Tensor, ...]:
        past, cross = _per_layer(past_keys, past_values), _per_layer(cross_keys, cross_values)
        logits, present, alignment = self.model.decode(target_ids, past, cross, source_mask)
        log_probs, top_log_probs, top_ids = _log_probs_and_top(logits, top_k)
        present_keys = torch.stack([k for k, _ in present])  # [L, B, H, P+1, Dh]
        present_values = torch.stack([v for _, v in present])
        # alignment: the cross-attention weights of this step [B, S]
        return log_probs, top_log_probs, top_ids, present_keys, present_values, alignment[:, -1]


class DecoderNoCacheGraph(nn.Module):
    """The whole target prefix every step, no self-attention cache (benchmarks only)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        target_ids: torch.Tensor,  # [B, T] the whole prefix, start token first
        cross_keys: torch.Tensor,
        cross_values: torch.Tensor,
        source_mask: torch.Tensor,
        top_k: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        empty = cross_keys[:, :, :, :0]  # [L, B, H, 0, Dh]
        past, cross = _per_layer(empty, empty), _per_layer(cross_keys, cross_values)
        logits, _, _ = self.model.decode(target_ids, past, cross, source_mask)
        return _log_probs_and_top(logits, top_k)


def _example_inputs(model: Transformer) -> dict[str, torch.Tensor]:
    """Shapes chosen so that no dynamic size is 0 or 1 (the tracer would fix those)."""
    config = model.config
    batch, source, past, target = 3, 7, 4, 5
    cache = (config.decoder_layers, batch, config.n_heads, past, config.head_dim)
    cross = (config.decoder_layers, batch, config.n_heads, source, config.head_dim)
    source_mask = torch.ones((batch, source), dtype=torch.bool)
    source_mask[1, 5:] = False
    return {
        "source_ids": torch.randint(3, config.vocab_size, (batch, source)),
        "source_mask": source_mask,
        "target_step": torch.randint(3, config.vocab_size, (batch, 1)),
        "target_prefix": torch.randint(3, config.vocab_size, (batch, target)),
        "past_keys": torch.randn(cache),
        "past_values": torch.randn(cache),
        "cross_keys": torch.randn(cross),
        "cross_values": torch.randn(cross),
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


def export_graphs(model: Transformer, out_dir: Path) -> list[str]:
    """Write the fp32 graphs; returns their file names."""
    model.eval()
    x = _example_inputs(model)
    rows_by_source = {0: "batch", 1: "source"}
    cross = {1: "batch", 3: "source"}
    past = {1: "batch", 3: "past"}
    present = {1: "batch", 3: "past_plus_one"}
    top = {0: "batch", 1: "k"}
    with torch.no_grad():
        _export(
            EncoderGraph(model),
            (x["source_ids"], x["source_mask"]),
            out_dir / "encoder.onnx",
            {"inputs": ["source_ids", "source_mask"], "outputs": ["cross_keys", "cross_values"]},
            {
                "source_ids": rows_by_source,
                "source_mask": rows_by_source,
                "cross_keys": cross,
                "cross_values": cross,
            },
        )
        step_inputs = ["target_ids", "past_keys", "past_values", "cross_keys", "cross_values"]
        step_inputs += ["source_mask", "top_k"]
        _export(
            DecoderStepGraph(model),
            tuple(x[name] for name in ["target_step", *step_inputs[1:]]),
            out_dir / "decoder.onnx",
            {
                "inputs": step_inputs,
                "outputs": [
                    "log_probs",
                    "top_log_probs",
                    "top_ids",
                    "present_keys",
                    "present_values",
                    "alignment",
                ],
            },
            {
                "target_ids": {0: "batch"},
                "past_keys": past,
                "past_values": past,
                "cross_keys": cross,
                "cross_values": cross,
                "source_mask": rows_by_source,
                "log_probs": {0: "batch"},
                "top_log_probs": top,
                "top_ids": top,
                "present_keys": present,
                "present_values": present,
                "alignment": rows_by_source,
            },
        )
        _export(
            DecoderNoCacheGraph(model),
            tuple(
                x[name]
                for name in ["target_prefix", "cross_keys", "cross_values", "source_mask", "top_k"]
            ),
            out_dir / "decoder_nocache.onnx",
            {
                "inputs": ["target_ids", "cross_keys", "cross_values", "source_mask", "top_k"],
                "outputs": ["log_probs", "top_log_probs", "top_ids"],
            },
            {
                "target_ids": {0: "batch", 1: "target"},
                "cross_keys": cross,
                "cross_values": cross,
                "source_mask": rows_by_source,
                "log_probs": {0: "batch"},
                "top_log_probs": top,
                "top_ids": top,
            },
        )
    return ["encoder.onnx", "decoder.onnx", "decoder_nocache.onnx"]


def quantize_graph(fp32_path: Path) -> Path:
    """Dynamic int8 quantization of the MatMul weights (activations stay float)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    int8_path = fp32_path.with_suffix(".int8.onnx")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer's advice to pre-process is noise here
    try:
        quantize_dynamic(
            str(fp32_path),
            str(int8_path),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm"],
            per_channel=False,
        )
    finally:
        root.setLevel(level)
    return int8_path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def export_bundle(checkpoint: Path, out_dir: Path, int8: bool = False) -> dict:
    """Export a model directory to a bundle at out_dir (replaced atomically)."""
    model, tokenizer = load_model_dir(checkpoint)
    config = model.config
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        files = export_graphs(model, staging)
        if int8:
            files += [quantize_graph(staging / name).name for name in files]
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
            "tokenizer": tokenizer_files,
            "graphs": {
                "encoder": "encoder.onnx",
                "decoder": "decoder.onnx",
                "decoder_nocache": "decoder_nocache.onnx",
            },
            "int8": int8,
            "export": {
                "opset": OPSET,
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
