"""Recurrent layers in chunks on a GPU (marked `gpu`: run on the device machine with
`bash experiments/gpu/test_gpu.sh`, i.e. `python -m pytest -m gpu`).

On CUDA torch runs the layers with cuDNN; the split graph (`split_conv_grads`: every LSTM and
LSTMGrad over segments of its sequence, the gradient kernel one segment's tape at a time)
trains as the whole graph does, within float rounding (the weights' gradients are sums over
the segments), and its all-fast plan at planned addresses, replayed, computes bitwise what it
computes on torch's allocator."""

from __future__ import annotations

import pytest
import torch

from autotm_py.ir.conv_split import CHUNKS_ATTR
from autotm_py.options import RunMode
from autotm_py.pipeline import all_fast_plan, with_arena
from autotm_py.runtime.execute import run_steps
from autotm_py.runtime.reference import train_steps
from tests.graphs import costs_for
from tests.test_recurrent import _chunk_case, _plain_training

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


class WideClassifier(torch.nn.Module):
    """Two cuDNN LSTM layers over 256 steps of a batch of 64: a peak of hundreds of MiB, most of
    it the gradient kernels' recomputed tapes, so that 80% of it, less the GPU's runtime
    reserve, holds the whole-batch LSTMGrad kernels only in chunks."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(256, 512, num_layers=2, batch_first=True)
        self.fc = torch.nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0][:, -1])


def test_the_trainer_trains_an_lstm_in_chunks_on_cuda_as_pytorch(tmp_path):
    """The Trainer on a GPU (its default mode: arena, placed outputs or copies into slots,
    replay) at 80% of the peak: the plan chunks recurrent kernels, and 4 steps give cuDNN
    PyTorch's losses and parameters within float rounding (the chunks' summed gradients)."""
    import copy

    import torch.nn.functional as F

    from autotm_py.trainer import Trainer

    torch.manual_seed(0)
    reference = WideClassifier()
    ours = copy.deepcopy(reference)  # on the CPU, as a user hands it over; batches too
    gen = torch.Generator().manual_seed(3)
    data = [(torch.randn(64, 256, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen))
            for _ in range(4)]
    want = _plain_training(reference.cuda(), [(x.cuda(), y.cuda()) for x, y in data], lr=0.05)
    trainer = Trainer(ours, torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9),
                      F.cross_entropy, example=data[0], ratio="4:1", device="cuda",
                      plans_dir=tmp_path, precision="fp32", time_limit_s=30)
    assert any(int(k.attr(CHUNKS_ATTR, 1)) > 1 for k in trainer.run_graph.kernels), \
        trainer.notes
    got = [float(trainer.step(x, y)) for x, y in data]
    trainer.sync()
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    for (name, p), (_, q) in zip(ours.named_parameters(), reference.named_parameters(),
                                 strict=True):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=1e-4, atol=1e-5,
                                   msg=name)


def test_a_recurrent_gradient_kernels_device_time_counts_its_backward(tmp_path):
    """LSTMGrad runs its backward through torch's autograd engine, which launches it from its
    own device thread: the device times the simulator prices a replayed plan with, measured
    in context (profiler ranges) and alone (a CUDA graph of the kernel), count that work: a
    gradient kernel (a forward and cuDNN's backward) takes over twice a forward's device
    time (an H200, this model: 8.0 against 2.3 ms alone, 7.0 against 2.0 ms in context);
    counted from the range alone it had been one forward's (2026-12-02, H200: 4.3 ms of a
    13.9 ms kernel)."""
    from autotm_py.frontend.capture import capture_module
    from autotm_py.frontend.onnx import import_model
    from autotm_py.ir.training import derive_training
    from autotm_py.pipeline import profile_in_context
    from autotm_py.profiling.profile import profile

    torch.manual_seed(0)
    x = torch.randn(64, 256, 256)
    graph = derive_training(import_model(capture_module(WideClassifier(), (x,)).model),
                            optimizer="sgd", learning_rate=0.05)
    alone = profile(graph, device="cuda", profiles_dir=tmp_path / "alone", progress=False)
    in_context = profile_in_context(graph, device="cuda", profiles_dir=tmp_path / "context")
    for costs in (alone, in_context):
        times = {k.op_type: (t, d) for k, t, d in zip(graph.kernels, costs.times_s,
                                                      costs.device_s, strict=True)
                 if k.op_type in ("LSTM", "LSTMGrad")}
        (forward, forward_device), (grad_time, grad_device) = times["LSTM"], times["LSTMGrad"]
        assert grad_time > 1.5 * forward, times
        assert grad_device > 2 * forward_device, times
