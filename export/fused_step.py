"""The decoder step graph built node by node from ONNX Runtime's fused CPU operators.

`torch.onnx.export` of the textbook step writes every reshape, transpose and mask as its own
node: about 230 nodes a step after ONNX Runtime's optimizations, each costing a kernel launch,
at batch 1 a good share of a step (docs/performance.md). This module writes the same step with
the operators ONNX Runtime ships fused for transformers (`com.microsoft` domain), from the
same weights:

* self-attention is one `GroupQueryAttention` node (as many key/value heads as query heads:
  plain multi-head attention) over caches written in place: each row's past keys and values
  sit at the start of its own slot of a buffer [B, H, capacity, Dh], and the node writes the
  new position's key and value at the row's position, into the buffer itself (see
  service/runtime/kv_cache.py for the runtime's side).
* cross-attention is one `MultiHeadAttention` node: splits heads, scores against the source's
  keys (computed once per sentence by the encoder graph), masks, softmax, mixes the values and
  merges heads. Its `qk` output (scaled, masked scores) gives the cross-attention weights
  through one Softmax.
* one matmul projects the queries, keys and values of self-attention together ([D, 3D]
  weights): one pass over the input instead of three (and, in int8, one quantization of it).
* not `SkipLayerNormalization` (the residual, a bias and the post-norm in one node): its CPU
  kernel is slower than the three nodes it replaces once a batch has more than a few rows.

Inputs: target_ids [B, 1], source_mask [B/K, S], top_k, positions [B] (each row's cache
length), forced_ids [B, F], past_* buffers and cross_* keys/values; with a shortlist also
vocabulary [C] and output_projection [D, C] (int8, with output_projection_scale [C], in the
int8 bundle's step). Outputs: top_log_probs and top_ids [B, k],
forced_log_probs [B, F] (the log-probs of the words forced_ids names: what a constrained
search scores), alignment [B, S], attention_i [B, H, S] and present_* (the same buffers).
The model's family options (export/model/config.py) are the same nodes in another order:
pre-norm normalizes each sub-layer's input instead of the residual sum (_sublayer_input,
_residual), and the embedding and final LayerNorms, the position table and the output
projection are whichever the model has. Tests hold this graph to the torch model
(tests/export/test_fused_step.py), for every family's options.

Shapes: B rows, K rows per source (beams), S source length, D model width, H heads,
Dh = D / H, V vocabulary, C candidate words, L layers.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from export.model.transformer import DecoderLayer, Transformer
from nmt_contract import attention_output_names, layer_names

MS = "com.microsoft"  # ONNX Runtime's contrib operators
ONE = np.array([1], dtype=np.int64)  # the shape of TopK's k


class _Graph:
    """Nodes and initializers, with fresh names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, name: str, value: np.ndarray | torch.Tensor) -> str:
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], **attributes) -> list[str]:
        domain = attributes.pop("domain", "")
        name = f"{op}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, outputs, name, domain=domain, **attributes))
        return outputs

    def one(self, op: str, inputs: list[str], output: str, **attributes) -> str:
        return self.node(op, inputs, [output], **attributes)[0]


def _weight(linear: torch.nn.Linear) -> np.ndarray:
    """torch's [out, in] -> MatMul's [in, out]"""
    return linear.weight.detach().T.numpy()


