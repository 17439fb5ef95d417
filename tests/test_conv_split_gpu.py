"""Convolutions in batch chunks on a GPU (marked `gpu`: run on the device machine with
`bash experiments/gpu/test_gpu.sh`, i.e. `python -m pytest -m gpu`).

With cuDNN, forward convolutions and a fused backward kernel's filter and data parts run over
slices of the batch (`ir.conv_split`, "<name>#<chunks>") train as the whole-batch graph does,
within TF32 rounding (torch's default for cuDNN convolutions: a slice may get another
algorithm); at planned addresses, replayed as a CUDA graph (the forward convolution written
slice by slice into its slot, `kernels/into.py`), they compute bitwise what they compute on
torch's caching allocator, in both layouts."""

from __future__ import annotations

import pytest
import torch

from autotm_py import api
from autotm_py.ir.conv_split import split_conv_grads
from autotm_py.ir.layout import to_channels_last
from autotm_py.options import RunMode
from autotm_py.pipeline import all_fast_plan, with_arena
from autotm_py.runtime.execute import run_steps
from autotm_py.runtime.reference import train_steps
from tests.graphs import costs_for
from tests.test_conv_split import CHUNKED, TRAINING, conv_onnx

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return api.load_model(conv_onnx(tmp_path_factory.mktemp("conv") / "c.onnx", n=8),
                          TRAINING)


def test_chunked_convolutions_train_as_the_whole_batch_on_cuda(graph):
    split = split_conv_grads(graph, CHUNKED)
    whole = train_steps(graph, 3, seed=2, device="cuda")
    for a, b in zip(train_steps(split, 3, seed=2, device="cuda"), whole, strict=True):
        for tid in graph.outputs:
            torch.testing.assert_close(a[tid], b[tid], rtol=5e-3, atol=1e-4)


@pytest.mark.parametrize("channels_last", [False, True])
def test_chunked_convolutions_in_their_arena_compute_what_the_caching_allocator_does(
        graph, channels_last):
    split = split_conv_grads(to_channels_last(graph) if channels_last else graph, CHUNKED)
    plan = with_arena(split, all_fast_plan(split), costs_for(split))
    arena = run_steps(split, plan, steps=3, seed=4, device="cuda",
                      mode=RunMode(arena=True, replay=True))
    cached = run_steps(split, plan, steps=3, seed=4, device="cuda")
    for step, (a, b) in enumerate(zip(arena, cached, strict=True)):
        for tid in split.outputs:
            assert torch.equal(a[tid], b[tid]), (step, split.name_of(tid))
