"""The one-pass softmax cross-entropy gradient (`kernels.loss_grad`, a Triton kernel) on CUDA
(marked `gpu`: run on the device machine with `python3 -m pytest -q -m gpu
tests/test_loss_grad_gpu.py`, or experiments/gpu/test_gpu.sh; skipped where torch sees no CUDA
device). The CPU has no Triton and runs torch's ops, which these tests take as the reference:

- the kernel against torch's exp, scatter and scale, for fp32 and bf16 sources, fp32 and bf16
  gradients, shifted (the chunked loss's logits minus their logsumexp) or not, in place, and
  class counts below, at and above one block (4096) and GPT-2's 50257. fp32 gradients equal the
  torch ops' to 2 ulp (both call CUDA's expf; a product rounded once either way) and bf16 ones
  to one bf16 rounding (2^-7 relative: fp32 values 1 ulp apart may round to neighbouring bf16
  values), the torch ops rounding an fp32 softmax into bf16 too;
- `SoftmaxCrossEntropyGrad` on CUDA runs it (no fp32 temporary of the logits' size is
  allocated: the peak shows it) and equals the CPU's kernel; written into an arena slot
  (`run_kernel_into`) it equals `run_kernel` bitwise, as every direct kernel must. The chunked
  loss's gradient (`LinearCrossEntropyGrad`, in place over each block's logits) is checked by
  training on CUDA like on the CPU (tests/test_fuse_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from autotm_py.ir.graph import Kernel
from autotm_py.kernels import run_kernel, run_kernel_into
from autotm_py.kernels.loss_grad import fused_softmax_grad
from autotm_py.kernels.util import softmax_grad_rows

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif("not torch.cuda.is_available()", reason="no CUDA device")]


def _torch_grad(src: torch.Tensor, labels: torch.Tensor, scale: float, dtype: torch.dtype,
                shift: torch.Tensor | None) -> torch.Tensor:
    x = src.float() if shift is None else src.float() - shift.unsqueeze(1)
    out = torch.empty(src.shape, dtype=dtype, device=src.device)
    return softmax_grad_rows(x.exp(), labels, scale, out)


@pytest.mark.parametrize("classes", [10, 1000, 4096, 5000, 50257])
@pytest.mark.parametrize("src_dtype,out_dtype", [(torch.float32, torch.float32),
                                                 (torch.float32, torch.bfloat16),
                                                 (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("shifted", [False, True])
def test_one_pass_gradient_is_the_torch_ops(classes, src_dtype, out_dtype, shifted):
    torch.manual_seed(classes)
    rows = 37
    logits = torch.randn(rows, classes, device="cuda") * 4
    src = (logits if shifted else torch.log_softmax(logits, 1)).to(src_dtype)
    # the shift is the logsumexp of the source as rounded, as the chunked loss computes it
    shift = torch.logsumexp(src.float(), 1) if shifted else None
    labels = torch.randint(0, classes, (rows,), device="cuda")
    scale = 1.0 / (rows * 3)
    got = fused_softmax_grad(src, labels, scale, torch.empty(src.shape, dtype=out_dtype,
                                                             device="cuda"), shift)
    assert got is not None, "the Triton kernel did not run on CUDA"
    want = _torch_grad(src, labels, scale, out_dtype, shift)
    if out_dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2.4e-7, atol=1e-12)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-9)
    # the rows sum to zero: softmax sums to one, minus the one at the label
    assert got.float().sum(1).abs().max() < 2e-2 * scale


def test_in_place_over_the_source():
    torch.manual_seed(0)
    logits = torch.randn(64, 3000, device="cuda", dtype=torch.bfloat16)
    lse = torch.logsumexp(logits.float(), 1)
    labels = torch.randint(0, 3000, (64,), device="cuda")
    want = _torch_grad(logits, labels, 0.5, torch.bfloat16, lse)
    got = fused_softmax_grad(logits, labels, 0.5, logits, lse)
    assert got is logits
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-9)


def test_operands_it_does_not_take_fall_back():
    labels = torch.zeros(4, dtype=torch.long, device="cuda")
    strided = torch.randn(10, 4, device="cuda").t()  # classes not of unit stride
    assert fused_softmax_grad(strided, labels, 1.0) is None
    assert fused_softmax_grad(torch.randn(4, 10), labels.cpu(), 1.0) is None
    assert fused_softmax_grad(torch.randn(4, 10, device="cuda", dtype=torch.float64),
                              labels, 1.0) is None


def _loss_grad_kernel(to: str | None) -> Kernel:
    attrs = {"axis": -1, "reduction": "mean", **({"to": to} if to else {})}
    return Kernel(id=0, name="g", op_type="SoftmaxCrossEntropyGrad", domain="autotm",
                  attrs=tuple(sorted(attrs.items())), inputs=(0, 1), outputs=(2,),
                  signature="g")


@pytest.mark.parametrize("to", [None, "bfloat16"])
def test_softmax_cross_entropy_grad_on_cuda(to):
    torch.manual_seed(1)
    log_prob = torch.log_softmax(torch.randn(2, 256, 50257) * 3, -1)
    labels = torch.randint(0, 50257, (2, 256))
    kernel = _loss_grad_kernel(to)
    (cpu,) = run_kernel(kernel, [log_prob, labels])
    torch.cuda.reset_peak_memory_stats()
    args = [log_prob.cuda(), labels.cuda()]
    base = torch.cuda.memory_allocated()
    (gpu,) = run_kernel(kernel, args)
    extra = torch.cuda.max_memory_allocated() - base - gpu.nbytes
    assert extra < 1 << 20, f"{extra} bytes beyond the gradient: the torch ops ran"
    rtol = 5e-7 if to is None else 2 ** -7  # the CPU's exp (SLEEF) a few ulp from CUDA's
    torch.testing.assert_close(gpu.cpu().float(), cpu.float(), rtol=rtol, atol=1e-12)
    slot = torch.empty_like(gpu)
    assert run_kernel_into(kernel, args, [slot])
    assert torch.equal(slot, gpu), "the arena's kernel differs from run_kernel"
