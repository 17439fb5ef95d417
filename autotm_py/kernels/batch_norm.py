"""Training-mode batch normalization with the kernels autograd itself runs on each device.

Where torch picks cuDNN for a batch norm (CUDA, float32/float64 or half with float
parameters, rank >= 3, eps at or above cuDNN's minimum, cuDNN enabled: torch's own choice,
`torch._C._select_batch_norm_backend`), training runs the pair autograd runs there:
`_batch_norm_with_update_functional` (cudnn_batch_norm on two copies of the running statistics)
and `batch_norm_backward` (cudnn_batch_norm_backward). Everywhere else (the CPU, 2-d inputs,
bfloat16, a small eps...) it runs `_native_batch_norm_legit_functional` and
`native_batch_norm_backward`, as before.

cuDNN's backward takes a *reserve* buffer that its forward fills. The IR does not carry it:
for what cuDNN is given here (op CUDNN_BATCHNORM_OPS_BN, no fused activation, and the
contiguous layout every kernel output has, i.e. mode CUDNN_BATCHNORM_SPATIAL) cuDNN asks for
none. Both kernels ask cuDNN for the reserve's size themselves
(`torch._C._get_cudnn_batch_norm_reserve_space_size`, the query torch sizes the buffer with,
on the host, no GPU work) and use the cuDNN pair only when it is 0; the backward then gets an
empty reserve, which is exactly what the forward produced. Where cuDNN asks for a reserve
(channels-last inputs take its persistent mode; another cuDNN version might), both kernels take
the native path instead, so a reserve is never dropped. The two paths compute the same saved
statistics (mean and 1 / sqrt(biased variance + eps)), so either backward reads either forward's.

`batch_norm_training_into` writes the forward into given buffers (an arena run's slots) on
either path: cuDNN's through `cudnn_batch_norm.out`, a real out= kernel (on the H100 it wrote
into its buffers with no allocation, bitwise what the functional pair returns:
`experiments/gpu/out_variant_probe.py`), the native one through `_native_batch_norm_legit.out`.
The backward has no such kernel on either path (aten's out= variants of both allocate and copy).
"""

from __future__ import annotations

import torch

from autotm_py.errors import ExecutionError

_CHOICE: dict[tuple[object, ...], bool] = {}


def cudnn_batch_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> bool:
    """Whether training-mode batch norm of `x` runs the cuDNN pair (see the module docstring).

    Decided from x's shape, strides, dtype and device, the scale's dtype, eps and whether cuDNN
    is enabled, identically in the forward and the backward kernel; remembered per key, since
    both queries are host calls a kernel should not repeat."""
    if x.device.type != "cuda":
        return False
    key = (tuple(x.shape), x.stride(), x.dtype, scale.dtype, x.device, float(eps),
           torch.backends.cudnn.enabled)
    choice = _CHOICE.get(key)
    if choice is None:
        choice = _CHOICE[key] = _cudnn_without_reserve(x, scale, eps)
    return choice


def _cudnn_without_reserve(x: torch.Tensor, scale: torch.Tensor, eps: float) -> bool:
    # bias and running statistics are always given (ONNX BatchNormalization has all five
    # inputs); the scale stands in for them, torch's choice only asks whether they exist
    backend = torch._C._select_batch_norm_backend(x, scale, scale, scale, scale, True, eps)
    if backend != torch._C._BatchNormBackend.Cudnn:
        return False
    return int(torch._C._get_cudnn_batch_norm_reserve_space_size(x, True)) == 0


def batch_norm_training(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                     mean: torch.Tensor, var: torch.Tensor, momentum: float,
                     eps: float) -> tuple[torch.Tensor, ...]:
    """(Y, running mean', running var', saved mean, saved invstd); `momentum` is torch's (the
    weight of the batch statistic)."""
    if cudnn_batch_norm(x, scale, eps):
        y, save_mean, save_invstd, reserve, new_mean, new_var = (
            torch.ops.aten._batch_norm_with_update_functional(x, scale, bias, mean, var,
                                                               momentum, eps))
        if reserve.numel():
            raise ExecutionError(
                f"cuDNN batch norm of a {tuple(x.shape)} input returned a {reserve.numel()}-"
                "byte reserve after reporting none; the backward would run without it")
        return y, new_mean, new_var, save_mean, save_invstd
    y, save_mean, save_invstd, new_mean, new_var = (
        torch.ops.aten._native_batch_norm_legit_functional(x, scale, bias, mean, var, True,
                                                           momentum, eps))
    return y, new_mean, new_var, save_mean, save_invstd