def _layer(
    g: _Graph, i: int, layer: DecoderLayer, x: str, masks: dict[str, str], shapes: dict[str, str]
) -> str:
    """One decoder layer over one new position per row: x [B, 1, D] -> [B, 1, D]."""
    p = f"layer{i}"
    heads = layer.self_attn.n_heads
    pre_norm = layer.pre_norm

    # Self-attention. The new position's query, key and value in one matmul: [B, 1, 3D].
    attn = layer.self_attn
    qkv_weight = np.concatenate(
        [_weight(attn.q_proj), _weight(attn.k_proj), _weight(attn.v_proj)], 1
    )
    h = _sublayer_input(g, x, layer.self_attn_layer_norm, f"{p}.self", pre_norm)
    qkv = g.one("MatMul", [h, g.constant(f"{p}.self.qkv.weight", qkv_weight)], f"{p}.self.qkv")
    qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
    mixed = _self_attention(g, i, heads, qkv, qkv_bias, masks)
    out = g.one(
        "MatMul",
        [mixed, g.constant(f"{p}.self.out.weight", _weight(attn.out_proj))],
        f"{p}.self.out",
    )
    x = _residual(g, out, attn.out_proj.bias, x, layer.self_attn_layer_norm, f"{p}.self", pre_norm)

    # Cross-attention: queries from the target, keys/values of the source from encoder.onnx.
    # The K rows of a source are K queries against its one copy: [B, 1, D] -> [B/K, K, D].
    attn = layer.cross_attn
    h = _sublayer_input(g, x, layer.cross_attn_layer_norm, f"{p}.cross", pre_norm)
    q = g.one(
        "MatMul",
        [h, g.constant(f"{p}.cross.q.weight", _weight(attn.q_proj))],
        f"{p}.cross.q_nobias",
    )
    q = g.one("Add", [q, g.constant(f"{p}.cross.q.bias", attn.q_proj.bias)], f"{p}.cross.q")
    q = g.one("Reshape", [q, shapes["by_source"]], f"{p}.cross.q_by_source")
    mixed, _, _, scores = g.node(
        "MultiHeadAttention",
        [q, f"cross_keys_{i}", f"cross_values_{i}", "", masks["source"]],
        [f"{p}.cross.mixed_by_source", "", "", f"{p}.cross.scores"],
        domain=MS,
        num_heads=heads,
    )  # mixed [B/K, K, D]; scores (scaled, masked) [B/K, H, K, S]
    mixed = g.one("Reshape", [mixed, shapes["by_row"]], f"{p}.cross.mixed")  # [B, 1, D]
    out = g.one(
        "MatMul",
        [mixed, g.constant(f"{p}.cross.out.weight", _weight(attn.out_proj))],
        f"{p}.cross.out",
    )
    norm = layer.cross_attn_layer_norm
    x = _residual(g, out, attn.out_proj.bias, x, norm, f"{p}.cross", pre_norm)
    # This layer's cross-attention weights, each row's own: [B/K, H, K, S] -> [B, H, S]
    weights = g.one("Softmax", [scores], f"{p}.cross.weights", axis=-1)
    weights = g.one("Transpose", [weights], f"{p}.cross.weights_by_row", perm=[0, 2, 1, 3])
    g.one("Reshape", [weights, shapes["weights"]], f"attention_{i}")

    # Feed-forward.
    ffn = layer.ffn
    h = _sublayer_input(g, x, layer.final_layer_norm, f"{p}.ffn", pre_norm)
    hidden = g.one("MatMul", [h, g.constant(f"{p}.fc1.weight", _weight(ffn.fc1))], f"{p}.fc1")
    hidden = g.one("Add", [hidden, g.constant(f"{p}.fc1.bias", ffn.fc1.bias)], f"{p}.fc1_bias")
    hidden = _activation(g, ffn.activation.__name__, hidden, f"{p}.activation")
    out = g.one("MatMul", [hidden, g.constant(f"{p}.fc2.weight", _weight(ffn.fc2))], f"{p}.fc2")
    return _residual(g, out, ffn.fc2.bias, x, layer.final_layer_norm, f"{p}.ffn", pre_norm)


