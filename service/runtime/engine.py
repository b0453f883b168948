"""ONNX Runtime sessions for one bundle: encode once, then one decoder step at a time.

Where the time goes (measured, with the commands, in docs/benchmarks.md and
docs/performance.md):
* at batch 1, per-step overhead dominates: the session call itself, feeding inputs and
  converting outputs. We ask only for the outputs we need (no alignment unless asked).
* at batch 32+ (and in beam search), the decoder's matmuls and the output projection
  [rows, D] x [D, V] dominate; the self-attention cache grows by one position per layer inside
  the graph (MultiHeadAttention writes present = past + new), and beam search reorders it
  with one gather per layer and step.

Keys and values are numpy arrays, one per layer: ONNX Runtime reads numpy inputs in place (no
copy on the CPU) and hands outputs back as arrays over its own buffers, so the step loop copies
only what decoding needs. The cross-attention keys/values have one row per source sentence,
shared by the K rows (beams) of that sentence; they only move when sentences leave the batch.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from nmt_contract import IN_PLACE_DECODER, Shortlist, attention_output_names, layer_names
from service.runtime.bundle import Bundle, BundleError

log = logging.getLogger("nmt.engine")


@dataclass(frozen=True)
class EngineOptions:
    int8: bool = False
    intra_op_threads: int = 0  # 0 = ONNX Runtime's default (one per core)
    use_cache: bool = True  # False: the no-cache decoder (benchmarks only)
    # ONNX Runtime's intra-op threads spin while waiting for work between runs: a step alone
    # starts sooner, but the spinning threads take the cores that the encoder's session, the
    # next batch and a server's event loop need (measured at 2 threads, greedy batch 32: 2,936
    # tokens/s sleeping, 2,255 spinning, 2,573 with one thread). The encoder never spins.
    spinning: bool = False
    # Score only a batch's candidate words (the bundle's vocabulary shortlist): up to 1.3x
    # faster, mostly in beam search; results change a little (export/shortlist.py,
    # docs/performance.md).
    shortlist: bool = False
    # Self-attention caches written in place (the bundle's decoder_in_place graph, when it has
    # one): a step writes each row's new key and value into a buffer that stays bound, instead
    # of passing the whole cache in and a copy one position longer out; rows that join later
    # need no padding. False: the concatenating decoder (for comparisons).
    in_place: bool = True
    # ONNX Runtime's profiler (off: ""): every session this engine opens writes its events to
    # `<profile_prefix>-<graph>_<time>.json`, read back by end_profiling(). For benchmarks
    # asking where the time goes, by operator (bench/compare/profiling.py).
    profile_prefix: str = ""


def session_options(options: EngineOptions) -> ort.SessionOptions:
    settings = ort.SessionOptions()
    settings.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    settings.intra_op_num_threads = options.intra_op_threads
    settings.inter_op_num_threads = 1
    settings.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    settings.log_severity_level = 3
    settings.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if options.spinning else "0"
    )
    return settings


# ONNX Runtime's graph fusions we turn off: its SkipLayerNormalization (Add + LayerNorm in one
# node) was measured 3x slower on the CPU than the nodes it replaces at 128 rows (240 vs 73 us;
# 11.6 vs 14.3 us at one row), docs/performance.md.
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def _session(path, options: EngineOptions) -> ort.InferenceSession:
    settings = session_options(options)
    if options.profile_prefix:
        settings.enable_profiling = True
        settings.profile_file_prefix = f"{options.profile_prefix}-{Path(path).stem}"
    return ort.InferenceSession(
        str(path),
        settings,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=DISABLED_OPTIMIZERS,
    )


@dataclass
class DecoderState:
    """Everything a step needs besides the last tokens.

    Rows are grouped by source: rows k*K .. k*K+K-1 belong to source k, K being the rows per
    source (the beams of a sentence: 1 in greedy search). The graph derives K from the row and
    source counts, so every source of one state has the same K.
    cross: keys_0, values_0, keys_1, ... each [sources, H, S, Dh]; source_mask [sources, S];
    past: the self-attention cache, keys_0, values_0, ... each [rows, H, P, Dh];
    past_mask [rows, P]: False for the padding in front of rows that joined later (a running
    batch's rows started at different steps; each row's real cache is right-aligned);
    positions [rows]: each row's real cache length, the position of the token it feeds next;
    prefix [rows, P]: every token fed so far (only kept by the no-cache decoder);
    vocabulary [C]: with a shortlist, the candidate target ids of every source in the state
    (ascending), and projection [D, C] their output projection columns (made at the first
    step after the vocabulary changes).

    Leaving is cheap: the rows (sources) that stay where they are are not copied; those that
    move are written over the ones that left, in the arrays themselves, and the state keeps
    the leading part as a view (a leading part of a contiguous array is contiguous, so ONNX
    Runtime reads it in place). Padding that no row needs any more is cut on the way only
    when it is a quarter or more of the cache (cutting copies everything); otherwise the next
    join, which copies everything anyway, cuts it. Moving in place is safe because a state's
    arrays are its own: made by the encoder, a step or extend, or its own rows of a step taken
    together with other states (take_rows_of: disjoint slices, and moves stay within them).
    The views per_source hands out hold one source each, and one source never moves.
    """

    cross: list[np.ndarray]
    source_mask: np.ndarray
    past: list[np.ndarray]
    past_mask: np.ndarray
    positions: np.ndarray
    prefix: np.ndarray
    vocabulary: np.ndarray | None = None
    projection: np.ndarray | None = None
    # After a step taken together with other states (take_rows_of): that step's state and the
    # first of our rows in it. Our caches are then views of its caches, and the next step
    # together can go on from it without stacking them again (went_on_together).
    together: tuple[DecoderState, int] | None = None

    @property
    def rows(self) -> int:
        return len(self.positions)

    @property
    def sources(self) -> int:
        return len(self.source_mask)

    def reserve(self, rows: int, length: int) -> None:
        """Room for caches of `length` positions: only caches written in place need it
        (InPlaceState); here each step makes a new cache one position longer."""

    def select_rows(self, rows: np.ndarray) -> None:
        """Keep (and reorder) rows of the self-attention cache: rows[i] is the row that new
        row i continues (beam search reorders by beam origin; finished rows are left out).
        Only rows that move are copied (see the class docstring). Rows of a step taken
        together always move in place, and keep its padding: the next step together then goes
        on from that step's caches instead of copying them all."""
        past_mask = np.take(self.past_mask, rows, axis=0)
        columns = past_mask.shape[1]
        first = _leading_padding(past_mask)
        if len(rows) != self.rows:  # rows left: the next step together stacks them again
            self.together = None
        if self.together is None and (4 * first >= columns > 0 or len(rows) > self.rows):
            # Cut the leading columns that are padding for every remaining row: one copy.
            self.past = [np.take(cache[:, :, first:], rows, axis=0) for cache in self.past]
            past_mask = past_mask[:, first:]
        else:
            moves = _Moves(rows, always=self.together is not None)  # the same for every cache
            self.past = [moves.apply(cache) for cache in self.past]
        self.past_mask = np.ascontiguousarray(past_mask)
        self.positions = np.take(self.positions, rows)
        self.prefix = np.take(self.prefix, rows, axis=0)

    def select_sources(self, sources: np.ndarray) -> None:
        """Keep the sources still being decoded (sources[i] is the source new source i was),
        moving only those that change places (see the class docstring); the source padding
        none of them needs is cut when it is a quarter or more of the width (batches are
        length-sorted, so the longest often leave first)."""
        source_mask = np.take(self.source_mask, sources, axis=0)
        columns = source_mask.shape[1]
        width = int(source_mask.sum(axis=1).max())
        if 4 * (columns - width) >= columns or len(sources) > self.sources:
            # Made contiguous here, once: ONNX Runtime would copy a strided view at every step.
            self.cross = [
                np.ascontiguousarray(np.take(cache, sources, axis=0)[:, :, :width])
                for cache in self.cross
            ]
            source_mask = source_mask[:, :width]
        else:
            moves = _Moves(sources)
            self.cross = [moves.apply(cache) for cache in self.cross]
        self.source_mask = np.ascontiguousarray(source_mask)
        self._buffers_changed()

    def _buffers_changed(self) -> None:
        """Arrays a step reads were replaced or changed shape (InPlaceState binds them)."""

    def per_source(self) -> list[DecoderState]:
        """One state per source (views, no copy), for sources encoded together that may join
        at different times. Only for a state that has not stepped yet."""
        if self.positions.any():
            raise ValueError("only a state that has not stepped yet can be split")
        rows = self.rows // self.sources
        return [
            type(self)(
                cross=[layer[k : k + 1] for layer in self.cross],
                source_mask=self.source_mask[k : k + 1],
                past=self._empty_caches(k * rows, (k + 1) * rows),
                past_mask=None
                if self.past_mask is None
                else self.past_mask[k * rows : (k + 1) * rows],
                positions=self.positions[k * rows : (k + 1) * rows],
                prefix=self.prefix[k * rows : (k + 1) * rows],
                vocabulary=self.vocabulary,  # the candidates of all: a superset is harmless
            )
            for k in range(self.sources)
        ]

    def _empty_caches(self, start: int, stop: int) -> list[np.ndarray]:
        """The (empty) caches of rows start..stop, for per_source: views of ours."""
        return [cache[start:stop] for cache in self.past]

    def extend(self, *joining: DecoderState) -> None:
        """Append other states' sources and rows (sentences joining a running batch) after
        ours, in order, with the same rows per source. Sources are right-padded to the widest
        (padding masked out of cross-attention), self-attention caches left-padded to the
        longest (masked out by past_mask): each row keeps its own real positions. Each array
        is copied once, into its new place, without the padding no row needs any more."""
        states = [self, *joining]
        width = max(int(state.source_mask.sum(axis=1).max(initial=0)) for state in states)
        # the cache columns some row needs (in front of them: padding for every row)
        length = max(s.past_mask.shape[1] - _leading_padding(s.past_mask) for s in states)
        stacked = _stacked_states(states, width, length, row_per_source=False)
        self.cross, self.source_mask = stacked.cross, stacked.source_mask
        self.past, self.past_mask = stacked.past, stacked.past_mask
        self.positions = stacked.positions
        self.together = None
        vocabularies = [state.vocabulary for state in states]
        if all(vocabulary is not None for vocabulary in vocabularies):
            # The candidates of all (those of sentences that left stay: a superset is harmless)
            self.vocabulary = functools.reduce(np.union1d, vocabularies)
            self.projection = None
        if any(state.prefix.shape[1] for state in states):
            raise ValueError("the no-cache decoder (benchmarks only) cannot join rows midway")
        self.prefix = np.zeros((self.rows, 0), dtype=np.int64)

    @staticmethod
    def rows_together(states: list[DecoderState]) -> DecoderState:
        """The rows of `states` (each with its own rows per source) as one state with one row
        per source, for one step: every row gets its own copy of its source's cross keys and
        values. Sources right-padded to the widest, caches left-padded to the longest."""

        width = max(state.source_mask.shape[1] for state in states)
        length = max(state.past_mask.shape[1] for state in states)
        return _stacked_states(states, width, length, row_per_source=True)

    def take_rows_of(self, stepped: DecoderState, start: int, stop: int) -> None:
        """After a step of rows_together(...): this state's rows are start..stop of `stepped`
        (views of its new caches, with its padding)."""
        self.past = [cache[start:stop] for cache in stepped.past]
        self.past_mask = stepped.past_mask[start:stop]
        self.positions = stepped.positions[start:stop]
        self.together = (stepped, start)

    @staticmethod
    def went_on_together(states: list[DecoderState]) -> DecoderState | None:
        """rows_together(states) without copying the caches, where the states are the rows of
        the last step taken together, in the same order, and each one's caches are still
        views of that step's, in their places: nobody joined or left since (beams reordered
        in place). The cross keys/values (one copy per row) are that step's too: reordered
        beams share their source. None otherwise."""
        previous = _last_together(states)
        if previous is None:
            return None
        return DecoderState(
            cross=previous.cross,
            source_mask=previous.source_mask,
            past=previous.past,
            past_mask=np.concatenate([state.past_mask for state in states]),
            positions=np.concatenate([state.positions for state in states]),
            prefix=previous.prefix,
        )


