"""The fused decoder step (export/fused_step.py) against the torch model, step by step.

The engine-level tests in tests/runtime/test_engine.py decode through the bundle `nmt export`
writes; these look at one step's every output directly, for each activation a model may use
(Marian imports use swish) and each family's shape (tests/export/shapes.py), with beams sharing
a source, a row with a shorter cache (it joined later) in a longer buffer, and an empty cache
(the first step)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from export.fused_step import fused_decoder_step  # noqa: E402
from export.model.config import ModelConfig  # noqa: E402
from export.model.transformer import Transformer  # noqa: E402
from nmt_contract import attention_output_names, layer_names  # noqa: E402
from service.runtime.sessions import DISABLED_OPTIMIZERS, EngineOptions, session_options  # noqa: E402
from tests.export.shapes import FAMILY_SHAPES, family_options  # noqa: E402

LAYERS, HEADS, HEAD_DIM = 2, 4, 16


def random_model(activation: str, seed: int, family: str = "marian") -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(
        **({"activation": activation} | family_options(family, vocab=300)),
        d_model=HEADS * HEAD_DIM,
        n_heads=HEADS,
        ffn_dim=96,
        encoder_layers=1,
        decoder_layers=LAYERS,
        dropout=0.0,
    )
    model = Transformer(config).eval()
    # Every parameter random, biases and layer norms too (initialization leaves them 0 and 1,
    # which would hide a bias or a norm weight wired to the wrong place).
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
        model.final_logits_bias.normal_(0.0, 0.5)
    return model


def session(model: Transformer):
    proto = fused_decoder_step(model)
    return ort.InferenceSession(
        proto.SerializeToString(),
        session_options(EngineOptions(intra_op_threads=1)),
        providers=["CPUExecutionProvider"],
        disabled_optimizers=DISABLED_OPTIMIZERS,
    )


def step_inputs(sources: int, rows_per_source: int, past: int, source: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    rows = sources * rows_per_source
    source_mask = np.ones((sources, source), dtype=bool)
    source_mask[0, source // 2 :] = False  # a shorter sentence, padded
    past_mask = np.ones((rows, past), dtype=bool)
    if past > 2:
        past_mask[rows - 1, : past - 2] = False  # a row that joined past - 2 steps later
    feeds = {
        "target_ids": rng.integers(3, 300, (rows, 1)),
        "source_mask": source_mask,
        "top_k": np.array(7),
        "past_mask": past_mask,
        "positions": past_mask.sum(axis=1).astype(np.int64),
        "forced_ids": rng.integers(0, 300, (rows, 3)),
    }
    for name in layer_names("past", LAYERS):
        feeds[name] = rng.standard_normal((rows, HEADS, past, HEAD_DIM), dtype=np.float32)
    for name in layer_names("cross", LAYERS):
        feeds[name] = rng.standard_normal((sources, HEADS, source, HEAD_DIM), dtype=np.float32)
    return feeds


def torch_step(model: Transformer, feeds: dict) -> dict:
    """The textbook model's step on the same inputs."""
    tensor = {name: torch.from_numpy(np.asarray(value)) for name, value in feeds.items()}

    def pairs(kind: str) -> list[tuple]:  # [(keys_0, values_0), (keys_1, values_1), ...]
        names = layer_names(kind, LAYERS)
        return [(tensor[names[i]], tensor[names[i + 1]]) for i in range(0, len(names), 2)]

    past, cross = pairs("past"), pairs("cross")
    with torch.no_grad():
        logits, present, weights = model.decode(
            tensor["target_ids"],
            past,
            cross,
            tensor["source_mask"],
            tensor["past_mask"],
            tensor["positions"],
            all_attention=True,
        )
    log_probs = torch.log_softmax(logits[:, -1], dim=-1)
    top = torch.topk(log_probs, int(feeds["top_k"]), dim=-1)
    forced = torch.gather(log_probs, 1, tensor["forced_ids"])
    attention = [w.squeeze(2).numpy() for w in weights]  # [B, H, S] per layer
    return {
        "top_log_probs": top.values.numpy(),
        "top_ids": top.indices.numpy(),
        "forced_log_probs": forced.numpy(),
        "alignment": attention[-1].mean(axis=1),
        **dict(zip(attention_output_names(LAYERS), attention, strict=True)),
        **dict(
            zip(
                layer_names("present", LAYERS),
                [t.numpy() for pair in present for t in pair],
                strict=True,
            )
        ),
    }


def assert_same_words(found: dict, expected: dict) -> None:
    """The same words in the same order, except where two log-probs are so close that another
    CPU's rounding may swap them (a near-tie: either order is right)."""
    values = expected["top_log_probs"]
    gap = np.diff(values, axis=1)  # <= 0: best first
    clear = np.ones_like(values, dtype=bool)
    clear[:, 1:] &= gap < -1e-4
    clear[:, :-1] &= gap < -1e-4
    np.testing.assert_array_equal(found["top_ids"][clear], expected["top_ids"][clear])
    assert clear.mean() > 0.5  # most of them are not near-ties: the check means something