def _self_attention(
    g: _Graph, i: int, heads: int, qkv: str, qkv_bias: torch.Tensor, masks: dict[str, str]
) -> str:
    """Self-attention over a cache that stays where it is: each row's keys/values sit at the
    start of its own slot of a buffer [B, H, C, Dh] (C: the buffer's capacity), its first
    cache_lengths[b] positions real, whatever follows them unread. GroupQueryAttention (with
    as many key/value heads as query heads: plain multi-head attention) writes the new
    position's key and value at cache_lengths[b] and attends to the first cache_lengths[b] + 1.
    The engine binds past and present to the same buffer, so nothing else is copied, and a
    row's cache never holds padding: rows that joined later just have shorter caches.
    qkv [B, 1, 3D] -> [B, 1, D]."""
    p = f"layer{i}"
    qkv = g.one("Add", [qkv, g.constant(f"{p}.self.qkv.bias", qkv_bias)], f"{p}.self.qkv_biased")
    return g.node(
        "GroupQueryAttention",
        [
            qkv,  # packed: queries, keys and values of the new position
            "",
            "",
            f"past_keys_{i}",
            f"past_values_{i}",
            masks["cache_lengths"],
            masks["total_length"],
        ],
        [f"{p}.self.mixed", f"present_keys_{i}", f"present_values_{i}"],
        domain=MS,
        num_heads=heads,
        kv_num_heads=heads,
    )[0]


def _sublayer_input(g: _Graph, x: str, norm: torch.nn.LayerNorm, p: str, pre_norm: bool) -> str:
    """What a sub-layer reads: x (post-norm), or LayerNorm(x) (pre-norm)."""
    return _layer_norm(g, x, norm, f"{p}.pre") if pre_norm else x


def _residual(
    g: _Graph,
    out: str,
    bias: torch.Tensor,
    residual: str,
    norm: torch.nn.LayerNorm,
    p: str,
    pre_norm: bool,
) -> str:
    """residual + out + bias, out being a sub-layer's projection; post-norm normalizes the sum
    (LayerNorm(residual + out + bias)), pre-norm leaves it as it is.

    Written as Add, Add, LayerNormalization rather than ONNX Runtime's fused
    SkipLayerNormalization: at 128 rows its CPU kernel was measured 3x slower than the three
    nodes (240 vs 73 us, docs/performance.md). The engine turns off the optimizer that would
    fuse them back (SkipLayerNormFusion)."""
    out = g.one("Add", [out, g.constant(f"{p}.out.bias", bias)], f"{p}.out_biased")
    total = g.one("Add", [out, residual], f"{p}.residual")
    return total if pre_norm else _layer_norm(g, total, norm, p)


def _layer_norm(g: _Graph, x: str, norm: torch.nn.LayerNorm, p: str) -> str:
    return g.one(
        "LayerNormalization",
        [x, g.constant(f"{p}.norm.weight", norm.weight), g.constant(f"{p}.norm.bias", norm.bias)],
        f"{p}.normed",
        axis=-1,
        epsilon=norm.eps,
    )


def _activation(g: _Graph, name: str, x: str, out: str) -> str:
    if name == "relu":
        return g.one("Relu", [x], out)
    if name == "gelu":  # torch's exact (erf) GELU
        return g.one("Gelu", [x], out, domain=MS)
    if name == "silu":  # swish: x * sigmoid(x)
        return g.one("Mul", [x, g.one("Sigmoid", [x], out + ".sigmoid")], out)
    raise ValueError(f"no fused graph for the activation {name!r}")


def _top_k(g: _Graph, model: Transformer, x: str) -> None:
    """Output projection (the embedding matrix, shared), log-softmax and the top k:
    x [B, D] -> top_log_probs, top_ids [B, k]."""
    logits = g.one(
        "MatMul",
        [x, g.constant("output_projection", model.output_projection().detach().T)],
        "logits",
    )  # [B, V]
    if bool(model.final_logits_bias.any()):
        bias = g.constant("final_logits_bias", model.final_logits_bias)
        logits = g.one("Add", [logits, bias], "logits_biased")
    log_probs = g.one("LogSoftmax", [logits], "log_probs", axis=-1)
    k = g.one("Reshape", ["top_k", g.constant("shape_one", ONE)], "top_k_1d")
    g.node("TopK", [log_probs, k], ["top_log_probs", "top_ids"], axis=-1)
    _forced(g, log_probs)


def _forced(g: _Graph, log_probs: str) -> None:
    """The log-probs of words the caller names, forced_ids [B, F] (vocabulary positions of
    log_probs) -> forced_log_probs [B, F]: what a constrained search needs of the words a
    term continues with, which the top k seldom holds. A gather of F numbers a row."""
    g.one("GatherElements", [log_probs, "forced_ids"], "forced_log_probs", axis=1)


