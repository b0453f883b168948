"""ONNX Runtime sessions for one bundle: encode once, then one decoder step at a time.

Where the time goes (measured in docs/benchmarks.md):
* at batch 1, per-step overhead dominates: the session call itself, feeding inputs and
  converting outputs. We ask only for the outputs we need (no alignment unless asked).
* at batch 32+ (and in beam search), the decoder's matmuls and the output projection
  [rows, D] x [D, V] dominate; the self-attention cache grows by Concat inside the graph,
  which copies the cache once per step, and beam search reorders it with one gather per step.

Caches are numpy arrays [L, rows, H, length, Dh]: ONNX Runtime reads numpy inputs in place
(no copy on the CPU), so the step loop copies only what decoding needs (the Concat in the
graph, and a gather when rows are reordered or dropped).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.bundle import Bundle

log = logging.getLogger("nmt.engine")

OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class EngineOptions:
    int8: bool = False
    intra_op_threads: int = 0  # 0 = ONNX Runtime's default (one per core)
    optimization: str = "all"
    use_cache: bool = True  # False: the no-cache decoder (benchmarks only)


def _session(path, options: EngineOptions) -> ort.InferenceSession:
    settings = ort.SessionOptions()
    settings.graph_optimization_level = OPTIMIZATION_LEVELS[options.optimization]
    settings.intra_op_num_threads = options.intra_op_threads
    settings.inter_op_num_threads = 1
    settings.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    settings.log_severity_level = 3
    return ort.InferenceSession(str(path), settings, providers=["CPUExecutionProvider"])


@dataclass
class DecoderState:
    """Everything a step needs besides the last tokens. Row r of every array is the same row.

    cross_keys, cross_values [L, rows, H, S, Dh]; source_mask [rows, S] bool;
    past_keys, past_values [L, rows, H, P, Dh]: the self-attention cache (cached decoder);
    prefix [rows, P]: every token fed so far (only kept by the no-cache decoder).
    """

    cross_keys: np.ndarray
    cross_values: np.ndarray
    source_mask: np.ndarray
    past_keys: np.ndarray
    past_values: np.ndarray
    prefix: np.ndarray

    def select_rows(self, rows: np.ndarray, cross_changed: bool = True) -> DecoderState:
        """Keep (and reorder) rows. Cross keys/values only move when rows leave or change
        sentence; beam reordering within a sentence leaves them as they are."""
        if cross_changed:
            cross_keys, cross_values = self.cross_keys[:, rows], self.cross_values[:, rows]
            source_mask = self.source_mask[rows]
            # Cut source padding that no remaining row needs (the batch is length-sorted).
            width = int(source_mask.sum(axis=1).max())
            if width < source_mask.shape[1]:
                cross_keys, cross_values = (
                    cross_keys[:, :, :, :width],
                    cross_values[:, :, :, :width],
                )
                source_mask = source_mask[:, :width]
        else:
            cross_keys, cross_values, source_mask = (
                self.cross_keys,
                self.cross_values,
                self.source_mask,
            )
        return DecoderState(
            cross_keys,
            cross_values,
            source_mask,
            self.past_keys[:, rows],
            self.past_values[:, rows],
            self.prefix[rows],
        )


@dataclass
class StepResult:
    top_log_probs: np.ndarray | None = None  # [rows, k], best first
    top_ids: np.ndarray | None = None  # [rows, k] int64
    log_probs: np.ndarray | None = None  # [rows, V], only when asked for
    alignment: np.ndarray | None = None  # [rows, S], only when asked for


class Engine:
    """One bundle's encoder and decoder sessions."""

    def __init__(self, bundle: Bundle, options: EngineOptions | None = None) -> None:
        self.bundle = bundle
        self.options = options or EngineOptions()
        dims = bundle.dims
        self.layers, self.heads, self.head_dim = (
            dims["decoder_layers"],
            dims["n_heads"],
            dims["head_dim"],
        )
        self.max_positions = dims["max_positions"]
        ids = bundle.special_ids
        self.eos_id, self.pad_id, self.start_id = ids["eos"], ids["pad"], ids["decoder_start"]
        self.encoder = _session(bundle.graph("encoder", self.options.int8), self.options)
        role = "decoder" if self.options.use_cache else "decoder_nocache"
        self.decoder = _session(bundle.graph(role, self.options.int8), self.options)

    def start(self, source_ids: np.ndarray, source_mask: np.ndarray) -> DecoderState:
        """Encode a batch: source_ids [B, S] int64, source_mask [B, S] bool."""
        cross_keys, cross_values = self.encoder.run(
            None, {"source_ids": source_ids, "source_mask": source_mask}
        )
        rows = source_ids.shape[0]
        empty = np.zeros((self.layers, rows, self.heads, 0, self.head_dim), dtype=np.float32)
        prefix = np.zeros((rows, 0), dtype=np.int64)
        return DecoderState(cross_keys, cross_values, source_mask, empty, empty, prefix)

    def step(
        self, state: DecoderState, tokens: np.ndarray, top_k: int, want_alignment: bool = False
    ) -> StepResult:
        """Feed every row its next input token, tokens [rows] int64 (the start token first).

        Updates the state's cache in place and returns each row's top_k next tokens with
        their log-probs (selected in the graph, so [rows, V] never leaves it), and this step's
        cross-attention weights [rows, S] when asked for.
        """
        outputs = ["top_log_probs", "top_ids"]
        return self._run(state, tokens, top_k, outputs, want_alignment)

    def step_log_probs(
        self, state: DecoderState, tokens: np.ndarray, want_alignment: bool = False
    ) -> StepResult:
        """Like step, but with the full log-probs [rows, V] (for checks against torch)."""
        return self._run(state, tokens, 1, ["log_probs"], want_alignment)

    def _run(
        self,
        state: DecoderState,
        tokens: np.ndarray,
        top_k: int,
        outputs: list[str],
        alignment: bool,
    ) -> StepResult:
        top_k_input = np.array(top_k, dtype=np.int64)
        if not self.options.use_cache:
            # Recompute every position of the prefix: what decoding costs without the cache.
            state.prefix = np.concatenate([state.prefix, tokens[:, None]], axis=1)
            feeds = {
                "target_ids": state.prefix,
                "cross_keys": state.cross_keys,
                "cross_values": state.cross_values,
                "source_mask": state.source_mask,
                "top_k": top_k_input,
            }
            results = dict(zip(outputs, self.decoder.run(outputs, feeds), strict=True))
            return StepResult(**results)
        outputs = [*outputs, "present_keys", "present_values"] + (
            ["alignment"] if alignment else []
        )
        feeds = {
            "target_ids": tokens[:, None],
            "past_keys": state.past_keys,
            "past_values": state.past_values,
            "cross_keys": state.cross_keys,
            "cross_values": state.cross_values,
            "source_mask": state.source_mask,
            "top_k": top_k_input,
        }
        results = dict(zip(outputs, self.decoder.run(outputs, feeds), strict=True))
        state.past_keys = results.pop("present_keys")
        state.past_values = results.pop("present_values")
        return StepResult(**results)
