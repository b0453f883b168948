"""One bundle's encoder and decoder step: encode once, then one decoder step at a time.

Where the time goes (measured, with the commands, in docs/benchmarks.md and
docs/performance.md):
* at batch 1, per-step overhead dominates: the session call itself, feeding inputs and
  converting outputs. A step goes through an IO binding kept with the cache (kv_cache.py),
  made again only when its arrays change, and asks only for the outputs it needs (no
  alignment unless asked). A lone sentence's cache, once its batch empties, is kept for the
  next lone sentence, which decodes in its buffers through its binding (keep_spare).
* at batch 32+ (and in beam search), the decoder's matmuls and the output projection
  [rows, D] x [D, V] dominate; the top-k is selected in the graph, so [rows, V] never leaves
  it. The vocabulary shortlist (opt-in) cuts V to the batch's candidate words.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from nmt_contract import Shortlist, attention_output_names, layer_names, union_of
from service.runtime.bundle import Bundle, BundleError
from service.runtime.kv_cache import KVCache, empty_buffer
from service.runtime.sessions import EngineOptions, open_session

log = logging.getLogger("nmt.engine")

# Spare caches kept per row count (Engine.keep_spare): one or two lone sentences at a time is
# what reuses them (a server's lone requests, a worker each; a CLI's sentences in turn).
SPARES_PER_ROWS = 2


@dataclass
class StepResult:
    top_log_probs: np.ndarray  # [rows, k], best first
    top_ids: np.ndarray  # [rows, k] int64
    alignment: np.ndarray | None = None  # [rows, S], only when asked for
    attention: np.ndarray | None = None  # [rows, L, H, S], only when asked for
    forced_log_probs: np.ndarray | None = None  # [rows, F], only for forced ids asked for


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
        self.max_positions, self.vocab_size = dims["max_positions"], dims["vocab_size"]
        ids = bundle.special_ids
        self.eos_id, self.pad_id, self.start_id = ids["eos"], ids["pad"], ids["decoder_start"]
        self.force_eos_at_limit = bundle.force_eos_at_limit
        self.cross_names = layer_names("cross", self.layers)
        self.past_names = layer_names("past", self.layers)
        self.present_names = layer_names("present", self.layers)
        self.attention_names = attention_output_names(self.layers)
        # The encoder runs once per batch, right before the decoder's steps: its threads must
        # not spin then, or they take the cores the decoder's threads need.
        encoder_options = dataclasses.replace(self.options, spinning=False)
        self.encoder = open_session(bundle.graph("encoder", self.options.int8), encoder_options)
        self._ahead_encoder: ort.InferenceSession | None = None
        role = "decoder"
        self.shortlist: Shortlist | None = None
        if self.options.shortlist:
            role = "decoder_shortlist"
            shortlist_path, projection_paths = bundle.shortlist_files(self.options.int8)
            self.shortlist = Shortlist.load(shortlist_path)
            # [D, V] float, or (int8) the int8 [D, V] and its column scales [V]
            self.projection = [np.load(path) for path in projection_paths]
            fits = self.shortlist.fits(self.vocab_size)
            if not fits or self.projection[0].shape[1] != self.vocab_size:
                raise BundleError(
                    f"{bundle.path}: the shortlist does not fit the model's {self.vocab_size} "
                    "words: rebuild it with `nmt shortlist` and re-export"
                )
        self.decoder = open_session(bundle.graph(role, self.options.int8), self.options)
        self._check_decoder_names(bundle)
        # Caches of one sentence whose running batch emptied, by row count: the next lone
        # sentence takes over their buffers and IO binding (keep_spare, reuse_spare). A deque
        # each: its append and pop are atomic, and decoding workers share the engine.
        self._spares: dict[int, collections.deque[KVCache]] = {}

    def _check_decoder_names(self, bundle: Bundle) -> None:
        """A graph from an older exporter under the same format number would fail at the
        first request that needs a missing name: refuse it at load, saying what to do."""
        inputs = {value.name for value in self.decoder.get_inputs()}
        outputs = {value.name for value in self.decoder.get_outputs()}
        needed_inputs = {"target_ids", "source_mask", "top_k", "positions", "forced_ids"}
        needed_inputs |= {*self.past_names, *self.cross_names}
        if self.shortlist is not None:
            needed_inputs |= {"vocabulary", "output_projection"}
            if self.options.int8:
                needed_inputs.add("output_projection_scale")
        needed_outputs = {"top_log_probs", "top_ids", "forced_log_probs", "alignment"}
        needed_outputs |= set(self.attention_names)
        needed_outputs |= set(self.present_names)
        missing = sorted((needed_inputs - inputs) | (needed_outputs - outputs))
        if missing:
            raise BundleError(
                f"{bundle.path}: the decoder graph lacks {', '.join(missing)}: it was exported "
                "by another version of `nmt export`; re-export the bundle"
            )

    def start(
        self,
        source_ids: np.ndarray,
        source_mask: np.ndarray,
        rows_per_source: int = 1,
        ahead: bool = False,
    ) -> KVCache:
        """Encode a batch: source_ids [sources, S] int64, source_mask [sources, S] bool.
        Decoding then runs rows_per_source rows (beams) for every source, each with an empty
        self-attention cache. `ahead`: on a thread of its own while the decoder runs
        (continuous batching's encoder thread), with one intra-op thread, so that encoder and
        decoder together take one thread more than the decoder alone, whatever NMT_THREADS is."""
        session = self.ahead_encoder() if ahead else self.encoder
        cross = session.run(
            self.cross_names, {"source_ids": source_ids, "source_mask": source_mask}
        )
        rows = source_ids.shape[0] * rows_per_source
        shape = (rows, self.heads, 0, self.head_dim)
        empty = np.zeros(shape, dtype=np.float32)
        candidates = None
        if self.shortlist is not None:
            candidates = [
                self.shortlist.vocabulary_for(ids[mask])
                for ids, mask in zip(source_ids, source_mask, strict=True)
            ]
        return KVCache(
            cross=cross,
            source_mask=source_mask,
            past=[empty_buffer(empty, rows) for _ in self.past_names],
            positions=np.zeros(rows, dtype=np.int64),
            candidates=candidates,
        )

    def keep_spare(self, cache: KVCache) -> None:
        """The last cache of a running batch whose sentences all left: kept for a sentence
        that joins an empty batch next (reuse_spare) when its buffers hold just its rows (a
        lone sentence's; the buffers of a batch that held many stay unkept, not to hold their
        memory) and are its own (not views of a step taken together)."""
        if cache.together is None and cache.past[0].shape[0] == cache.rows:
            spares = self._spares.setdefault(cache.rows, collections.deque(maxlen=SPARES_PER_ROWS))
            spares.append(cache)

    def reuse_spare(self, cache: KVCache) -> None:
        """Let a cache that has not stepped take over a kept spare of as many rows."""
        spares = self._spares.get(cache.rows)
        if spares:
            with contextlib.suppress(IndexError):  # another worker took the last one
                cache.adopt(spares.pop())

    def ahead_encoder(self) -> ort.InferenceSession:
        """The encoder session for encoding ahead: the encoder's own with one thread, else a
        second one with a single thread (made at first use; its weights once more in memory)."""
        if self.options.intra_op_threads == 1:
            return self.encoder
        if self._ahead_encoder is None:
            single = dataclasses.replace(self.options, intra_op_threads=1, spinning=False)
            path = self.bundle.graph("encoder", self.options.int8)
            self._ahead_encoder = open_session(path, single)
        return self._ahead_encoder

    def step(
        self,
        cache: KVCache,
        tokens: np.ndarray,
        top_k: int,
        want_alignment: bool = False,
        want_attention: bool = False,
        forced: np.ndarray | None = None,
    ) -> StepResult:
        """Feed every row its next input token, tokens [rows] int64 (the start token first).

        Writes each row's new key and value into the cache's buffers and returns each row's
        top_k next tokens with their log-probs, and when asked for this step's
        cross-attention weights: the alignment [rows, S] (last layer, head mean) and every
        layer's and head's weights [rows, L, H, S]. `forced` [rows, F] (word ids): their
        log-probs too, forced_log_probs [rows, F] (-inf for a word a shortlist leaves out).

        Through IO binding: the cache buffers are bound as both past and present (the graph
        writes each row's new position into them); the tokens, positions and outputs are
        arrays kept with the cache, bound once and written or copied out at each step.
        Binding a name costs a few microseconds through ONNX Runtime's Python API, so the
        binding is made again only when its arrays changed (rows joined or left, buffers
        grew) or other outputs are asked for.
        """
        rows = cache.rows
        cache.reserve(rows, cache.longest + 1)  # room for the new one
        if self.shortlist is not None and cache.vocabulary is None:
            self._gather_vocabulary(cache)
        words = self.vocab_size if cache.vocabulary is None else len(cache.vocabulary)
        k = min(top_k, words)
        width = 1 if forced is None else forced.shape[1]
        wanted = (k, want_alignment, want_attention, width)
        # A binding taken over from a spare (KVCache.adopt) needs this cache's sources bound;
        # outputs as wide as the sources (alignment, attention) need new arrays: all anew.
        sources_shaped = want_alignment or want_attention
        if cache.bound != wanted or (cache.sources_stale and sources_shaped):
            cache.binding, cache.io = self._bind(cache, *wanted)
            cache.bound = wanted
        elif cache.sources_stale:
            self._bind_sources(cache.binding, cache)
        io = cache.io
        io["target_ids"][:, 0] = tokens
        io["positions"][:] = cache.positions
        outside = None  # forced words a shortlist leaves out
        if forced is not None:
            if cache.vocabulary is None:
                io["forced_ids"][:] = forced
            else:  # the graph reads positions among the candidates
                places = np.minimum(np.searchsorted(cache.vocabulary, forced), words - 1)
                outside = cache.vocabulary[places] != forced
                io["forced_ids"][:] = places
        self.decoder.run_with_iobinding(cache.binding)
        cache.advance()
        # Copies: the arrays are written again by the next step, the results are the caller's.
        result = StepResult(io["top_log_probs"].copy(), io["top_ids"].copy())
        if want_alignment:
            result.alignment = io["alignment"].copy()
        if want_attention:  # [L, rows, H, S] -> [rows, L, H, S]
            result.attention = np.ascontiguousarray(io["attention"].transpose(1, 0, 2, 3))
        if forced is not None:
            result.forced_log_probs = io["forced_log_probs"].copy()
            if outside is not None:
                result.forced_log_probs[outside] = -np.inf
        return result

    def _gather_vocabulary(self, cache: KVCache) -> None:
        """The batch's candidate words (the union of its sources') and their columns of the
        output projection [D, C] (int8: and their scales [C]): after joins and leaves
        (KVCache.select_sources), not per step."""
        cache.vocabulary = union_of(cache.candidates)
        # [D, C]: `take` copies a row's picked columns at a time, 5-9x faster than the fancy
        # index `projection[:, vocabulary]` on the fp32 matrix (docs/performance.md, the
        # shortlist section); on the int8 one the two take about as long (0.3 ms for 1,844).
        cache.projection = [part.take(cache.vocabulary, axis=-1) for part in self.projection]
        cache.vocabulary_sources = cache.sources
        cache.unbind()

    def _bind(
        self, cache: KVCache, k: int, alignment: bool, attention: bool, forced: int
    ) -> tuple[ort.IOBinding, dict[str, np.ndarray]]:
        """A new binding for the cache's steps, and the arrays bound besides the caches: the
        sources' keys and values and the cache buffers (their leading slots, one per row, as
        both past and present) as they are; the tokens, positions and outputs to new arrays."""
        rows, width = cache.rows, cache.source_mask.shape[1]
        binding = self.decoder.io_binding()
        io = {
            "target_ids": np.zeros((rows, 1), dtype=np.int64),
            "positions": np.zeros(rows, dtype=np.int64),
            "top_k": _top_k_input(k),
            "top_log_probs": np.empty((rows, k), dtype=np.float32),
            "top_ids": np.empty((rows, k), dtype=np.int64),
            # (without forced words: one column of word 0, whose log-prob nobody reads)
            "forced_ids": np.zeros((rows, forced), dtype=np.int64),
            "forced_log_probs": np.empty((rows, forced), dtype=np.float32),
        }
        inputs = {name: io[name] for name in ("target_ids", "positions", "top_k", "forced_ids")}
        if cache.vocabulary is not None:
            inputs["vocabulary"] = cache.vocabulary
            names = ["output_projection", "output_projection_scale"]  # (the scales: int8)
            inputs |= dict(zip(names, cache.projection, strict=False))
        outputs = {name: io[name] for name in ("top_log_probs", "top_ids", "forced_log_probs")}
        if alignment:
            outputs["alignment"] = io["alignment"] = np.empty((rows, width), dtype=np.float32)
        if attention:  # one array for all layers, each layer's part contiguous
            io["attention"] = np.empty((self.layers, rows, self.heads, width), dtype=np.float32)
            outputs |= dict(zip(self.attention_names, io["attention"], strict=True))
        for past, present, buffer in zip(
            self.past_names, self.present_names, cache.past, strict=True
        ):
            inputs[past] = outputs[present] = buffer[:rows]  # contiguous: a leading part
        # The quickest ways through ONNX Runtime's Python API (about 1 and 4 µs a name, where
        # binding an address takes 9): a numpy input is read where it is, an OrtValue made
        # over a numpy array is written where it is. Both keep a reference to the array.
        for name, array in inputs.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name, array in outputs.items():
            assert array.flags.c_contiguous  # (else ONNX Runtime would write into a copy)
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        self._bind_sources(binding, cache)
        return binding, io

    def _bind_sources(self, binding: ort.IOBinding, cache: KVCache) -> None:
        """Bind what the cache's sources give every step: their cross-attention keys and
        values and their mask (binding a name again replaces it)."""
        binding.bind_cpu_input("source_mask", np.ascontiguousarray(cache.source_mask))
        for name, array in zip(self.cross_names, cache.cross, strict=True):
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        cache.sources_stale = False


@functools.cache
def _top_k_input(top_k: int) -> np.ndarray:
    """The step's top_k input (a 0-d int64 array), made once per value; read-only, as it is
    shared by every step."""
    array = np.array(top_k, dtype=np.int64)
    array.flags.writeable = False
    return array
