"""InPlaceState's bookkeeping (caches written in place) on made-up arrays, no model.

Each row's cache is the first positions[r] positions of its slot in a buffer; what follows
is never read. The reference for every operation is plain numpy on the rows' real caches,
and the point of the layout is checked too: what should not be copied is not (the same
buffers, rows that stay untouched, joins of empty rows writing nothing)."""

from __future__ import annotations

import numpy as np

from service.runtime.engine import InPlaceState

HEADS, HEAD_DIM, LAYERS = 2, 3, 2
GARBAGE = 99.0  # what a buffer holds after each row's real positions: must never be read


def state(lengths: list[int], source_lengths: list[int], capacity: int = 8) -> InPlaceState:
    """len(lengths) // len(source_lengths) rows per source; row r's cache holds lengths[r]
    positions (random), the rest of its slot is GARBAGE."""
    rows, sources = len(lengths), len(source_lengths)
    rng = np.random.default_rng(rows * 100 + sum(lengths))
    width = max(source_lengths)
    past = []
    for _ in range(2 * LAYERS):
        buffer = np.full((rows, HEADS, capacity, HEAD_DIM), GARBAGE, dtype=np.float32)
        for row, length in enumerate(lengths):
            buffer[row, :, :length] = rng.standard_normal((HEADS, length, HEAD_DIM))
        past.append(buffer)
    return InPlaceState(
        cross=[
            rng.standard_normal((sources, HEADS, width, HEAD_DIM)).astype(np.float32)
            for _ in range(2 * LAYERS)
        ],
        source_mask=np.arange(width)[None, :] < np.array(source_lengths)[:, None],
        past=past,
        past_mask=None,
        positions=np.array(lengths, dtype=np.int64),
        prefix=np.zeros((rows, 0), dtype=np.int64),
    )


def real_caches(decoder: InPlaceState) -> list[list[np.ndarray]]:
    """Per buffer, each row's real cache [H, positions[r], Dh]."""
    return [
        [buffer[row, :, :length].copy() for row, length in enumerate(decoder.positions)]
        for buffer in decoder.past
    ]


def assert_caches_equal(found: list[list[np.ndarray]], expected: list[list[np.ndarray]]) -> None:
    for found_rows, expected_rows in zip(found, expected, strict=True):
        for mine, theirs in zip(found_rows, expected_rows, strict=True):
            np.testing.assert_array_equal(mine, theirs)


def test_rows_that_leave_are_filled_in_place_and_the_others_do_not_move() -> None:
    decoder = state(lengths=[5, 3, 4, 5, 2, 1], source_lengths=[4, 6, 5, 3, 6, 2])
    before = real_caches(decoder)
    buffers = list(decoder.past)
    stays = [buffer[[0, 2, 3]].copy() for buffer in buffers]  # whole slots, garbage included
    rows = np.array([0, 5, 2, 3])  # rows 1 and 4 left; row 5 takes row 1's place
    decoder.select_rows(rows)
    assert decoder.positions.tolist() == [5, 1, 4, 5]
    assert_caches_equal(real_caches(decoder), [[r[i] for i in rows] for r in before])
    for buffer, old, kept in zip(decoder.past, buffers, stays, strict=True):
        assert buffer is old  # written into the old buffers
        np.testing.assert_array_equal(buffer[[0, 2, 3]], kept)  # rows that stay: untouched


def test_beams_reordered_equal_a_gather_of_the_real_positions() -> None:
    decoder = state(lengths=[4] * 4 + [2] * 4, source_lengths=[3, 4])
    before = real_caches(decoder)
    rows = np.array([1, 1, 0, 3, 6, 4, 4, 7])
    decoder.select_rows(rows)
    assert_caches_equal(real_caches(decoder), [[r[i] for i in rows] for r in before])


def test_a_join_of_new_sentences_copies_no_cache_while_the_buffers_have_room() -> None:
    decoder = state(lengths=[3, 2], source_lengths=[4, 2], capacity=8)
    decoder.select_rows(np.array([1]))  # row 0 left: a free slot
    decoder.select_sources(np.array([1]))
    before, buffers = real_caches(decoder), list(decoder.past)
    joining = state(lengths=[0], source_lengths=[5], capacity=0)
    decoder.extend(joining)
    assert [buffer is old for buffer, old in zip(decoder.past, buffers, strict=True)] == [True] * (
        2 * LAYERS
    )
    assert decoder.positions.tolist() == [2, 0]
    assert_caches_equal([r[:1] for r in real_caches(decoder)], before)
    assert decoder.source_mask.sum(axis=1).tolist() == [2, 5]
    for layer, added in zip(decoder.cross, joining.cross, strict=True):
        np.testing.assert_array_equal(layer[1], added[0])


def test_buffers_grow_when_rows_or_positions_run_out_and_keep_every_cache() -> None:
    decoder = state(lengths=[3, 1], source_lengths=[2, 3], capacity=3)
    before = real_caches(decoder)
    decoder.reserve(rows=2, length=4)  # a step would write position 3: no room
    assert decoder.capacity >= 4
    assert_caches_equal(real_caches(decoder), before)
    joining = state(lengths=[2, 2, 0], source_lengths=[1, 1, 1], capacity=2)  # stepped: copied
    decoder.extend(joining)
    assert decoder.past[0].shape[0] >= 5 and decoder.positions.tolist() == [3, 1, 2, 2, 0]
    joined = zip(before, real_caches(joining), strict=True)
    assert_caches_equal(real_caches(decoder), [a + b for a, b in joined])


