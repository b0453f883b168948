"""The heap's settling (service/serving/heap.py): what lives is frozen, out of the full
collections' way, and what leaves later is still collected at the next settling."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from service.serving import heap


class Node:
    """An object that refers to itself: only the cycle collector can free it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the other tests' objects as they were


def test_what_lives_is_frozen_and_what_leaves_is_collected_at_the_next_settling() -> None:
    cycle = Node()
    alive = weakref.ref(cycle)
    heap.settle()
    assert gc.get_freeze_count() > 0
    del cycle
    gc.collect()  # full collections skip the frozen: the cycle stays...
    assert alive() is not None
    heap.settle()  # ...until the next settling unfreezes, collects and freezes again
    assert alive() is None
    assert gc.get_freeze_count() > 0
