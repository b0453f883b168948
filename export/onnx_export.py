"""`nmt export`: a model directory -> an ONNX bundle the service can load without torch.

The bundle (see service/runtime/bundle.py for the reading side; nmt_contract.py for what
both sides agree on):
* `encoder.onnx`: source ids + mask -> the cross-attention keys and values of every decoder
  layer. The decoder never sees the encoder output itself: the source only enters a decoder
  step through these keys/values, so projecting them once here saves L*2 matmuls per step.
* `decoder.onnx`: one decoder step (export/fused_step.py) over self-attention caches written
  in place: buffers [rows, H, capacity, Dh] bound as both past and present, each row's cache
  the first `positions[row]` positions of its slot (rows of a running batch joined at
  different steps just have shorter caches). Outputs: the top_k log-probs of the next token
  and their ids [rows, k], best first (top_k = V gives the whole distribution), the alignment
  (last layer's cross-attention weights, head mean) [rows, S], every layer's weights head by
  head `attention_0`, `attention_1`, ... [rows, H, S], and the present keys/values.
* `decoder_shortlist.onnx` (when the model directory has a vocabulary shortlist): the same
  step scoring only the batch's candidate words, whose columns of the output projection
  (`output_projection.npy`; int8 with a scale per column for the int8 step) the runtime
  gathers.
* `*.int8.onnx`: the same graphs with dynamically quantized (int8) MatMul weights.
* the tokenizer files and `bundle.json` (dimensions, special ids, tokenizer files by role,
  checksums, export settings). `tokenizer` is {"source", "target"}: SentencePiece models,
  the same file for our joint model; plus "vocab" (piece -> id) for Hugging Face imports,
  and "target_vocab" for a model with separate vocabularies. `model.vocab_size` is the
  target vocabulary (what a decoder step scores), `model.source_vocab_size` the source's.
* a graph whose weights pass EXTERNAL_DATA_BYTES keeps them in one file beside it,
  `NAME.onnx.data` (ONNX's external data; ONNX Runtime reads it from there), listed with its
  checksum like any other file: a graph file is one protobuf message, which cannot pass
  2 GB, and the decoder steps of NLLB-200 and mBART-50 (a 256k-word embedding, as input and
  as output projection) do.
* for a multilingual model (M2M-100, NLLB, mBART-50), bundle.json's `languages`: its
  languages and their tokens, where the source's goes and that the target's is forced as the
  first token written (nmt_contract.Languages). Its `source_lang` and `target_lang` are then
  its default pair, and its `name` the model directory's.

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

from export.checkpoint import load_model_dir, read_description, read_languages
from export.fused_step import fused_decoder_step
from export.model.packing import Packing
from export.model.transformer import Transformer
from export.shortlist import quantize_columns
from nmt_contract import (
    BUNDLE_FORMAT,
    CONFIDENCE_FILE,
    SHORTLIST_FILE,
    Shortlist,
    layer_names,
    sha256_of,
)

log = logging.getLogger("nmt.export")

OPSET = 18
# Weights (bytes) above which a graph keeps them in NAME.onnx.data: well below protobuf's 2 GB,
# as a graph has more than its weights.
EXTERNAL_DATA_BYTES = 1 << 30


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, source_ids: torch.Tensor, source_mask: torch.Tensor) -> tuple:
        """source_ids [B, S] int64, source_mask [B, S] bool
        -> cross keys_0, values_0, keys_1, ... each [B, H, S, Dh]

        The layers skip the padding in most of their work (export/model/packing.py): a batch
        of sentences as they come is half padding, and this encoder takes 0.65x the time of
        one that computes it all (int8, AMD EPYC Zen 3: docs/performance.md, "Padding in
        the encoder")."""
        packing = Packing(source_mask)
        encoder_output = self.model.encode(source_ids, source_mask, packing)  # [B, S, D]
        cross = self.model.cross_keys_values(encoder_output)
        return tuple(tensor for pair in cross for tensor in pair)


def _example_sources(model: Transformer) -> tuple[torch.Tensor, torch.Tensor]:
    """Source ids and mask of a shape chosen so that no dynamic size is 0 or 1 (the tracer
    would fix those): 3 sources of 7 positions, one of them padded."""
    sources, length = 3, 7
    source_mask = torch.ones((sources, length), dtype=torch.bool)
    source_mask[1, 5:] = False
    return torch.randint(3, model.config.vocab_size, (sources, length)), source_mask


def _weight_bytes(model: onnx.ModelProto) -> int:
    return sum(len(tensor.raw_data) for tensor in model.graph.initializer)


def _save_graph(model: onnx.ModelProto, path: Path) -> None:
    """Write a graph, its weights in PATH.data when they are too many for one protobuf."""
    if _weight_bytes(model) > EXTERNAL_DATA_BYTES:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            convert_attribute=True,  # (Constant nodes' tensors too)
        )
    else:
        onnx.save_model(model, str(path))