def test_rows_together_copy_each_rows_real_cache_and_a_source_per_row() -> None:
    greedy = state(lengths=[3, 1], source_lengths=[4, 2])
    beams = state(lengths=[5] * 3 + [2] * 3, source_lengths=[3, 5])  # 3 beams a source
    together = InPlaceState.rows_together([greedy, beams])
    assert together.positions.tolist() == [3, 1, 5, 5, 5, 2, 2, 2]
    stacked = zip(real_caches(greedy), real_caches(beams), strict=True)
    assert_caches_equal(real_caches(together), [a + b for a, b in stacked])
    for mine, a, b in zip(together.cross, greedy.cross, beams.cross, strict=True):
        np.testing.assert_array_equal(mine[:2, :, :4], a)
        np.testing.assert_array_equal(mine[2:, :, :5], np.repeat(b, 3, axis=0))
    assert together.source_mask.sum(axis=1).tolist() == [4, 2, 3, 3, 3, 5, 5, 5]


def stepped_together(states: list[InPlaceState]) -> InPlaceState:
    """What a step of states taken together leaves behind, without a model: each row's new
    position written into the buffers, in place, and every state holding its rows of it."""
    together = InPlaceState.went_on_together(states) or InPlaceState.rows_together(states)
    together.reserve(together.rows, int(together.positions.max()) + 1)
    rng = np.random.default_rng(together.rows)
    for buffer in together.past:
        for row, position in enumerate(together.positions):
            buffer[row, :, position] = rng.standard_normal((HEADS, HEAD_DIM))
    together.positions = together.positions + 1
    start = 0
    for part in states:
        part.take_rows_of(together, start, start + part.rows)
        start += part.rows
    return together


def test_a_step_together_goes_on_from_the_last_until_someone_leaves() -> None:
    greedy = state(lengths=[3, 1], source_lengths=[4, 2])
    beams = state(lengths=[5] * 3 + [2] * 3, source_lengths=[3, 5])
    last = stepped_together([greedy, beams])
    beams.select_rows(np.array([1, 1, 0, 5, 3, 3]))  # beams reordered, in their slots
    greedy_alone = real_caches(greedy)
    went_on = InPlaceState.went_on_together([greedy, beams])
    assert went_on is last  # its buffers, its binding: nothing copied or bound again
    expected = InPlaceState.rows_together([greedy, beams])
    assert_caches_equal(real_caches(went_on), real_caches(expected))
    np.testing.assert_array_equal(went_on.positions, expected.positions)
    assert InPlaceState.went_on_together([beams, greedy]) is None  # another order
    beams.select_rows(np.array([0, 1, 2]))  # a sentence left
    assert InPlaceState.went_on_together([greedy, beams]) is None
    # A state grown out of the step's buffers has its own, and the others keep theirs.
    greedy.reserve(rows=4, length=greedy.capacity)
    assert not np.shares_memory(greedy.past[0], last.past[0])
    assert_caches_equal(real_caches(greedy), greedy_alone)


def test_sources_join_in_place_once_a_join_made_room_and_restack_when_wider() -> None:
    decoder = state(lengths=[2, 1], source_lengths=[4, 2], capacity=8)
    decoder.extend(state(lengths=[0], source_lengths=[3], capacity=0))  # stacked, with room
    first = [layer.copy() for layer in decoder.cross]
    arrays = [*decoder.cross, decoder.source_mask]
    joining = state(lengths=[0, 0], source_lengths=[1, 4], capacity=0)
    decoder.extend(joining)  # fits the width (4): written after the others, in place
    for old, new in zip(arrays, [*decoder.cross, decoder.source_mask], strict=True):
        assert new.base is old.base  # the same arrays, one source longer
    assert decoder.source_mask.sum(axis=1).tolist() == [4, 2, 3, 1, 4]
    for layer, before, added in zip(decoder.cross, first, joining.cross, strict=True):
        np.testing.assert_array_equal(layer[:3], before)
        np.testing.assert_array_equal(layer[3:5], added)  # (its padding too: the mask hides it)
    wider = state(lengths=[0], source_lengths=[6], capacity=0)
    decoder.extend(wider)  # wider than the arrays: all stacked again
    assert decoder.source_mask.shape == (6, 6)
    assert decoder.source_mask.sum(axis=1).tolist() == [4, 2, 3, 1, 4, 6]
    for layer, before in zip(decoder.cross, first, strict=True):
        np.testing.assert_array_equal(layer[:3, :, :4], before)
    decoder.select_sources(np.array([5, 1]))  # the others left; 5 moves into place 0
    decoder.extend(state(lengths=[0], source_lengths=[2], capacity=0))
    assert decoder.source_mask.sum(axis=1).tolist() == [6, 2, 2]