def _shortlisted_top_k(g: _Graph, model: Transformer, x: str, int8: bool) -> None:
    """The same over a vocabulary shortlist: only the C candidate words of the batch's
    sentences (input `vocabulary` [C], ascending ids) are scored, with their columns of the
    output projection (input `output_projection` [D, C], gathered by the engine once per
    batch, not per step). Log-probs are normalized over the candidates, as Marian's and
    CTranslate2's shortlists do; top_ids are vocabulary ids again.

    `int8`: the columns come quantized, int8 [D, C] with a scale per column
    (`output_projection_scale` [C], export/shortlist.py), and one DynamicQuantizeMatMul
    multiplies them, as the int8 graphs' other matmuls do. A float input matrix costs
    MLAS a packing of [D, C] floats per run: 4x the int8 product at 32 rows and 1,730
    candidates (docs/performance.md)."""
    if int8:
        logits = g.one(
            "DynamicQuantizeMatMul",
            [x, "output_projection", "output_projection_scale"],
            "logits",
            domain=MS,
        )  # [B, C]
    else:
        logits = g.one("MatMul", [x, "output_projection"], "logits")  # [B, C]
    if bool(model.final_logits_bias.any()):
        table = g.constant("final_logits_bias", model.final_logits_bias)
        bias = g.one("Gather", [table, "vocabulary"], "candidate_logits_bias")
        logits = g.one("Add", [logits, bias], "logits_biased")
    log_probs = g.one("LogSoftmax", [logits], "log_probs", axis=-1)
    k = g.one("Reshape", ["top_k", g.constant("shape_one", ONE)], "top_k_1d")
    g.node("TopK", [log_probs, k], ["top_log_probs", "top_candidates"], axis=-1)
    g.one("Gather", ["vocabulary", "top_candidates"], "top_ids")  # [B, k] vocabulary ids
    _forced(g, log_probs)  # (forced_ids are positions among the candidates here)


