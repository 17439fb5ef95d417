"""Training-mode batch norm (`kernels/batch_norm.py`): the cuDNN pair where torch would use it
and cuDNN needs no reserve, the native kernels elsewhere. On the CPU the choice is always
native; the cuDNN pair's calls (`_batch_norm_with_update_functional`, `batch_norm_backward`)
are exercised here by forcing the choice, which runs them on their CPU kernels. The cuDNN
kernels themselves are checked on a GPU in tests/test_batch_norm_gpu.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autotm_py.kernels import batch_norm
from tests.test_training_models import MODELS
from tests.test_training_ops import CASES, compare_training, op_graph

BN_CASES = [c for c in CASES if c.op == "BatchNormalization"]


class OpLog(TorchDispatchMode):
    """The aten ops dispatched inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _operands(shape: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = torch.randn(shape, generator=gen)
    scale, bias = torch.rand(c, generator=gen) + 0.5, torch.randn(c, generator=gen)
    mean, var = torch.randn(c, generator=gen) * 0.1, torch.rand(c, generator=gen) + 0.5
    return [x, scale, bias, mean, var]


def test_the_cpu_keeps_the_native_path() -> None:
    x, scale, bias, mean, var = _operands((4, 3, 5, 5))
    assert not batch_norm.cudnn_batch_norm(x, scale, 1e-5)
    ours = batch_norm.batch_norm_training(x, scale, bias, mean, var, 0.1, 1e-5)
    y, sm, si, nm, nv = torch.ops.aten._native_batch_norm_legit_functional(
        x, scale, bias, mean, var, True, 0.1, 1e-5)
    assert all(torch.equal(a, b) for a, b in zip(ours, (y, nm, nv, sm, si), strict=True))


@pytest.fixture
def force_cudnn_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch norm takes the cuDNN pair's code path (its ops run their CPU kernels)."""
    monkeypatch.setattr(batch_norm, "cudnn_batch_norm", lambda x, scale, eps: True)


@pytest.mark.parametrize("case", BN_CASES, ids=lambda c: c.id)
def test_the_cudnn_pair_trains_like_autograd(case, force_cudnn_pair) -> None:
    graph, fixed = op_graph(case)
    compare_training(graph, fixed=fixed)


def test_the_cudnn_pair_computes_what_the_native_kernels_compute(monkeypatch) -> None:
    x, scale, bias, mean, var = _operands((6, 4, 3, 3), seed=1)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    native = batch_norm.batch_norm_training(x, scale, bias, mean, var, 0.1, 1e-5)
    native_grads = batch_norm.batch_norm_backward(dy, x, scale, native[3], native[4], 1e-5,
                                              [True, True, True])
    monkeypatch.setattr(batch_norm, "cudnn_batch_norm", lambda x, scale, eps: True)
    with OpLog() as log:
        pair = batch_norm.batch_norm_training(x, scale, bias, mean, var, 0.1, 1e-5)
        grads = batch_norm.batch_norm_backward(dy, x, scale, pair[3], pair[4], 1e-5,
                                               [True, False, True])
    assert {"_batch_norm_with_update_functional", "batch_norm_backward"} <= log.ops
    for got, want in zip(pair, native, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert grads[1] is None
    torch.testing.assert_close(grads[0], native_grads[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads[2], native_grads[2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("model", ["small_cnn"])
def test_a_cnn_trains_like_autograd_on_the_cudnn_pair_path(model, force_cudnn_pair) -> None:
    compare_training(MODELS[model](), steps=3)


def test_cudnn_is_chosen_only_when_torch_would_and_no_reserve_is_needed(monkeypatch) -> None:
    """torch's own backend choice decides; a reserve cuDNN asks for sends both kernels to the
    native path (never a backward without its reserve)."""
    x, scale = torch.randn(2, 3, 4, 4), torch.ones(3)
    backend = torch._C._BatchNormBackend
    reserve = {"bytes": 0}
    chosen = {"backend": backend.Cudnn}
    monkeypatch.setattr(torch._C, "_select_batch_norm_backend",
                        lambda *args: chosen["backend"])
    monkeypatch.setattr(torch._C, "_get_cudnn_batch_norm_reserve_space_size",
                        lambda x, training: reserve["bytes"])
    assert batch_norm._cudnn_without_reserve(x, scale, 1e-5)
    reserve["bytes"] = 64
    assert not batch_norm._cudnn_without_reserve(x, scale, 1e-5)
    chosen["backend"], reserve["bytes"] = backend.Native, 0
    assert not batch_norm._cudnn_without_reserve(x, scale, 1e-5)
