"""The placed embedding tables on CUDA (device machine; marked gpu): the unified lookup pools
rows of HBM and pinned host blocks in one embedding_bag over a view spanning both tiers, reads
each index at its own row, and equals torch's embedding_bag over the whole tables on the GPU,
for sum and mean pooling; the padded per-tier lookup equals it too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autotm_py.runtime import embedding_bag as eb

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("dim", [16, 100])
def test_unified_lookup_on_cuda_equals_torch_over_whole_tables(mode, dim):
    gen = torch.Generator().manual_seed(3)
    rows, block_rows = [5000, 1200, 77], 64
    weights = [torch.randn(r, dim, generator=gen) for r in rows]
    rng = np.random.default_rng(3)
    where = [(rng.random(-(-r // block_rows)) < 0.4).astype(np.int8) for r in rows]
    tables = eb.PlacedTables.from_weights(weights, where, block_rows, device="cuda")
    assert tables.unified is not None and tables.unified.is_cuda  # one view over both tiers
    idx = [torch.as_tensor(rng.integers(0, r, 2048), device="cuda") for r in rows]
    offsets = [torch.arange(0, 2048, 8, device="cuda")] * len(rows)
    for padded in (False, True):
        got = tables.lookup(idx, offsets, mode=mode, padded=padded)
        for g, w, ix, off in zip(got, weights, idx, offsets, strict=True):
            want = torch.nn.functional.embedding_bag(ix, w.cuda(), off, mode=mode)
            torch.testing.assert_close(g, want)


def test_registered_host_tier_is_seen_as_pinned_and_shared_not_copied():
    """A host tier from `pinned_empty` counts as pinned for torch, so tables made over it use
    it in place (a copy would pin tens of GB again per placement)."""
    host = eb.pinned_empty(1000, 12)
    assert host.is_pinned()
    where = [np.array([0, 1] * 8, dtype=np.int8)]
    tables = eb.PlacedTables.uninitialized([1000], 12, where, 64, device="cuda", host=host)
    assert tables.host.data_ptr() == host.data_ptr()
