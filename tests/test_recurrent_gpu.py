"""Recurrent layers in batch chunks on a GPU (marked `gpu`: run on the device machine with
`bash experiments/gpu/test_gpu.sh`, i.e. `python -m pytest -m gpu`).

On CUDA torch runs the layers with cuDNN; the split graph (`split_conv_grads`: every LSTM and
LSTMGrad over slices of the batch) trains as the whole-batch graph does, within float rounding
(the weights' gradients are sums over the slices), and its all-fast plan at planned addresses,
replayed, computes bitwise what it computes on torch's allocator."""

from __future__ import annotations

import pytest
import torch

from autotm_py.ir.conv_split import CHUNKS_ATTR
from autotm_py.options import RunMode
from autotm_py.pipeline import all_fast_plan, with_arena
from autotm_py.runtime.execute import run_steps
from autotm_py.runtime.reference import train_steps
from tests.graphs import costs_for
from tests.test_recurrent import _chunk_case

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind, batch_first, layers", [("LSTM", True, 2), ("GRU", False, 1)])
def test_chunked_layers_train_as_the_whole_batch_on_cuda(kind, batch_first, layers):
    train, split = _chunk_case(kind, batch_first, layers)
    assert any(k.attr(CHUNKS_ATTR) for k in split.kernels)
    got = train_steps(split, 3, seed=2, device="cuda")
    want = train_steps(train, 3, seed=2, device="cuda")
    for a, b in zip(got, want, strict=True):
        for tid in train.outputs:
            torch.testing.assert_close(a[tid], b[tid], rtol=1e-4, atol=1e-5)


def test_a_chunked_graph_in_its_arena_computes_what_it_computes_on_the_caching_allocator():
    """The split graph's all-fast plan at planned addresses, replayed as a CUDA graph: the
    chunked layers' outputs are copied into their slots, bitwise what torch's allocator
    gives."""
    _, split = _chunk_case("LSTM", True, 2)
    plan = with_arena(split, all_fast_plan(split), costs_for(split))
    mode = RunMode(arena=True, replay=True)
    arena = run_steps(split, plan, steps=3, seed=4, device="cuda", mode=mode)
    cached = run_steps(split, plan, steps=3, seed=4, device="cuda")
    for step, (a, b) in enumerate(zip(arena, cached, strict=True)):
        for tid in split.outputs:
            assert torch.equal(a[tid], b[tid]), (step, split.name_of(tid))