def fused_decoder_step(
    model: Transformer, shortlist: bool = False, int8_projection: bool = False
) -> onnx.ModelProto:
    """The decoder step of `model` (see the module docstring) as an ONNX model. `shortlist`:
    the step of a vocabulary shortlist (see _shortlisted_top_k), with two more inputs;
    `int8_projection`: its candidates' columns come quantized, with a third input (their
    scales)."""
    config = model.config
    g = _Graph()
    dims = config.d_model
    int64 = lambda name, values: g.constant(name, np.array(values, dtype=np.int64))  # noqa: E731

    # Masks, int32 as MultiHeadAttention reads them (1 = attend).
    masks = {"source": g.one("Cast", ["source_mask"], "source_mask_int", to=TensorProto.INT32)}
    # A row's cache holds its `positions` past tokens, from the start of its slot:
    # GroupQueryAttention's seqlens_k [B] and the longest (past + new) over the rows.
    lengths = g.one("Cast", ["positions"], "cache_lengths", to=TensorProto.INT32)
    longest = g.one("ReduceMax", [lengths], "longest_cache", keepdims=0)
    one = g.constant("one_int", np.array(1, dtype=np.int32))
    masks["cache_lengths"] = lengths
    masks["total_length"] = g.one("Add", [longest, one], "total_length")
    sources = g.one("Shape", ["source_mask"], "sources", start=0, end=1)
    source_length = g.one("Shape", ["source_mask"], "source_length", start=1, end=2)
    shapes = {
        "by_source": g.one(
            "Concat", [sources, int64("rows_per_source", [-1, dims])], "shape_by_source", axis=0
        ),  # [B/K, K, D]
        "by_row": int64("shape_by_row", [-1, 1, dims]),
        "weights": g.one(
            "Concat",
            [int64("rows_heads", [-1, config.n_heads]), source_length],
            "shape_weights",
            axis=0,
        ),  # [B, H, S]
    }

    # Embedding of the last token at each row's own position: [B, 1, D]
    scale = model.embed_scale
    embeddings = model.token_embeddings("decoder").weight.detach() * scale
    tokens = g.one("Gather", [g.constant("embeddings_scaled", embeddings), "target_ids"], "tokens")
    row_positions = g.one("Unsqueeze", ["positions", int64("axis_1", [1])], "row_positions")
    table = g.constant("position_table", model.position_table("decoder"))
    where = g.one("Gather", [table, row_positions], "position_signal")
    x = g.one("Add", [tokens, where], "embedded")
    if (norm := model.embedding_norm("decoder")) is not None:
        x = _layer_norm(g, x, norm, "embedding")

    for i, layer in enumerate(model.decoder_layers):
        x = _layer(g, i, layer, x, masks, shapes)
    if (norm := model.stack_norm("decoder")) is not None:
        x = _layer_norm(g, x, norm, "decoder")

    x = g.one("Reshape", [x, int64("shape_rows", [-1, dims])], "last_state")  # [B, D]
    if shortlist:
        _shortlisted_top_k(g, model, x, int8_projection)
    else:
        _top_k(g, model, x)
    last = attention_output_names(config.decoder_layers)[-1]
    g.one("ReduceMean", [last, int64("axis_heads", [1])], "alignment", keepdims=0)

    inputs = _inputs(config)
    if shortlist:
        projection_type = TensorProto.INT8 if int8_projection else TensorProto.FLOAT
        inputs += [
            helper.make_tensor_value_info("vocabulary", TensorProto.INT64, ["candidates"]),
            helper.make_tensor_value_info(
                "output_projection", projection_type, [dims, "candidates"]
            ),
        ]
        if int8_projection:
            inputs.append(
                helper.make_tensor_value_info(
                    "output_projection_scale", TensorProto.FLOAT, ["candidates"]
                )
            )
    outputs = _outputs(config)
    graph = helper.make_graph(g.nodes, "decoder_step", inputs, outputs, g.initializers)
    # MultiHeadAttention's qk output may be another float type than its inputs: say which,
    # and its rank (a provider that infers shapes itself, OpenVINO's, reads "no shape" as a
    # scalar and then fails at the Transpose of the weights).
    scores_shape = ["sources", config.n_heads, "rows_per_source", "source"]  # [B/K, H, K, S]
    graph.value_info.extend(
        helper.make_tensor_value_info(f"layer{i}.cross.scores", TensorProto.FLOAT, scores_shape)
        for i in range(config.decoder_layers)
    )
    model_proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)],
        ir_version=9,
        producer_name="nmt export (fused step)",
    )
    return model_proto


def _inputs(config) -> list[onnx.ValueInfoProto]:
    f32, i64, flag = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    heads, head_dim = config.n_heads, config.head_dim
    info = helper.make_tensor_value_info
    layers = config.decoder_layers
    return [
        info("target_ids", i64, ["batch", 1]),
        info("source_mask", flag, ["sources", "source"]),
        info("top_k", i64, []),
        info("positions", i64, ["batch"]),
        info("forced_ids", i64, ["batch", "forced"]),
        *(
            info(n, f32, ["batch", heads, "capacity", head_dim])
            for n in layer_names("past", layers)
        ),
        *(
            info(n, f32, ["sources", heads, "source", head_dim])
            for n in layer_names("cross", layers)
        ),
    ]


def _outputs(config) -> list[onnx.ValueInfoProto]:
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    heads, head_dim = config.n_heads, config.head_dim
    info = helper.make_tensor_value_info
    layers = config.decoder_layers
    return [
        info("top_log_probs", f32, ["batch", "k"]),
        info("top_ids", i64, ["batch", "k"]),
        info("forced_log_probs", f32, ["batch", "forced"]),
        info("alignment", f32, ["batch", "source"]),
        *(info(n, f32, ["batch", heads, "source"]) for n in attention_output_names(layers)),
        *(
            info(n, f32, ["batch", heads, "capacity", head_dim])
            for n in layer_names("present", layers)
        ),
    ]
