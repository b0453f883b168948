"""Fixtures the torch decoding tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def batch():
    """Five random sources of a 40-word vocabulary, padded to 8: source_ids, source_mask
    [5, 8]; every source ends with </s>."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(5)
    lengths = torch.tensor([2, 5, 8, 3, 6])
    source_mask = torch.arange(8)[None, :] < lengths[:, None]
    source_ids = torch.randint(3, 40, (5, 8), generator=generator).masked_fill(~source_mask, 0)
    source_ids[torch.arange(5), lengths - 1] = 1  # every source ends with </s>
    return source_ids, source_mask