SHAPES = [(1, 1, 0, 5), (3, 2, 4, 7), (2, 4, 9, 3), (4, 1, 6, 11)]


@pytest.mark.parametrize("activation", ["relu", "gelu", "swish"])
@pytest.mark.parametrize(("sources", "rows_per_source", "past", "source"), SHAPES)
def test_the_step_gives_what_the_torch_model_gives_and_writes_one_position(
    activation: str, sources: int, rows_per_source: int, past: int, source: int
) -> None:
    """Each row's cache at the start of its slot of a longer buffer (one row shorter: it
    joined later), bound as both past and present: the outputs of the torch model, each
    row's new key and value written right after its own cache, and nothing else in the
    buffer touched."""
    model = random_model(activation, seed=past + source)
    check_step(model, sources, rows_per_source, past, source)


@pytest.mark.parametrize("family", [f for f in FAMILY_SHAPES if f != "marian"])
@pytest.mark.parametrize(("sources", "rows_per_source", "past", "source"), SHAPES[:3])
def test_every_family_shape_steps_as_its_torch_model(
    family: str, sources: int, rows_per_source: int, past: int, source: int
) -> None:
    """Pre-norm, the final and embedding LayerNorms, offset and learned positions, a decoder
    vocabulary of its own: the same nodes, wired as the torch model wires them."""
    model = random_model("relu", seed=past + source, family=family)
    check_step(model, sources, rows_per_source, past, source)


def check_step(model: Transformer, sources: int, rows_per_source: int, past: int, source: int):
    feeds = step_inputs(sources, rows_per_source, past, source, seed=source)
    expected = torch_step(model, feeds)
    rows, capacity, garbage = sources * rows_per_source, past + 3, 1e3
    lengths = feeds["positions"]  # each row's real cache: the last `length` of its past
    step = session(model)
    binding = step.io_binding()
    names = ["top_log_probs", "top_ids", "forced_log_probs", "alignment"]
    names += attention_output_names(LAYERS)
    for name in names:  # first: get_outputs() lists the outputs in the order they were bound
        binding.bind_output(name, "cpu")
    buffers = {}
    for past_name, present_name in zip(
        layer_names("past", LAYERS), layer_names("present", LAYERS), strict=True
    ):
        buffer = np.full((rows, HEADS, capacity, HEAD_DIM), garbage, dtype=np.float32)
        for row, length in enumerate(lengths):
            buffer[row, :, :length] = feeds[past_name][row, :, past - length :]
        buffers[present_name] = buffer
        for bind in (binding.bind_input, binding.bind_output):
            name = past_name if bind == binding.bind_input else present_name
            bind(name, "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
    for name, value in feeds.items():
        if name != "past_mask" and not name.startswith("past_"):
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
    step.run_with_iobinding(binding)
    found = dict(zip(names, [value.numpy() for value in binding.get_outputs()], strict=False))
    assert_same_words(found, expected)
    for name in names[:1] + names[2:]:
        np.testing.assert_allclose(found[name], expected[name], atol=2e-5, rtol=1e-4)
    for name, buffer in buffers.items():
        for row, length in enumerate(lengths):  # present: [rows, H, past + 1, Dh]
            real = expected[name][row, :, past - length :]
            np.testing.assert_allclose(buffer[row, :, : length + 1], real, atol=2e-5, rtol=1e-4)
            assert (buffer[row, :, length + 1 :] == garbage).all()


def test_the_declared_intermediate_shapes_are_the_computed_ones() -> None:
    """What the graph declares of its intermediates (value_info: the cross-attention scores,
    which MultiHeadAttention's schema leaves untyped) has the rank and sizes ONNX Runtime
    computes. A provider that infers shapes from the declarations (OpenVINO's) reads a missing
    shape as a scalar and refuses the graph."""
    sources, rows_per_source, past, source = 3, 2, 4, 7
    proto = fused_decoder_step(random_model("relu", seed=5))
    declared = list(proto.graph.value_info)
    assert declared
    proto.graph.output.extend(declared)
    step = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = step_inputs(sources, rows_per_source, past, source, seed=1)
    del feeds["past_mask"]
    rows = sources * rows_per_source
    rng = np.random.default_rng(2)
    for name in layer_names("past", LAYERS):  # room for the position the step writes
        feeds[name] = rng.standard_normal((rows, HEADS, past + 1, HEAD_DIM), dtype=np.float32)
    feeds["positions"] = np.full(rows, past, dtype=np.int64)
    computed = step.run([v.name for v in declared], feeds)
    sizes = {"sources": sources, "rows_per_source": rows_per_source, "source": source}
    for info, value in zip(declared, computed, strict=True):
        dims = info.type.tensor_type.shape.dim
        expected = tuple(
            d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in dims
        )
        assert value.shape == expected, info.name
        assert value.shape == (sources, HEADS, rows_per_source, source)  # [B/K, H, K, S]