def with_data_files(folder: Path, names: list[str]) -> list[str]:
    """Graph file names and, after each that has one, its external data file's."""
    return [
        found
        for name in names
        for found in (name, name + ".data")
        if found == name or (folder / found).is_file()
    ]


def _export(module: nn.Module, args: tuple, path: Path, names: dict, dynamic: dict) -> None:
    """torch.onnx.export into a folder of its own (past 2 GB it writes a file per weight),
    then the graph saved at `path` by _save_graph."""
    exported = path.with_name(path.name + ".export")
    exported.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter
        torch.onnx.export(
            module,
            args,
            str(exported / path.name),
            input_names=names["inputs"],
            output_names=names["outputs"],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    _save_graph(onnx.load(str(exported / path.name)), path)
    shutil.rmtree(exported)
    onnx.checker.check_model(str(path), full_check=True)


def export_graphs(model: Transformer, out_dir: Path) -> list[str]:
    """Write the fp32 graphs, the encoder and the decoder step (export/fused_step.py);
    returns their file names."""
    model.eval()
    cross_names = layer_names("cross", model.config.decoder_layers)
    by_source = {0: "sources", 1: "source"}  # [B/K, S]
    cross = {0: "sources", 2: "source"}  # [B/K, H, S, Dh]
    with torch.no_grad():
        _export(
            EncoderGraph(model),
            _example_sources(model),
            out_dir / "encoder.onnx",
            {"inputs": ["source_ids", "source_mask"], "outputs": cross_names},
            {"source_ids": by_source, "source_mask": by_source} | dict.fromkeys(cross_names, cross),
        )
    _save_fused_step(fused_decoder_step(model), out_dir / "decoder.onnx")
    return ["encoder.onnx", "decoder.onnx"]


def _save_fused_step(step: onnx.ModelProto, path: Path) -> None:
    _save_graph(step, path)
    onnx.checker.check_model(str(path))  # no full check: ONNX has no schemas for contrib ops


def _export_shortlist(
    model: Transformer, checkpoint: Path, out_dir: Path, int8: bool
) -> dict | None:
    """When the model directory has a shortlist (`nmt shortlist`): the shortlist itself, the
    output projection [D, V] the runtime gathers a batch's candidate columns from, and the
    decoder step that scores only them; with `int8`, also the projection quantized a column
    at a time (int8 [D, V] and scales [V]) and the int8 step that reads it. None without
    one."""
    if not (checkpoint / SHORTLIST_FILE).is_file():
        return None
    vocab_size = model.config.vocab_size
    if not model.config.share_encoder_decoder_embeddings:
        raise ValueError(
            f"{checkpoint} has a shortlist, but separate source and target vocabularies: "
            "shortlists are for models with one shared vocabulary; remove it"
        )
    if not Shortlist.load(checkpoint / SHORTLIST_FILE).fits(vocab_size):
        raise ValueError(
            f"{checkpoint / SHORTLIST_FILE} does not fit this model's {vocab_size} words "
            "(built for another vocabulary?): rebuild it with `nmt shortlist`"
        )
    shutil.copyfile(checkpoint / SHORTLIST_FILE, out_dir / SHORTLIST_FILE)
    projection = model.output_projection().detach().T.contiguous().numpy()  # [D, V]
    entry = {"file": SHORTLIST_FILE, "projection": "output_projection.npy"}
    _save_array(projection, out_dir / entry["projection"])
    graph = "decoder_shortlist.onnx"
    _save_fused_step(fused_decoder_step(model, shortlist=True), out_dir / graph)
    if int8:
        quantized, scale = quantize_columns(projection)
        entry |= {
            "projection_int8": "output_projection.int8.npy",
            "projection_scale": "output_projection_scale.npy",
        }
        _save_array(quantized, out_dir / entry["projection_int8"])
        _save_array(scale, out_dir / entry["projection_scale"])
        # The int8 step is not the float one quantized: its output projection is an int8
        # input. Its other matmuls' weights are quantized as every graph's are.
        source = out_dir / "decoder_shortlist.int8-source.onnx"
        _save_fused_step(fused_decoder_step(model, True, int8_projection=True), source)
        quantize_graph(source, out_dir / graph.replace(".onnx", ".int8.onnx"))
        for leftover in (source, source.with_name(source.name + ".data")):
            leftover.unlink(missing_ok=True)
    return entry | {"graph": graph}


# A bundle's shortlist files, by their keys in bundle.json's "shortlist" (the int8 ones only
# in a bundle exported with --int8).
SHORTLIST_FILES = ("file", "projection", "projection_int8", "projection_scale")


def _save_array(array: np.ndarray, path: Path) -> None:
    with open(path, "wb") as f:
        np.save(f, array)


def quantize_graph(fp32_path: Path, out: Path | None = None, per_channel: bool = False) -> Path:
    """Dynamic int8 quantization of the MatMul weights, into `out` (by default beside the
    graph, as NAME.int8.onnx). The activations are quantized at every run from their own
    range. `per_channel`: a scale per output column of each weight matrix instead of one per
    matrix (measured in docs/performance.md: no better BLEU, slower at batch 1; off)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    int8_path = out or fp32_path.with_suffix(".int8.onnx")
    external = fp32_path.with_name(fp32_path.name + ".data").is_file()
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
            use_external_data_format=external,  # (then in INT8_PATH.data)
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
    description: str | None = None,
) -> dict:
    """Export a model directory to a bundle at out_dir (replaced atomically).
    `description` (what the model was trained on, what it is for): by default the model
    directory's description.txt."""
    model, tokenizer = load_model_dir(checkpoint)
    config = model.config
    languages = read_languages(checkpoint)
    bundle_name = f"{config.source_lang}-{config.target_lang}"
    if languages is not None:  # one bundle, many pairs: named after the model
        bundle_name = Path(checkpoint).resolve().name
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        files = export_graphs(model, staging)
        if int8:
            files += [quantize_graph(staging / name).name for name in files]
        shortlist = _export_shortlist(model, Path(checkpoint), staging, int8)
        if shortlist:
            graph = shortlist["graph"]
            files += [graph, graph.replace(".onnx", ".int8.onnx")] if int8 else [graph]
        files = with_data_files(staging, files)
        for file in files:  # (ONNX writes external data readable by its owner only)
            if file.endswith(".data"):
                shutil.copymode(staging / file.removesuffix(".data"), staging / file)
        if shortlist:
            files += [shortlist[key] for key in SHORTLIST_FILES if key in shortlist]
        # Every tokenizer file under its own name, recorded by role ("source", "target", ...).
        tokenizer_files = {role: path.name for role, path in tokenizer.files.items()}
        for role, path in tokenizer.files.items():
            shutil.copyfile(path, staging / tokenizer_files[role])
        files += sorted(set(tokenizer_files.values()))
        manifest = {
            "format": BUNDLE_FORMAT,
            "name": bundle_name,
            "source_lang": config.source_lang,
            "target_lang": config.target_lang,
            "description": read_description(checkpoint) if description is None else description,
            "model": {
                "vocab_size": config.target_vocab_size,
                "source_vocab_size": config.vocab_size,
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
            **({"languages": languages.to_manifest()} if languages is not None else {}),
            "graphs": {
                "encoder": "encoder.onnx",
                "decoder": "decoder.onnx",
                **({"decoder_shortlist": shortlist["graph"]} if shortlist else {}),
            },
            "int8": int8,
            # The vocabulary shortlist (opt-in at serving time), when the model has one.
            **(
                {"shortlist": {k: shortlist[k] for k in SHORTLIST_FILES if k in shortlist}}
                if shortlist
                else {}
            ),
            "export": {
                "opset": OPSET,
                "torch": torch.__version__,
                "onnx": onnx.__version__,
                "checkpoint": str(checkpoint),
            },
            "files": {name: sha256_of(staging / name) for name in sorted(files)},
        }
        (staging / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if (Path(checkpoint) / CONFIDENCE_FILE).is_file():  # its calibration (nmt calibrate)
            shutil.copyfile(Path(checkpoint) / CONFIDENCE_FILE, staging / CONFIDENCE_FILE)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("exported %s to %s", checkpoint, out_dir)
    return manifest
