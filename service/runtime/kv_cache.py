"""The keys and values a running batch's rows attend to, kept where a decoder step reads them.

Two kinds, both per decoder layer (keys_0, values_0, keys_1, ...):

* cross-attention: what the target (the query) asks of the source. The encoder computes each
  source sentence's keys and values once, [sources, H, S, Dh]: every step of every row of
  that sentence reads the same copy. In beam search the K rows (beams) of a sentence are K
  queries against it; nothing is repeated K times. They only move when sentences leave.
* self-attention: each row's own past, one position more per step. A buffer
  [capacity rows, H, capacity positions, Dh] per layer; row r is slot r of every buffer, its
  cache the slot's first positions[r] positions. The step graph writes each row's new key and
  value at its own position, into the buffer itself (the engine binds the same memory as the
  graph's past and present input/output). So:
  * a row that joins later just has a shorter cache: no padding, no mask;
  * joining copies no cache (a new row starts empty, in a free slot) unless a buffer must grow,
    which doubles it (a few times in a batch's life);
  * leaving and beam reordering copy the moved rows' real positions only.
  The rows in use are the buffers' leading slots, so the graph reads buffer[:rows] in place.

Rows are grouped by source: rows k*K .. k*K+K-1 belong to source k, K being the rows per
source (1 in greedy search). The graph derives K from the row and source counts, so every
source of one cache has the same K.

With a vocabulary shortlist, the cache also keeps each source's candidate target words: the
batch's vocabulary is their union, made again (with its slice of the output projection) after
sentences join or half of them left, never at every step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass
class KVCache:
    """cross: keys_0, values_0, ... each [sources, H, S, Dh]; source_mask [sources, S];
    past: self-attention buffers keys_0, values_0, ... each [capacity rows, H, capacity, Dh];
    positions [rows]: each row's cache length, the position of the token it feeds next;
    candidates: with a shortlist, each source's candidate target ids (ascending), else None;
    vocabulary [C] and projection [[D, C]] (int8: [[D, C] int8, [C] scales]): the union of
    the candidates and their output projection columns, made by the engine at the first step
    after sources joined, or after half of those it was made for left (None until
    then)."""

    cross: list[np.ndarray]
    source_mask: np.ndarray
    past: list[np.ndarray]
    positions: np.ndarray
    candidates: list[np.ndarray] | None = None
    vocabulary: np.ndarray | None = None
    projection: list[np.ndarray] | None = None
    vocabulary_sources: int = 0  # the sources the vocabulary was made for
    # The arrays of our own that cross and source_mask are the leading parts of, with room
    # for sources to join in place (extend); None until a join made them.
    rooms: list[np.ndarray] | None = None
    # The IO binding of the last step, the arrays bound besides the caches, and what it was
    # made for (Engine.step); bound is None when its arrays changed.
    binding: object | None = None
    io: dict | None = None
    bound: tuple | None = None
    # The binding was taken over from a spare (adopt) and still has the spare's sources bound:
    # the next step binds this cache's cross keys/values and source mask, nothing else.
    sources_stale: bool = False
    # After a step taken together with other caches (take_rows_of): that step's cache and the
    # first of our rows in it. Our buffers are then views of its buffers, and the next step
    # together can go on from it without stacking them again (went_on_together).
    together: tuple[KVCache, int] | None = None
    # positions.max() and the positions array it was worked out for (the property longest)
    _longest: int = 0
    _longest_of: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.positions)

    @property
    def longest(self) -> int:
        """The longest row's cache length: positions.max(), worked out once per positions
        array (a step asks for it, and only advance() or an assignment changes it)."""
        if self._longest_of is not self.positions:
            self._longest = int(self.positions.max(initial=0))
            self._longest_of = self.positions
        return self._longest

    def advance(self) -> None:
        """Every row moved on by one position (a decoder step wrote one more)."""
        longest = self.longest + 1
        self.positions = self.positions + 1
        self._longest, self._longest_of = longest, self.positions

    @property
    def sources(self) -> int:
        return len(self.source_mask)

    @property
    def capacity(self) -> int:
        return self.past[0].shape[2]

    def unbind(self) -> None:
        """Arrays a step reads were replaced or changed shape: the next step binds again."""
        self.bound = None

    def adopt(self, spare: KVCache) -> bool:
        """Take over a spare's self-attention buffers and IO binding: the spare is the last
        cache of a running batch whose sentences all left (Engine.keep_spare), of as many
        rows as this one, which has not stepped yet. Its buffers then need no allocating and
        its binding no making (about 0.1 ms a lone sentence on an AMD EPYC with AVX2, the
        "Python around the graph" table of docs/performance.md); the next step binds only
        this cache's sources. False (nothing taken) when the spare does not fit."""
        if spare.rows != self.rows or spare.together is not None or self.positions.any():
            return False
        self.past = spare.past  # (what was in them is never read: every row is empty)
        self.binding, self.io, self.bound = spare.binding, spare.io, spare.bound
        self.sources_stale = True
        return True

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
        used, longest = self.rows, self.longest
        grown = []
        for buffer in self.past:
            new = np.empty((new_rows, shape[1], new_length, shape[3]), dtype=buffer.dtype)
            new[:used, :, :longest] = buffer[:used, :, :longest]
            grown.append(new)
        self.past = grown
        self.together = None
        self.unbind()

    def select_rows(self, rows: np.ndarray, within_sources: bool = False) -> None:
        """Keep (and reorder) rows: rows[i] is the row that new row i continues (beam search
        reorders by beam origin; finished rows are left out). Only the rows that move are
        copied, and only the positions in use (the right side of the assignment is gathered
        first, so a row may move onto a place another row leaves). `within_sources`: every
        row stays among its own source's rows (beams reordered, nobody left), whose caches
        are as long: the positions stay as they are."""
        if len(rows) > self.past[0].shape[0]:
            self.reserve(len(rows), self.capacity)
        if len(rows) != self.rows:  # rows left: the next step together stacks them again
            self.together = None
            self.unbind()
        moved = (rows != _identity(len(rows))).nonzero()[0]  # (np.flatnonzero: more Python)
        if len(moved):
            # Up to the longest row's length: a moved row shorter than that brings positions
            # past its own, which nothing reads (the beams of a sentence are as long).
            longest = self.longest
            if longest:
                origins = rows[moved]
                for buffer in self.past:
                    buffer[moved, :, :longest] = buffer[origins, :, :longest]
            if not within_sources:
                self.positions = np.take(self.positions, rows)
        elif len(rows) != self.rows:
            self.positions = self.positions[: len(rows)].copy()

    def select_sources(self, sources: np.ndarray) -> None:
        """Keep the sources still being decoded (sources[i] is the source new source i was),
        moving only those that change places; the source padding none of them needs is cut
        when it is a quarter or more of the width (batches are length-sorted, so the longest
        often leave first)."""
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
        if self.candidates is not None:
            self.candidates = [self.candidates[i] for i in sources]
            # The vocabulary stays a superset of what the sources left need (harmless) until
            # half of the sources it was made for have left: gathering it again copies its
            # columns of the output projection, about 0.3 ms for 32 sources' (greedy batches
            # lose rows at most steps; at a quarter, batches of 32 took 1-3% longer).
            if 2 * len(sources) <= self.vocabulary_sources:
                self.vocabulary = self.projection = None
        self.unbind()

    def per_source(self) -> list[KVCache]:
        """One cache per source (views of the cross keys/values, no copy), for sources encoded
        together that may join at different times. Only for a cache that has not stepped."""
        if self.positions.any():
            raise ValueError("only a cache that has not stepped yet can be split")
        rows = self.rows // self.sources
        return [
            KVCache(
                cross=[layer[k : k + 1] for layer in self.cross],
                source_mask=self.source_mask[k : k + 1],
                past=[empty_buffer(buffer, rows) for buffer in self.past],
                positions=self.positions[k * rows : (k + 1) * rows],
                candidates=None if self.candidates is None else [self.candidates[k]],
            )
            for k in range(self.sources)
        ]

    def extend(self, *joining: KVCache) -> None:
        """Append other caches' sources and rows (sentences joining a running batch) after
        ours, in order, with the same rows per source. The new sources are written after
        ours, into the arrays ours are the leading part of when those have room (slots, and a
        width the new ones fit in), else all are stacked into new arrays, right-padded to the
        widest (the padding masked out of cross-attention), with room for as many sources
        again. The new rows take the next free slots, where an empty cache needs no copy (a
        cache that has stepped brings its real positions)."""
        caches = [self, *joining]
        if not self._sources_written_in_place(joining):
            width = max(int(cache.source_mask.sum(axis=1).max(initial=0)) for cache in caches)
            slots = 2 * sum(cache.sources for cache in caches)
            self.cross = [
                _stacked(list(layer), axis=2, size=width, slots=slots)
                for layer in zip(*(cache.cross for cache in caches), strict=True)
            ]
            self.source_mask = _stacked([c.source_mask for c in caches], 1, width, slots=slots)
            self.rooms = [array.base for array in (*self.cross, self.source_mask)]
        start, total = self.rows, sum(cache.rows for cache in caches)
        longest = max(cache.longest for cache in caches)
        self.reserve(total, max(longest, self.capacity))
        _copy_caches(joining, into=self.past, start=start)
        self.positions = np.concatenate([cache.positions for cache in caches])
        if self.candidates is not None:
            self.candidates = [c for cache in caches for c in cache.candidates]
            self.vocabulary = self.projection = None
        self.together = None
        self.unbind()

    def _sources_written_in_place(self, joining: tuple[KVCache, ...]) -> bool:
        """Write the joining caches' sources after ours, in place, if the arrays ours lead
        have the room (see extend); False if they have not (nothing written)."""
        if self.rooms is None:
            return False
        arrays = (*self.cross, self.source_mask)
        rooms = [_room(a, room) for a, room in zip(arrays, self.rooms, strict=True)]
        width = self.source_mask.shape[1]
        count = sum(cache.sources for cache in joining)
        fits = all(int(cache.source_mask.sum(axis=1).max(initial=0)) <= width for cache in joining)
        if not fits or any(room is None or len(room) < self.sources + count for room in rooms):
            return False
        start = self.sources
        for cache in joining:
            stop = start + cache.sources
            for room, theirs in zip(rooms, (*cache.cross, cache.source_mask), strict=True):
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
    def rows_together(caches: list[KVCache]) -> KVCache:
        """The rows of `caches` (each with its own rows per source) as one cache with one row
        per source, for one step: every row gets its own copy of its source's cross keys and
        values (sources right-padded to the widest); the self-attention caches are copied
        into new buffers, their real positions only."""
        width = max(cache.source_mask.shape[1] for cache in caches)
        copies = [cache.rows // cache.sources for cache in caches]
        total = sum(cache.rows for cache in caches)
        capacity = max(cache.capacity for cache in caches)
        template = caches[0].past[0]
        shape = (total, template.shape[1], capacity, template.shape[3])
        past = [np.empty(shape, dtype=template.dtype) for _ in caches[0].past]
        _copy_caches(caches, into=past, start=0)
        return KVCache(
            cross=[
                _stacked(list(layer), axis=2, size=width, copies=copies)
                for layer in zip(*(cache.cross for cache in caches), strict=True)
            ],
            source_mask=_stacked([c.source_mask for c in caches], 1, width, copies=copies),
            past=past,
            positions=np.concatenate([cache.positions for cache in caches]),
            # (the step scores the union of every source's candidates)
            candidates=None
            if caches[0].candidates is None
            else [c for cache in caches for c in cache.candidates],
        )

    def take_rows_of(self, stepped: KVCache, start: int, stop: int) -> None:
        """After a step of rows_together(...): this cache's rows are start..stop of `stepped`
        (views of its buffers: until it joins or grows, it writes into them)."""
        self.past = [buffer[start:stop] for buffer in stepped.past]
        self.positions = stepped.positions[start:stop]
        self.together = (stepped, start)
        self.unbind()

    @staticmethod
    def went_on_together(caches: list[KVCache]) -> KVCache | None:
        """rows_together(caches) without copying, where the caches are still the rows of the
        last step taken together, in the same order and in their places: nobody joined or
        left since (beams reordered in place). The cross keys/values (one copy per row) are
        that step's too: reordered beams share their source. None otherwise."""
        previous = _last_together(caches)
        if previous is None:
            return None
        previous.positions = np.concatenate([cache.positions for cache in caches])
        return previous


@functools.cache
def _identity(count: int) -> np.ndarray:
    """0 .. count-1, made once per count (read-only: shared by every cache)."""
    identity = np.arange(count)
    identity.flags.writeable = False
    return identity


def empty_buffer(like: np.ndarray, rows: int) -> np.ndarray:
    """A self-attention buffer for `rows` rows and no positions yet (reserve grows it)."""
    return np.empty((rows, like.shape[1], 0, like.shape[3]), dtype=like.dtype)


def _copy_caches(caches, into: list[np.ndarray], start: int) -> None:
    """Each cache's rows, one cache after the other from row `start` of the buffers `into`:
    their real positions only (what follows them is never read)."""
    for cache in caches:
        length = cache.longest
        if length:
            for mine, theirs in zip(into, cache.past, strict=True):
                mine[start : start + cache.rows, :, :length] = theirs[: cache.rows, :, :length]
        start += cache.rows


def _last_together(caches: list[KVCache]) -> KVCache | None:
    """The cache of the last step taken together, if `caches` are its rows, in the same order,
    and each one's buffers are still views of its buffers, in their places; else None."""
    if not caches or caches[0].together is None:
        return None
    previous = caches[0].together[0]
    start = 0
    for cache in caches:
        if cache.together != (previous, start):
            return None
        for mine, whole in zip(cache.past, previous.past, strict=True):
            if mine.shape != (cache.rows, *whole.shape[1:]) or _address(mine) != (
                _address(whole) + start * whole.strides[0]
            ):
                return None
        start += cache.rows
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


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


class _Moves:
    """array[order] along axis 0 (len(order) <= len(array)), written into array itself: only
    the entries that change places are copied, and apply() returns the leading len(order)
    entries. Where most entries move, one gather into a new array is cheaper: moving in place
    copies each moved entry twice (gathered, then written). Which entries move is worked out
    once, for every array moved the same way (the keys and values of all layers)."""

    def __init__(self, order: np.ndarray) -> None:
        self.order = order
        self.moved = np.flatnonzero(order != np.arange(len(order)))
        self.gather = 2 * len(self.moved) > len(order)
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
    copies: list[int] | None = None,
    slots: int = 0,
) -> np.ndarray:
    """The parts one after the other along axis 0, each zero-padded (False for masks) at its
    end along `axis` to `size`: one new array, each part copied once, or, with `copies`, each
    of a part's entries copies[i] times in a row (np.repeat, written straight into its place).
    A part wider than `size` keeps only its first `size` entries along `axis`: the caller
    knows the rest are padding. `slots`: made with room for that many entries, and the
    leading part returned (sources joining in place later)."""
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
        place[axis + 1] = slice(0, width)
        take[axis] = slice(0, width)
        target[tuple(place)] = part[tuple(take)][:, None]
        start += rows
    return out
