"""DecoderState's bookkeeping when rows leave and join, on made-up arrays (no model): the
result must equal plain numpy indexing of the old arrays, and rows that stay must not move."""

from __future__ import annotations

import numpy as np
import pytest

from service.runtime.engine import DecoderState
from service.runtime.running_batch import _filling_holes

HEADS, HEAD_DIM, LAYERS = 2, 3, 2


def state(rows: int, past: int, source_lengths: list[int], joined: list[int]) -> DecoderState:
    """rows // len(source_lengths) rows per source; row r's cache holds its last
    `past - joined[r]` columns (it joined `joined[r]` steps after the first)."""
    rng = np.random.default_rng(rows * 100 + past)
    width = max(source_lengths)
    source_mask = np.arange(width)[None, :] < np.array(source_lengths)[:, None]
    past_mask = np.arange(past)[None, :] >= np.array(joined)[:, None]
    sources = len(source_lengths)
    return DecoderState(
        cross=[
            rng.standard_normal((sources, HEADS, width, HEAD_DIM)).astype(np.float32)
            for _ in range(2 * LAYERS)
        ],
        source_mask=source_mask,
        past=[
            rng.standard_normal((rows, HEADS, past, HEAD_DIM)).astype(np.float32)
            * past_mask[:, None, :, None]
            for _ in range(2 * LAYERS)
        ],
        past_mask=past_mask,
        positions=past - np.array(joined),
        prefix=np.zeros((rows, 0), dtype=np.int64),
    )


def test_filling_holes_keeps_what_stays_in_place() -> None:
    kept = np.array([0, 2, 3, 5])
    assert kept[_filling_holes(kept)].tolist() == [0, 5, 2, 3]
    assert np.array([3, 4])[_filling_holes(np.array([3, 4]))].tolist() == [3, 4]
    everything = np.arange(5)
    assert _filling_holes(everything).tolist() == everything.tolist()
    assert _filling_holes(np.zeros(0, dtype=np.int64)).tolist() == []


def test_rows_that_leave_are_filled_in_place_and_the_others_do_not_move() -> None:
    decoder = state(rows=6, past=8, source_lengths=[4, 6, 5, 3, 6, 2], joined=[0] * 6)
    before = [cache.copy() for cache in decoder.past]
    buffers = list(decoder.past)
    rows = np.array([0, 5, 2, 3])  # row 1 and 4 left; row 5 takes row 1's place
    decoder.select_rows(rows)
    for old, new, buffer in zip(before, decoder.past, buffers, strict=True):
        np.testing.assert_array_equal(new, old[rows])
        assert np.shares_memory(new, buffer)  # no new array: written into the old one
        assert new.flags.c_contiguous  # ONNX Runtime reads it without a copy
    sources = np.array([0, 5, 2, 3])
    cross_before = [layer.copy() for layer in decoder.cross]
    decoder.select_sources(sources)
    for old, new in zip(cross_before, decoder.cross, strict=True):
        np.testing.assert_array_equal(new, old[sources][:, :, : new.shape[2]])
        assert new.flags.c_contiguous


@pytest.mark.parametrize(
    "rows",
    [
        [1, 1, 0, 3, 6, 4, 4, 7],  # most beams continue another beam: one gather
        [0, 0, 2, 3, 4, 5, 7, 7],  # two move: in place
    ],
)
def test_beams_reordered_equal_a_gather(rows: list[int]) -> None:
    decoder = state(rows=8, past=5, source_lengths=[3, 4], joined=[0] * 8)
    before = [cache.copy() for cache in decoder.past]
    decoder.select_rows(np.array(rows))
    for old, new in zip(before, decoder.past, strict=True):
        np.testing.assert_array_equal(new, old[rows])
        assert new.flags.c_contiguous


def test_padding_every_row_has_left_behind_is_cut_when_it_is_a_quarter() -> None:
    # Rows 0 and 1 started first; rows 2 and 3 joined 3 and 5 steps later (left-padded).
    decoder = state(rows=4, past=8, source_lengths=[5] * 4, joined=[0, 0, 3, 5])
    before = [cache.copy() for cache in decoder.past]
    decoder.select_rows(np.array([2, 3]))  # the first rows left: 3 of 8 columns are padding
    assert decoder.past_mask.shape[1] == 5
    for old, new in zip(before, decoder.past, strict=True):
        np.testing.assert_array_equal(new, old[[2, 3], :, 3:])
    np.testing.assert_array_equal(decoder.positions, [5, 3])

    small = state(rows=4, past=8, source_lengths=[5] * 4, joined=[0, 1, 1, 5])
    small.select_rows(np.array([2, 3, 1]))  # one column of eight: not worth a copy now
    assert small.past_mask.shape[1] == 8


def test_a_join_cuts_the_padding_the_leavers_left_and_keeps_every_row_right_aligned() -> None:
    decoder = state(rows=3, past=6, source_lengths=[6, 4, 5], joined=[0, 1, 1])
    # Row 0 leaves: one cache column of six and one source column of six are padding now,
    # for every row; not worth a copy of their own.
    decoder.select_rows(np.array([1, 2]))
    decoder.select_sources(np.array([1, 2]))
    assert decoder.past_mask.shape[1] == 6 and decoder.source_mask.shape[1] == 6
    kept_past = [cache.copy() for cache in decoder.past]
    kept_cross = [layer.copy() for layer in decoder.cross]
    joining = state(rows=1, past=0, source_lengths=[2], joined=[0])
    decoder.extend(joining)
    # The join copies anyway, and cuts them: 5 cache columns, sources of at most 5 words.
    assert decoder.past_mask.shape == (3, 5) and decoder.source_mask.shape == (3, 5)
    assert decoder.past_mask[:2].all() and not decoder.past_mask[2].any()
    for old, new in zip(kept_past, decoder.past, strict=True):
        np.testing.assert_array_equal(new[:2], old[:, :, 1:])
        assert not new[2].any()
    for old, new, added in zip(kept_cross, decoder.cross, joining.cross, strict=True):
        np.testing.assert_array_equal(new[:2], old[:, :, :5])
        np.testing.assert_array_equal(new[2, :, :2], added[0])
        assert not new[2, :, 2:].any()
    assert decoder.source_mask.sum(axis=1).tolist() == [4, 5, 2]
    np.testing.assert_array_equal(decoder.positions, [5, 5, 0])


