"""KVCache's bookkeeping (caches written in place) on made-up arrays, no model.

Each row's cache is the first positions[r] positions of its slot in a buffer; what follows
is never read. The reference for every operation is plain numpy on the rows' real caches,
and the point of the layout is checked too: what should not be copied is not (the same
buffers, rows that stay untouched, joins of empty rows writing nothing)."""

from __future__ import annotations

import numpy as np

from service.runtime.kv_cache import KVCache

HEADS, HEAD_DIM, LAYERS = 2, 3, 2
GARBAGE = 99.0  # what a buffer holds after each row's real positions: must never be read


def state(lengths: list[int], source_lengths: list[int], capacity: int = 8) -> KVCache:
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
    return KVCache(
        cross=[
            rng.standard_normal((sources, HEADS, width, HEAD_DIM)).astype(np.float32)
            for _ in range(2 * LAYERS)
        ],
        source_mask=np.arange(width)[None, :] < np.array(source_lengths)[:, None],
        past=past,
        positions=np.array(lengths, dtype=np.int64),
    )


def real_caches(decoder: KVCache) -> list[list[np.ndarray]]:
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
    together = KVCache.rows_together([greedy, beams])
    assert together.positions.tolist() == [3, 1, 5, 5, 5, 2, 2, 2]
    stacked = zip(real_caches(greedy), real_caches(beams), strict=True)
    assert_caches_equal(real_caches(together), [a + b for a, b in stacked])
    for mine, a, b in zip(together.cross, greedy.cross, beams.cross, strict=True):
        np.testing.assert_array_equal(mine[:2, :, :4], a)
        np.testing.assert_array_equal(mine[2:, :, :5], np.repeat(b, 3, axis=0))
    assert together.source_mask.sum(axis=1).tolist() == [4, 2, 3, 3, 3, 5, 5, 5]


def stepped_together(states: list[KVCache]) -> KVCache:
    """What a step of states taken together leaves behind, without a model: each row's new
    position written into the buffers, in place, and every state holding its rows of it."""
    together = KVCache.went_on_together(states) or KVCache.rows_together(states)
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
    went_on = KVCache.went_on_together([greedy, beams])
    assert went_on is last  # its buffers, its binding: nothing copied or bound again
    expected = KVCache.rows_together([greedy, beams])
    assert_caches_equal(real_caches(went_on), real_caches(expected))
    np.testing.assert_array_equal(went_on.positions, expected.positions)
    assert KVCache.went_on_together([beams, greedy]) is None  # another order
    beams.select_rows(np.array([0, 1, 2]))  # a sentence left
    assert KVCache.went_on_together([greedy, beams]) is None
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


def test_sources_that_leave_are_filled_in_place_and_padding_is_cut_at_a_quarter() -> None:
    decoder = state(lengths=[2] * 6, source_lengths=[4, 6, 5, 3, 6, 2])
    before = [layer.copy() for layer in decoder.cross]
    layers = list(decoder.cross)
    sources = np.array([0, 5, 2, 3])  # 1 and 4 left; 5 takes 1's place; the widest is 5 of 6
    decoder.select_sources(sources)
    for old, new, layer in zip(before, decoder.cross, layers, strict=True):
        np.testing.assert_array_equal(new, old[sources])
        assert np.shares_memory(new, layer)  # one column of six: not worth a copy of its own
        assert new.flags.c_contiguous  # ONNX Runtime reads it without a copy
    assert decoder.source_mask.sum(axis=1).tolist() == [4, 2, 5, 3]

    decoder.select_sources(np.array([1, 3]))  # the widest left is 3 of 6: cut, one copy
    for old, new in zip(before, decoder.cross, strict=True):
        np.testing.assert_array_equal(new, old[[5, 3], :, :3])
        assert new.flags.c_contiguous
    assert decoder.source_mask.shape == (2, 3)


def test_candidates_follow_their_sources_and_the_vocabulary_is_made_again() -> None:
    decoder = state(lengths=[1] * 5, source_lengths=[2, 3, 4, 2, 3])
    decoder.candidates = [np.array([1, 5]), np.array([2]), np.array([3, 7]), [4], [6]]
    decoder.vocabulary = np.arange(1, 8)
    decoder.vocabulary_sources = 5
    decoder.select_sources(np.array([0, 1, 2, 4]))  # one of five left
    assert decoder.vocabulary is not None  # a superset is harmless; gathering it costs
    decoder.select_sources(np.array([0, 2]))  # three of the five it was made for have left
    assert [list(c) for c in decoder.candidates] == [[1, 5], [3, 7]]
    assert decoder.vocabulary is None  # the engine gathers it again at the next step
    joining = state(lengths=[0], source_lengths=[2])
    joining.candidates = [np.array([9])]
    decoder.vocabulary = np.array([1, 3, 5, 7])
    decoder.extend(joining)
    assert [list(c) for c in decoder.candidates] == [[1, 5], [3, 7], [9]]
    assert decoder.vocabulary is None  # a join always makes it again


def test_a_new_cache_takes_over_a_spare_of_as_many_rows_only() -> None:
    """adopt: a cache that has not stepped takes the spare's buffers and binding, and must
    bind its own sources next; a spare of other rows, one whose buffers are views of a step
    taken together, or a cache that has stepped take nothing."""
    spare = state(lengths=[4, 4], source_lengths=[5])
    spare.binding, spare.io, spare.bound = object(), {"positions": np.zeros(2)}, (3, False)
    new = state(lengths=[0, 0], source_lengths=[7])
    assert new.adopt(spare)
    assert new.past is spare.past and new.binding is spare.binding and new.io is spare.io
    assert new.bound == (3, False) and new.sources_stale
    assert new.source_mask.shape == (1, 7)  # its own sources stay its own

    for refused, other in (
        (state(lengths=[0], source_lengths=[7]), spare),  # other rows
        (state(lengths=[2, 2], source_lengths=[7]), spare),  # has stepped
    ):
        past = refused.past
        assert not refused.adopt(other) and refused.past is past and refused.bound is None
    spare.together = (state(lengths=[4, 4, 4], source_lengths=[5, 5, 5]), 0)
    fresh = state(lengths=[0, 0], source_lengths=[7])
    assert not fresh.adopt(spare) and fresh.binding is None