@dataclass
class InPlaceState(DecoderState):
    """A DecoderState whose self-attention caches stay where they are (the in-place decoder).

    past: keys_0, values_0, ... each a buffer [capacity rows, H, capacity, Dh]. Row r of the
    state is slot r of every buffer; its cache is the slot's first positions[r] positions,
    left-aligned, and what follows them is never read. A step writes each row's new key and
    value at its own position, in the buffer itself (the engine binds it as the graph's past
    and present). So:
    * a row that joins later has a shorter cache, not padding: no past_mask;
    * joining copies no cache (a new row starts empty, in a free slot) unless a buffer must
      grow, which doubles it (a few times in a batch's life);
    * leaving and beam reordering copy the moved rows' real positions only.
    The rows in use are the buffers' leading slots, so the graph reads buffer[:rows] in place.
    """

    # (past_mask is None: no padding)
    # The arrays of our own that cross and source_mask are the leading parts of, with room
    # for sources to join in place (extend); None until a join made them.
    rooms: list[np.ndarray] | None = None
    # The IO binding of the last step, the arrays bound besides the caches, and what it was
    # made for (Engine._run_in_place); bound is None when its arrays changed.
    binding: object | None = None
    io: dict | None = None
    bound: tuple | None = None

    @property
    def capacity(self) -> int:
        return self.past[0].shape[2]

    def _buffers_changed(self) -> None:
        self.bound = None  # the next step binds its arrays again

    def reserve(self, rows: int, length: int) -> None:
        """Room for `rows` rows of `length` positions: the buffers are grown (doubled, at
        least 16 positions) and the real positions copied when they are too small. (After a
        step taken together the buffers are views of that step's, exactly our rows: whatever
        fits in them is ours, and growing makes buffers of our own.)"""
        shape = self.past[0].shape
        if rows <= shape[0] and length <= shape[2]:
            return
        new_rows = max(rows, 2 * shape[0] if rows > shape[0] else shape[0])
        new_length = max(length, 2 * shape[2] if length > shape[2] else shape[2], 16)
        used, longest = self.rows, int(self.positions.max(initial=0))
        grown = []
        for buffer in self.past:
            new = np.empty((new_rows, shape[1], new_length, shape[3]), dtype=buffer.dtype)
            new[:used, :, :longest] = buffer[:used, :, :longest]
            grown.append(new)
        self.past = grown
        self.together = None
        self._buffers_changed()

    def select_rows(self, rows: np.ndarray) -> None:
        """Keep (and reorder) rows: rows[i] is the row that new row i continues. Only the rows
        that move are copied, and only their real positions (the right side of the assignment
        is gathered first, so a row may move onto a place another row leaves)."""
        if len(rows) > self.past[0].shape[0]:
            self.reserve(len(rows), self.capacity)
        if len(rows) != self.rows:  # rows left: the next step together stacks them again
            self.together = None
            self._buffers_changed()
        positions = np.take(self.positions, rows)
        moved = np.flatnonzero(rows != np.arange(len(rows)))
        if len(moved):
            origins = rows[moved]
            longest = int(positions[moved].max())
            if longest:
                for buffer in self.past:
                    buffer[moved, :, :longest] = buffer[origins, :, :longest]
        self.positions = positions
        self.prefix = np.take(self.prefix, rows, axis=0)

    def _empty_caches(self, start: int, stop: int) -> list[np.ndarray]:
        """Buffers of their own for rows start..stop, for per_source (no positions yet: each
        state grows them when it first needs room)."""
        return [_empty_buffer(buffer, stop - start) for buffer in self.past]

    def extend(self, *joining: DecoderState) -> None:
        """Append other states' sources and rows after ours (see DecoderState.extend). The
        new sources are written after ours, into the arrays ours are the leading part of when
        those have room (slots, and a width the new ones fit in), else all are stacked into
        new arrays with room for as many sources again. The new rows take the next free
        slots, where an empty cache needs no copy (a state that has stepped brings its real
        positions)."""
        states = [self, *joining]
        if not self._sources_written_in_place(joining):
            width = max(int(state.source_mask.sum(axis=1).max(initial=0)) for state in states)
            slots = 2 * sum(state.sources for state in states)
            self.cross = [
                _stacked(list(layer), axis=2, size=width, slots=slots)
                for layer in zip(*(state.cross for state in states), strict=True)
            ]
            self.source_mask = _stacked([s.source_mask for s in states], 1, width, slots=slots)
            self.rooms = [array.base for array in (*self.cross, self.source_mask)]
        start, total = self.rows, sum(state.rows for state in states)
        longest = max(int(state.positions.max(initial=0)) for state in states)
        self.reserve(total, max(longest, self.capacity))
        _copy_caches(joining, into=self.past, start=start)
        self.positions = np.concatenate([state.positions for state in states])
        if any(state.prefix.shape[1] for state in states):
            raise ValueError("the no-cache decoder (benchmarks only) cannot join rows midway")
        self.prefix = np.zeros((self.rows, 0), dtype=np.int64)
        self.together = None
        self._buffers_changed()

    def _sources_written_in_place(self, joining: tuple[DecoderState, ...]) -> bool:
        """Write the joining states' sources after ours, in place, if the arrays ours lead
        have the room (see extend); False if they have not (nothing written)."""
        if self.rooms is None:
            return False
        arrays = (*self.cross, self.source_mask)
        rooms = [_room(a, room) for a, room in zip(arrays, self.rooms, strict=True)]
        width = self.source_mask.shape[1]
        count = sum(state.sources for state in joining)
        fits = all(int(state.source_mask.sum(axis=1).max(initial=0)) <= width for state in joining)
        if not fits or any(room is None or len(room) < self.sources + count for room in rooms):
            return False
        start = self.sources
        for state in joining:
            stop = start + state.sources
            for room, theirs in zip(rooms, (*state.cross, state.source_mask), strict=True):
                own = min(theirs.shape[-1 if theirs.ndim == 2 else 2], width)
                room[start:stop] = 0  # padding: zeros, False in the mask
                if theirs.ndim == 2:  # the mask [sources, S]
                    room[start:stop, :own] = theirs[:, :own]
                else:  # keys or values [sources, H, S, Dh]
                    room[start:stop, :, :own] = theirs[:, :, :own]
            start = stop
        *cross, mask = [room[:start] for room in rooms]
        self.cross, self.source_mask = cross, mask
        return True

    @staticmethod
    def rows_together(states: list[DecoderState]) -> DecoderState:
        """The rows of `states` as one state with one row per source (see
        DecoderState.rows_together): each row gets its own copy of its source's keys and
        values; the caches are copied into new buffers, their real positions only."""
        width = max(state.source_mask.shape[1] for state in states)
        copies = [state.rows // state.sources for state in states]
        total = sum(state.rows for state in states)
        capacity = max(state.capacity for state in states)
        template = states[0].past[0]
        shape = (total, template.shape[1], capacity, template.shape[3])
        past = [np.empty(shape, dtype=template.dtype) for _ in states[0].past]
        _copy_caches(states, into=past, start=0)
        return InPlaceState(
            cross=[
                _stacked(list(layer), axis=2, size=width, copies=copies)
                for layer in zip(*(state.cross for state in states), strict=True)
            ],
            source_mask=_stacked([s.source_mask for s in states], 1, width, copies=copies),
            past=past,
            past_mask=None,
            positions=np.concatenate([state.positions for state in states]),
            prefix=np.zeros((total, 0), dtype=np.int64),
        )

    def take_rows_of(self, stepped: DecoderState, start: int, stop: int) -> None:
        """After a step of rows_together(...): this state's rows are start..stop of `stepped`
        (views of its buffers: until it joins or grows, it writes into them)."""
        self.past = [buffer[start:stop] for buffer in stepped.past]
        self.positions = stepped.positions[start:stop]
        self.together = (stepped, start)
        self._buffers_changed()

    @staticmethod
    def went_on_together(states: list[DecoderState]) -> DecoderState | None:
        """rows_together(states) without copying, where the states are still the rows of the
        last step taken together, in their places (see DecoderState.went_on_together)."""
        previous = _last_together(states)
        if previous is None:
            return None
        previous.positions = np.concatenate([state.positions for state in states])
        return previous


def _copy_caches(states, into: list[np.ndarray], start: int) -> None:
    """Each state's rows, one state after the other from row `start` of the buffers `into`:
    their real positions only (what follows them is never read)."""
    for state in states:
        length = int(state.positions.max(initial=0))
        if length:
            for mine, theirs in zip(into, state.past, strict=True):
                mine[start : start + state.rows, :, :length] = theirs[: state.rows, :, :length]
        start += state.rows


def _last_together(states: list[DecoderState]) -> DecoderState | None:
    """The state of the last step taken together, if `states` are its rows, in the same order,
    and each one's caches are still views of its caches, in their places; else None."""
    if not states or states[0].together is None:
        return None
    previous = states[0].together[0]
    start = 0
    for state in states:
        if state.together != (previous, start):
            return None
        for mine, whole in zip(state.past, previous.past, strict=True):
            if mine.shape != (state.rows, *whole.shape[1:]) or _address(mine) != (
                _address(whole) + start * whole.strides[0]
            ):
                return None
        start += state.rows
    return previous if start == previous.rows else None


def _room(array: np.ndarray, room: np.ndarray | None) -> np.ndarray | None:
    """`room` if `array` is still its leading part along axis 0 (the same entries' shape,
    starting where it starts), else None (the array was replaced since)."""
    if (
        room is not None
        and array.base is room
        and room.shape[1:] == array.shape[1:]
        and _address(room) == _address(array)
    ):
        return room
    return None


def _empty_buffer(like: np.ndarray, rows: int) -> np.ndarray:
    """A cache buffer for `rows` rows and no positions yet (reserve grows it)."""
    return np.empty((rows, like.shape[1], 0, like.shape[3]), dtype=like.dtype)


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _leading_padding(past_mask: np.ndarray) -> int:
    """Cache columns, in front, that are padding for every row of past_mask [rows, P]."""
    return int(np.argmax(past_mask.any(axis=0))) if past_mask.size else 0


def _stacked_states(
    states: list[DecoderState], width: int, length: int, row_per_source: bool
) -> DecoderState:
    """The states' sources and rows one after the other: sources padded (right) to `width`,
    caches (left) to `length` (both may cut padding). With row_per_source every row gets its
    own copy of its source's keys/values (states of different rows per source, stepped as
    one); otherwise sources stay shared by their rows."""

    # How many times each state's sources are written: once per row, or once.
    copies = [state.rows // state.sources if row_per_source else 1 for state in states]
    return DecoderState(
        cross=[
            _stacked(list(layer), axis=2, size=width, copies=copies)
            for layer in zip(*(state.cross for state in states), strict=True)
        ],
        source_mask=_stacked([s.source_mask for s in states], 1, width, copies=copies),
        past=[
            _stacked(list(layer), axis=2, size=length, left=True)
            for layer in zip(*(state.past for state in states), strict=True)
        ],
        past_mask=_stacked([state.past_mask for state in states], 1, length, left=True),
        positions=np.concatenate([state.positions for state in states]),
        prefix=np.zeros((sum(state.rows for state in states), 0), dtype=np.int64),
    )


class _Moves:
    """array[order] along axis 0 (len(order) <= len(array)), written into array itself: only
    the entries that change places are copied, and apply() returns the leading len(order)
    entries. Where most entries move (beams reordered), one gather into a new array is
    cheaper, unless `always`: moving in place copies each moved entry twice (gathered, then
    written). Which entries move is worked out once, for every array moved the same way
    (the caches of all layers)."""

    def __init__(self, order: np.ndarray, always: bool = False) -> None:
        self.order = order
        self.moved = np.flatnonzero(order != np.arange(len(order)))
        self.gather = 2 * len(self.moved) > len(order) and not always
        self.origins = order[self.moved]  # where each moved entry comes from

    def apply(self, array: np.ndarray) -> np.ndarray:
        if self.gather:
            return np.take(array, self.order, axis=0)
        if len(self.moved):
            array[self.moved] = array[self.origins]  # the right side is gathered first
        return array[: len(self.order)]


def _stacked(
    parts: list[np.ndarray],
    axis: int,
    size: int,
    left: bool = False,
    copies: list[int] | None = None,
    slots: int = 0,
) -> np.ndarray:
    """The parts one after the other along axis 0, each zero-padded (False for masks) along
    `axis` to `size`, at its end or its start (left): one new array, each part copied once,
    or, with `copies`, each of a part's entries copies[i] times in a row (np.repeat, written
    straight into its place). A part wider than `size` keeps only its first `size` (left:
    last) entries along `axis`: the caller knows the rest are padding. `slots`: made with
    room for that many entries, and the leading part returned (InPlaceState's sources)."""
    copies = copies or [1] * len(parts)
    shape = list(parts[0].shape)
    shape[0] = sum(len(part) * count for part, count in zip(parts, copies, strict=True))
    shape[axis] = size
    if slots > shape[0]:
        room = np.zeros([slots, *shape[1:]], dtype=parts[0].dtype)
        out = room[: shape[0]]
    else:
        out = np.zeros(shape, dtype=parts[0].dtype)
    start = 0
    for part, count in zip(parts, copies, strict=True):
        # Its place, seen as [entries, copies, ...]: the part broadcasts over the copies.
        rows = len(part) * count
        target = out[start : start + rows].reshape(len(part), count, *shape[1:], copy=False)
        width = min(part.shape[axis], size)
        place = [slice(None)] * target.ndim
        take = [slice(None)] * part.ndim
        place[axis + 1] = slice(size - width, size) if left else slice(0, width)
        take[axis] = slice(part.shape[axis] - width, None) if left else slice(0, width)
        target[tuple(place)] = part[tuple(take)][:, None]
        start += rows
    return out


@functools.cache
def _top_k_input(top_k: int) -> np.ndarray:
    """The step's top_k input (a 0-d int64 array), made once per value; read-only, as it is
    shared by every step."""
    array = np.array(top_k, dtype=np.int64)
    array.flags.writeable = False
    return array


@functools.cache
def _true_column(rows: int) -> np.ndarray:
    """[rows, 1] of True: the new position of every row's past_mask, made once per row count
    (at most the largest batch's rows); read-only, as it is shared by every step."""
    column = np.ones((rows, 1), dtype=bool)
    column.flags.writeable = False
    return column


@dataclass
class StepResult:
    top_log_probs: np.ndarray  # [rows, k], best first
    top_ids: np.ndarray  # [rows, k] int64
    alignment: np.ndarray | None = None  # [rows, S], only when asked for
    attention: np.ndarray | None = None  # [rows, L, H, S], only when asked for
    log_probs: np.ndarray | None = None  # [rows, V], only from step_log_probs


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
        # Per (alignment, attention) asked for: the step's optional outputs, and every output
        # name to ask for (made here, not at every step: a step's Python costs tens of µs).
        self._step_outputs: dict[tuple[bool, bool], tuple[list[str], list[str]]] = {}
        for alignment, attention in itertools.product((False, True), repeat=2):
            extra = ["alignment"] * alignment + self.attention_names * attention
            asked = ["top_log_probs", "top_ids", *extra, *self.present_names]
            self._step_outputs[alignment, attention] = (extra, asked)
        # The encoder runs once per batch, right before the decoder's steps: its threads must
        # not spin then, or they take the cores the decoder's threads need.
        encoder_options = dataclasses.replace(self.options, spinning=False)
        self.encoder = _session(bundle.graph("encoder", self.options.int8), encoder_options)
        self._ahead_encoder: ort.InferenceSession | None = None
        role = "decoder" if self.options.use_cache else "decoder_nocache"
        self.shortlist: Shortlist | None = None
        if self.options.shortlist:
            if not self.options.use_cache:
                raise ValueError("the shortlist needs the cached decoder")
            role = "decoder_shortlist"
            shortlist_path, projection_path = bundle.shortlist_files()
            self.shortlist = Shortlist.load(shortlist_path)
            self.projection = np.load(projection_path)  # [D, V]
            fits = self.shortlist.fits(self.vocab_size)
            if not fits or self.projection.shape[1] != self.vocab_size:
                raise BundleError(
                    f"{bundle.path}: the shortlist does not fit the model's {self.vocab_size} "
                    "words: rebuild it with `nmt shortlist` and re-export"
                )
        # The in-place decoder (self-attention caches written where they are) when the bundle
        # has one; not for the shortlist's step, which concatenates.
        self.in_place = (
            self.options.in_place
            and self.options.use_cache
            and self.shortlist is None
            and IN_PLACE_DECODER in bundle.manifest["graphs"]
        )
        if self.in_place:
            role = IN_PLACE_DECODER
        elif self.options.in_place and role == "decoder":
            log.info(
                "%s has no in-place decoder step (exported before it existed): its steps "
                "copy the cache; re-export it with `nmt export` for the faster step",
                bundle.path,
            )
        self.decoder = _session(bundle.graph(role, self.options.int8), self.options)
        if self.options.use_cache:
            self._check_decoder_names(bundle)

    def _check_decoder_names(self, bundle: Bundle) -> None:
        """A graph from an older exporter under the same format number would fail at the
        first request that needs a missing name: refuse it at load, saying what to do."""
        inputs = {value.name for value in self.decoder.get_inputs()}
        outputs = {value.name for value in self.decoder.get_outputs()}
        needed_inputs = {"target_ids", "source_mask", "top_k", "positions"}
        needed_inputs |= set() if self.in_place else {"past_mask"}
        needed_inputs |= {*self.past_names, *self.cross_names}
        needed_outputs = {"top_log_probs", "top_ids", "alignment", *self.attention_names}
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
    ) -> DecoderState:
        """Encode a batch: source_ids [sources, S] int64, source_mask [sources, S] bool.
        Decoding then runs rows_per_source rows (beams) for every source. `ahead`: on a thread
        of its own while the decoder runs (continuous batching's encoder thread), with one
        intra-op thread, so that encoder and decoder together take one thread more than the
        decoder alone, whatever NMT_THREADS is."""
        session = self._ahead_session() if ahead else self.encoder
        cross = session.run(
            self.cross_names, {"source_ids": source_ids, "source_mask": source_mask}
        )
        rows = source_ids.shape[0] * rows_per_source
        empty = np.zeros((rows, self.heads, 0, self.head_dim), dtype=np.float32)
        if self.in_place:
            return InPlaceState(
                cross=cross,
                source_mask=source_mask,
                past=[_empty_buffer(empty, rows) for _ in self.past_names],
                past_mask=None,
                positions=np.zeros(rows, dtype=np.int64),
                prefix=np.zeros((rows, 0), dtype=np.int64),
            )
        vocabulary = None
        if self.shortlist is not None:
            vocabulary = self.shortlist.vocabulary_for(source_ids[source_mask])
        return DecoderState(
            cross=cross,
            source_mask=source_mask,
            past=[empty] * len(self.past_names),
            past_mask=np.zeros((rows, 0), dtype=bool),
            positions=np.zeros(rows, dtype=np.int64),
            prefix=np.zeros((rows, 0), dtype=np.int64),
            vocabulary=vocabulary,
        )

    def _ahead_session(self) -> ort.InferenceSession:
        """The encoder session for encoding ahead: the encoder's own with one thread, else a
        second one with a single thread (made at first use; its weights once more in memory)."""
        if self.options.intra_op_threads == 1:
            return self.encoder
        if self._ahead_encoder is None:
            single = dataclasses.replace(self.options, intra_op_threads=1, spinning=False)
            self._ahead_encoder = _session(self.bundle.graph("encoder", self.options.int8), single)
        return self._ahead_encoder

    def step(
        self,
        state: DecoderState,
        tokens: np.ndarray,
        top_k: int,
        want_alignment: bool = False,
        want_attention: bool = False,
    ) -> StepResult:
        """Feed every row its next input token, tokens [rows] int64 (the start token first).

        Updates the state's cache in place and returns each row's top_k next tokens with
        their log-probs (selected in the graph, so [rows, V] never leaves it), and when asked
        for this step's cross-attention weights: the alignment [rows, S] (last layer, head
        mean) and every layer's and head's weights [rows, L, H, S].
        """
        return self._run(state, tokens, top_k, want_alignment, want_attention)

    def step_log_probs(
        self, state: DecoderState, tokens: np.ndarray, want_alignment: bool = False
    ) -> StepResult:
        """Like step, but with the full log-probs [rows, V] (for checks against torch): the
        top V, put back in vocabulary order."""
        result = self._run(state, tokens, self.vocab_size, want_alignment, False)
        # With a shortlist only the candidates have a log-prob; the other words cannot be
        # written: -inf.
        log_probs = np.full((state.rows, self.vocab_size), -np.inf, dtype=np.float32)
        np.put_along_axis(log_probs, result.top_ids, result.top_log_probs, axis=1)
        result.log_probs = log_probs
        return result

    def _run(
        self, state: DecoderState, tokens: np.ndarray, top_k: int, alignment: bool, attention: bool
    ) -> StepResult:
        if self.in_place:  # (its inputs stay bound: no feeds to build)
            return self._run_in_place(state, tokens, top_k, alignment, attention)
        if self.shortlist is not None:  # k of the C candidates at most
            top_k = min(top_k, len(state.vocabulary))
        feeds = {
            "source_mask": state.source_mask,
            "top_k": _top_k_input(top_k),
            **dict(zip(self.cross_names, state.cross, strict=True)),
        }
        outputs = ["top_log_probs", "top_ids"]
        if not self.options.use_cache:
            if alignment or attention:  # that graph has no such output: say so, not crash
                raise ValueError("the no-cache decoder (benchmarks only) returns no alignment")
            # Recompute every position of the prefix: what decoding costs without the cache.
            state.prefix = np.concatenate([state.prefix, tokens[:, None]], axis=1)
            feeds["target_ids"] = state.prefix
            return StepResult(*self.decoder.run(outputs, feeds))
        feeds["target_ids"] = tokens[:, None]
        if self.shortlist is not None:
            if state.projection is None:  # once per vocabulary, not per step
                state.projection = np.ascontiguousarray(self.projection[:, state.vocabulary])
            feeds["vocabulary"] = state.vocabulary
            feeds["output_projection"] = state.projection
        feeds["past_mask"] = state.past_mask
        feeds["positions"] = state.positions
        feeds.update(zip(self.past_names, state.past, strict=True))
        extra, asked = self._step_outputs[alignment, attention]
        values = self.decoder.run(asked, feeds)
        found = dict(zip(outputs + extra, values, strict=False))
        state.past = values[len(outputs) + len(extra) :]
        state.together = None  # (if it was) its caches are its own again
        if attention:  # [rows, L, H, S]
            found = {name: found[name] for name in (*outputs, "alignment") if name in found} | {
                "attention": np.stack([found[name] for name in self.attention_names], axis=1)
            }
        # The new position is real for every row, and each row moves on by one.
        state.past_mask = np.concatenate([state.past_mask, _true_column(state.rows)], axis=1)
        state.positions = state.positions + 1
        return StepResult(**found)

    def _run_in_place(
        self, state: InPlaceState, tokens: np.ndarray, top_k: int, alignment: bool, attention: bool
    ) -> StepResult:
        """A step of the in-place decoder through IO binding: the cache buffers are bound as
        both past and present (the graph writes each row's new position into them); the
        tokens, positions and outputs are arrays of the state's, bound once and written or
        copied out at each step. Binding a name costs a few microseconds through ONNX
        Runtime's Python API, so the binding is kept in the state and made again only when
        its arrays changed (rows joined or left, buffers grew) or other outputs are asked for."""
        rows = state.rows
        state.reserve(rows, int(state.positions.max(initial=0)) + 1)  # room for the new one
        k = min(top_k, self.vocab_size)
        if state.bound != (k, alignment, attention):
            state.binding, state.io = self._bind_state(state, k, alignment, attention)
            state.bound = (k, alignment, attention)
        io = state.io
        io["target_ids"][:, 0] = tokens
        io["positions"][:] = state.positions
        self.decoder.run_with_iobinding(state.binding)
        state.positions = state.positions + 1  # every row moves on by one
        # Copies: the arrays are written again by the next step, the results are the caller's.
        result = StepResult(io["top_log_probs"].copy(), io["top_ids"].copy())
        if alignment:
            result.alignment = io["alignment"].copy()
        if attention:  # [L, rows, H, S] -> [rows, L, H, S]
            result.attention = np.ascontiguousarray(io["attention"].transpose(1, 0, 2, 3))
        return result

    def _bind_state(
        self, state: InPlaceState, k: int, alignment: bool, attention: bool
    ) -> tuple[ort.IOBinding, dict[str, np.ndarray]]:
        """A new binding for the state's steps, and the arrays bound besides the caches: the
        sources' keys and values and the cache buffers (their leading slots, one per row, as
        both past and present) as they are; the tokens, positions and outputs to new arrays."""
        rows, width = state.rows, state.source_mask.shape[1]
        binding = self.decoder.io_binding()
        io = {
            "target_ids": np.zeros((rows, 1), dtype=np.int64),
            "positions": np.zeros(rows, dtype=np.int64),
            "top_k": _top_k_input(k),
            "top_log_probs": np.empty((rows, k), dtype=np.float32),
            "top_ids": np.empty((rows, k), dtype=np.int64),
        }
        inputs = {"source_mask": state.source_mask}
        inputs |= dict(zip(self.cross_names, state.cross, strict=True))
        inputs |= {name: io[name] for name in ("target_ids", "positions", "top_k")}
        outputs = {name: io[name] for name in ("top_log_probs", "top_ids")}
        if alignment:
            outputs["alignment"] = io["alignment"] = np.empty((rows, width), dtype=np.float32)
        if attention:  # one array for all layers, each layer's part contiguous
            io["attention"] = np.empty((self.layers, rows, self.heads, width), dtype=np.float32)
            outputs |= dict(zip(self.attention_names, io["attention"], strict=True))
        for past, present, buffer in zip(
            self.past_names, self.present_names, state.past, strict=True
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
        return binding, io
