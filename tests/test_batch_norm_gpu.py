"""Training-mode batch norm on CUDA (device machine; marked gpu): the cuDNN pair runs where
torch's autograd would run it, with no reserve, and its results (Y, running statistics, dX,
dscale, dB) match float64 autograd of `F.batch_norm` on the CPU; where cuDNN is not chosen
(2-d inputs, cuDNN disabled) the native kernels run and
match the same way. A small CNN trains on CUDA like autograd on CUDA does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autotm_py.ir.graph import Kernel, freeze_attrs
from autotm_py.kernels import batch_norm, run_kernel
from autotm_py.kernels.into import run_kernel_into
from tests.test_training_ops import assert_close

pytestmark = pytest.mark.gpu

MOMENTUM = 0.9  # ONNX's: the weight of the old running statistic


def _kernels(eps: float, mask: tuple[int, int, int] = (1, 1, 1)) -> tuple[Kernel, Kernel]:
    fwd = Kernel(0, "bn", "BatchNormalization", "", freeze_attrs(
        {"epsilon": eps, "momentum": MOMENTUM, "training_mode": 1}), (0, 1, 2, 3, 4),
        (5, 6, 7, 8, 9), "")
    bwd = Kernel(1, "bn/grad", "BatchNormGrad", "autotm", freeze_attrs(
        {"epsilon": eps, "output_mask": mask}), (0, 1, 2, 3, 4), (5, 6, 7)[:sum(mask)], "")
    return fwd, bwd


def _reference(x, scale, bias, mean, var, dy, eps):
    """float64 autograd of F.batch_norm on the CPU: Y, mean', var', dX, dscale, dB."""
    leaves = [t.double().requires_grad_(True) for t in (x, scale, bias)]
    rm, rv = mean.double().clone(), var.double().clone()
    y = F.batch_norm(leaves[0], rm, rv, leaves[1], leaves[2], True, 1 - MOMENTUM, eps)
    y.backward(dy.double())
    return [y.detach(), rm, rv, *(t.grad for t in leaves)]


CASES = [  # (shape, dtype, eps, memory format, cuDNN expected)
    ((8, 16, 12, 12), torch.float32, 1e-5, torch.contiguous_format, True),
    ((32, 64, 7, 7), torch.float32, 1e-3, torch.contiguous_format, True),
    ((4, 8, 5, 5, 5), torch.float32, 1e-5, torch.contiguous_format, True),
    ((6, 5, 9), torch.float32, 1e-5, torch.contiguous_format, True),
    ((4, 8, 6, 6), torch.float64, 1e-5, torch.contiguous_format, None),
    ((16, 12), torch.float32, 1e-5, torch.contiguous_format, False),  # 2-d: native
    ((8, 16, 12, 12), torch.float32, 1e-5, torch.channels_last, None),  # either, no reserve
]


@pytest.mark.parametrize(("shape", "dtype", "eps", "fmt", "cudnn"), CASES,
                         ids=["4d", "4d-eps1e-3", "5d", "3d", "float64", "2d", "channels-last"])
def test_batch_norm_kernels_on_cuda_match_float64_autograd(shape, dtype, eps, fmt, cudnn):
    gen = torch.Generator().manual_seed(0)
    c = shape[1]
    x = torch.randn(shape, generator=gen) * 2 + 0.5
    scale, bias = torch.rand(c, generator=gen) + 0.5, torch.randn(c, generator=gen)
    mean, var = torch.randn(c, generator=gen) * 0.1, torch.rand(c, generator=gen) + 0.5
    dy = torch.randn(shape, generator=gen)
    dev = [t.to("cuda", dtype) for t in (x, scale, bias, mean, var)]
    dev[0] = dev[0].contiguous(memory_format=fmt)
    used = batch_norm.cudnn_batch_norm(dev[0], dev[1], eps)
    if cudnn is not None:
        assert used == cudnn
    fwd, bwd = _kernels(eps)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y, new_mean, new_var, save_mean, save_invstd = run_kernel(fwd, dev)
        grads = run_kernel(bwd, [dy.to("cuda", dtype), dev[0], dev[1], save_mean, save_invstd])
    names = {e.name for e in prof.events()}
    assert ({"aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward"} <= names) == used
    want = _reference(x, scale, bias, mean, var, dy, eps)
    rtol = 1e-10 if dtype == torch.float64 else 1e-4
    for what, got, ref in zip(("Y", "mean'", "var'", "dX", "dscale", "dB"),
                              [y, new_mean, new_var, *grads], want, strict=True):
        assert_close(got.cpu().double(), ref, f"{shape} {what}", rtol=rtol)


def test_masked_backward_on_cuda_returns_what_was_asked():
    x = torch.randn(4, 6, 5, 5, device="cuda")
    scale, bias = torch.rand(6, device="cuda") + 0.5, torch.randn(6, device="cuda")
    mean, var = torch.zeros(6, device="cuda"), torch.ones(6, device="cuda")
    fwd, _ = _kernels(1e-5)
    _, _, _, sm, si = run_kernel(fwd, [x, scale, bias, mean, var])
    _, full = _kernels(1e-5)
    dx, _, db = run_kernel(full, [torch.ones_like(x), x, scale, sm, si])
    _, part = _kernels(1e-5, (1, 0, 1))
    dx2, db2 = run_kernel(part, [torch.ones_like(x), x, scale, sm, si])
    assert torch.equal(dx, dx2) and torch.equal(db, db2)


def test_cudnn_disabled_takes_the_native_path():
    x = torch.randn(4, 6, 5, 5, device="cuda")
    scale = torch.ones(6, device="cuda")
    with torch.backends.cudnn.flags(enabled=False):
        assert not batch_norm.cudnn_batch_norm(x, scale, 1e-5)
    assert batch_norm.cudnn_batch_norm(x, scale, 1e-5)


APPLY_CASES = [  # (shape, dtype of X, memory format): the native kernel and cuDNN's
    ((8, 16, 12, 12), torch.bfloat16, torch.channels_last),
    ((8, 16, 12, 12), torch.bfloat16, torch.contiguous_format),
    ((8, 16, 12, 12), torch.float32, torch.channels_last),
    ((8, 16, 12, 12), torch.float32, torch.contiguous_format),
    ((16, 12), torch.float32, torch.contiguous_format),
]


@pytest.mark.parametrize(("shape", "dtype", "fmt"), APPLY_CASES,
                         ids=["bf16-channels-last", "bf16", "channels-last", "4d", "2d"])
def test_a_re_run_from_saved_statistics_is_the_first_runs_y_bit_for_bit(shape, dtype, fmt):
    """`BatchNormApply` (a batch norm's re-run, `ir.rerun`) on CUDA: Y of the first run bit
    for bit, returned and written into a slot, on whichever kernel the first run took; on the
    native one it is one elementwise kernel (`batch_norm_elemt`)."""
    from dataclasses import replace

    from autotm_py.ir.rerun import rerun_kernel

    gen = torch.Generator().manual_seed(1)
    c = shape[1]
    x = (torch.randn(shape, generator=gen) * 2 + 0.5).to("cuda", dtype).contiguous(
        memory_format=fmt)
    params = [t.to("cuda") for t in (torch.rand(c, generator=gen) + 0.5,
                                     torch.randn(c, generator=gen),
                                     torch.randn(c, generator=gen) * 0.1,
                                     torch.rand(c, generator=gen) + 0.5)]
    fwd, _ = _kernels(1e-5)
    if fmt == torch.channels_last:  # Y stored as the executor stores it (`ir.layout`)
        fwd = replace(fwd, channels_last=(0,))
    y, _, _, save_mean, save_invstd = run_kernel(fwd, [x, *params])
    again = rerun_kernel(fwd)
    args = [x, params[0], params[1], save_mean, save_invstd]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        (regenerated,) = run_kernel(again, args)
    native = not batch_norm.cudnn_batch_norm(x, params[0], 1e-5)
    assert ("aten::batch_norm_elemt" in {e.name for e in prof.events()}) == native
    assert torch.equal(regenerated, y)
    slot = torch.full_like(y, float("nan"))
    assert run_kernel_into(again, args, [slot])
    assert torch.equal(slot, y)