def batch_norm_training_into(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                             mean: torch.Tensor, var: torch.Tensor, momentum: float, eps: float,
                             outs: tuple[torch.Tensor, ...]) -> None:
    """`batch_norm_training` written into `outs` = (Y, running mean', running var', saved mean,
    saved invstd): the running statistics are copied into their new buffers (unless those are
    the old ones: updated in place, as torch's batch norm updates its buffers) and updated
    there."""
    y, new_mean, new_var, save_mean, save_invstd = outs
    for new, old in ((new_mean, mean), (new_var, var)):
        if new.data_ptr() != old.data_ptr():
            new.copy_(old)
    if not cudnn_batch_norm(x, scale, eps):
        torch.ops.aten._native_batch_norm_legit.out(
            x, scale, bias, new_mean, new_var, True, momentum, eps, out=y,
            save_mean=save_mean, save_invstd=save_invstd)
        return
    # through the Python binding, not torch.ops: the kernel rebinds its reserve output to a
    # new tensor, which on torch 2.11 corrupted the heap when called through torch.ops
    # (experiments/gpu/out_variant_probe.py --stress)
    _, _, _, reserve = torch.cudnn_batch_norm(
        x, scale, bias, new_mean, new_var, True, momentum, eps,
        out=(y, save_mean, save_invstd, torch.empty(0, dtype=torch.uint8, device=x.device)))
    if reserve.numel():
        raise ExecutionError(
            f"cuDNN batch norm of a {tuple(x.shape)} input wrote a {reserve.numel()}-byte "
            "reserve after reporting none; the backward would run without it")


def batch_norm_backward(dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor,
                    save_mean: torch.Tensor, save_invstd: torch.Tensor, eps: float,
                    mask: list[bool]) -> tuple[torch.Tensor | None, ...]:
    """(dX, dscale, dB), None where `mask` is False (cuDNN computes all three anyway)."""
    if cudnn_batch_norm(x, scale, eps):
        reserve = torch.empty(0, dtype=torch.uint8, device=x.device)
        outs = torch.ops.aten.batch_norm_backward(dy, x, scale, None, None, save_mean,
                                                  save_invstd, True, eps, mask, reserve)
    else:
        outs = torch.ops.aten.native_batch_norm_backward(dy, x, scale, None, None, save_mean,
                                                         save_invstd, True, eps, mask)
    return tuple(o if m else None for o, m in zip(outs, mask, strict=True))


def batch_norm_apply(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                     mean: torch.Tensor, invstd: torch.Tensor, eps: float,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Y of a training-mode batch norm again, from the statistics its first run saved (a
    re-run, `ir.rerun`), bit for bit the first run's Y; into `out` if given.

    Where the first run was torch's native CUDA kernel, whose last step is `batch_norm_elemt`
    on the saved statistics, it is that step alone: one pass over X. Elsewhere (cuDNN's pair,
    the CPU) it is the first run's own call again (`batch_norm_training[_into]`: the same
    kernel choice), on throwaway running statistics, which Y does not depend on."""
    if x.device.type == "cuda" and not cudnn_batch_norm(x, scale, eps):
        if out is None:
            return torch.batch_norm_elemt(x, scale, bias, mean, invstd, eps)
        return torch.ops.aten.batch_norm_elemt.out(x, scale, bias, mean, invstd, eps, out=out)
    running = (torch.zeros_like(mean), torch.ones_like(mean))
    if out is None:
        return batch_norm_training(x, scale, bias, *running, 0.0, eps)[0]
    batch_norm_training_into(x, scale, bias, *running, 0.0, eps,
                             (out, *running, torch.empty_like(mean), torch.empty_like(invstd)))
    return out