def test_rows_together_equal_numpy_repeat_and_padding() -> None:
    greedy = state(rows=2, past=3, source_lengths=[4, 2], joined=[0, 1])
    beams = state(rows=6, past=5, source_lengths=[3, 5], joined=[0, 0, 0, 2, 2, 2])
    together = DecoderState.rows_together([greedy, beams])  # 3 beams a source: 3 copies each

    def expected(arrays: list[np.ndarray], copies: list[int], axis: int, size: int, left: bool):
        padded = []
        for array, count in zip(arrays, copies, strict=True):
            widths = [(0, 0)] * array.ndim
            missing = size - array.shape[axis]
            widths[axis] = (missing, 0) if left else (0, missing)
            padded.append(np.pad(np.repeat(array, count, axis=0), widths))
        return np.concatenate(padded)

    for mine, a, b in zip(together.cross, greedy.cross, beams.cross, strict=True):
        np.testing.assert_array_equal(mine, expected([a, b], [1, 3], 2, 5, left=False))
    masks = [greedy.source_mask, beams.source_mask]
    np.testing.assert_array_equal(together.source_mask, expected(masks, [1, 3], 1, 5, False))
    for mine, a, b in zip(together.past, greedy.past, beams.past, strict=True):
        np.testing.assert_array_equal(mine, expected([a, b], [1, 1], 2, 5, left=True))
    masks = [greedy.past_mask, beams.past_mask]
    np.testing.assert_array_equal(together.past_mask, expected(masks, [1, 1], 1, 5, True))
    np.testing.assert_array_equal(together.positions, [3, 2, 5, 5, 5, 3, 3, 3])


def stepped_together(states: list[DecoderState]) -> DecoderState:
    """What a step of states taken together leaves behind, without a model: their rows as one
    state (going on from the last step where it can) whose caches got one new column each,
    and every state holding its rows of it, as step_together does."""
    together = DecoderState.went_on_together(states) or DecoderState.rows_together(states)
    rng = np.random.default_rng(together.rows)
    new = rng.standard_normal((together.rows, HEADS, 1, HEAD_DIM)).astype(np.float32)
    together.past = [np.concatenate([cache, new], axis=2) for cache in together.past]
    together.past_mask = np.concatenate(
        [together.past_mask, np.ones((together.rows, 1), dtype=bool)], axis=1
    )
    together.positions = together.positions + 1
    start = 0
    for part in states:
        part.take_rows_of(together, start, start + part.rows)
        start += part.rows
    return together


def test_a_step_together_goes_on_from_the_last_while_nobody_joins_or_leaves() -> None:
    greedy = state(rows=2, past=3, source_lengths=[4, 2], joined=[0, 1])
    beams = state(rows=6, past=5, source_lengths=[3, 5], joined=[0] * 6)  # 3 beams a source
    last = stepped_together([greedy, beams])
    # The beams reorder within their sentences: most rows move, still in place.
    beams.select_rows(np.array([1, 1, 0, 5, 3, 3]))
    went_on = DecoderState.went_on_together([greedy, beams])
    assert went_on is not None
    restacked = DecoderState.rows_together([greedy, beams])  # what it would copy
    for mine, copied, old in zip(went_on.past, restacked.past, last.past, strict=True):
        np.testing.assert_array_equal(mine, copied)
        assert mine is old  # the last step's caches, not a copy
    for mine, copied in zip(went_on.cross, restacked.cross, strict=True):
        np.testing.assert_array_equal(mine, copied)  # one copy per row, of its own source
    np.testing.assert_array_equal(went_on.source_mask, restacked.source_mask)
    np.testing.assert_array_equal(went_on.past_mask, restacked.past_mask)
    np.testing.assert_array_equal(went_on.positions, restacked.positions)


def test_a_step_together_stacks_again_after_any_change() -> None:
    def two() -> list[DecoderState]:
        parts = [
            state(rows=2, past=3, source_lengths=[4, 2], joined=[0, 1]),
            state(rows=4, past=2, source_lengths=[3, 5], joined=[0] * 4),
        ]
        stepped_together(parts)
        return parts

    greedy, beams = two()
    assert DecoderState.went_on_together([beams, greedy]) is None  # another order
    greedy, beams = two()
    assert DecoderState.went_on_together([greedy]) is None  # not all of them
    greedy, beams = two()
    beams.select_rows(np.array([2, 3]))  # a sentence left
    assert DecoderState.went_on_together([greedy, beams]) is None
    greedy, beams = two()
    greedy.extend(state(rows=1, past=0, source_lengths=[3], joined=[0]))  # one joined
    assert DecoderState.went_on_together([greedy, beams]) is None
    greedy, beams = two()
    beams.past = [cache.copy() for cache in beams.past]  # (a step alone replaces them)
    assert DecoderState.went_on_together([greedy, beams]) is None
