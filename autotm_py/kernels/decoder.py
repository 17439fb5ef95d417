"""Torch kernels of the Llama-style decoder's fused ops (`ir/rules/fused.py`;
frontend/fuse_rms_norm.py, fuse_silu.py, fuse_rotary.py).

`RMSNormalization` calls aten's `_fused_rms_norm` (one kernel on CUDA and the CPU; it returns
rstd per row too, the training graph's second output); `RMSNormGrad` calls
`_fused_rms_norm_backward` on CUDA and elsewhere is its gradient written out in float32
(float64 for float64) torch ops, because this torch has no CPU kernel for it. `Silu` and
`SiluGrad` are aten's `silu` and `silu_backward`.

`RotaryEmbedding` (Y = X COS + rotate_half(X) SIN) is three launches over X-sized tensors, one
product and two `addcmul_` into the halves of Y (the unfused Slices' copies, Mul, Neg, Concat,
Mul and Add were seven); `RotaryEmbeddingGrad` the same three for dX (the unfused backward's
MulGrads, concat split, negation, two zero-filled slice gradients and their sums were eleven).
COS and SIN may broadcast (e.g. (1, 1, S, D) against (B, H, S, D)): their halves are taken on
their own last axis. With `layout` "blhe" (`frontend/fuse_heads.py`) X and Y are (B, S, H, D)
while COS and SIN keep the shapes they broadcast with in (B, H, S, D): the kernels read them as
views with those two axes swapped. Under torch.autograd (the eager baselines) the forward is an
autograd Function whose backward is that gradient kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.fused import (
    BLHE,
    RMS_NORM,
    RMS_NORM_GRAD,
    ROTARY,
    ROTARY_GRAD,
    SILU,
    SILU_GRAD,
)
from autotm_py.kernels.util import register, sum_to

Tensors = Sequence[torch.Tensor]
RotaryInto = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


# ---- RMSNorm and SiLU ------------------------------------------------------------------------
def _rms_shape(kernel: Kernel, x: torch.Tensor) -> list[int]:
    """The normalized shape: the axes from `axis` on (the last axis, as the pass fuses it)."""
    return list(x.shape[int(kernel.attr("axis", -1)) % x.dim():])


@register(RMS_NORM)
def rms_norm(kernel: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    x = args[0]
    shape = _rms_shape(kernel, x)
    weight = args[1].expand(shape) if len(args) > 1 else None
    eps = float(kernel.attr("epsilon"))
    if hasattr(torch.ops.aten, "_fused_rms_norm"):
        y, rstd = torch.ops.aten._fused_rms_norm(x, shape, weight, eps)
    else:  # torch before 2.8: the unfused chain, in rstd's dtype, inside the kernel
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        dims = tuple(range(x.dim() - len(shape), x.dim()))
        rstd = torch.rsqrt(x.to(acc).pow(2).mean(dims, keepdim=True) + eps)
        y = (x.to(acc) * rstd).to(x.dtype)
        y = y if weight is None else y * weight
    return (y, rstd)[: len(kernel.outputs)]


@register(RMS_NORM_GRAD)
def rms_norm_grad(kernel: Kernel, args: Tensors) -> list[torch.Tensor]:
    """dX = rstd (g - xhat mean(g xhat)), g = dY * Scale, xhat = X rstd; dScale = sum of
    dY xhat over the rows. Computed in rstd's dtype (float32 for half inputs), as aten's."""
    dy, x, rstd = args[:3]
    mask = kernel.attr("output_mask", (1, 0))
    fused = _fused_rms_norm_grad(kernel, dy, x, rstd, args[3] if len(args) > 3 else None, mask)
    if fused is not None:
        return fused
    dims = tuple(range(int(kernel.attr("axis")), x.dim()))
    acc = rstd.dtype
    xhat = x.to(acc) * rstd
    g = dy.to(acc) * args[3].to(acc) if len(args) > 3 else dy.to(acc)
    outs = []
    if mask[0]:
        outs.append((rstd * (g - xhat * (g * xhat).mean(dims, keepdim=True))).to(x.dtype))
    if mask[1]:
        outs.append(sum_to(dy.to(acc) * xhat, args[3].shape).to(args[3].dtype))
    return outs


def _fused_rms_norm_grad(kernel: Kernel, dy: torch.Tensor, x: torch.Tensor,
                         rstd: torch.Tensor, scale: torch.Tensor | None,
                         mask: Sequence[int]) -> list[torch.Tensor] | None:
    """aten's `_fused_rms_norm_backward` where it has a kernel (CUDA): two passes over dY and
    X where the written-out gradient makes nine (on a Llama-style decoder of 0.85e9 parameters,
    b4 s1024, an H200: the composite's passes were most of the 9 ms a step that ours spent
    beyond torch.autograd of the same graph in elementwise and reduction kernels). None where
    it has none (the CPU), or for operands of mixed dtypes or an rstd it did not make."""
    op = getattr(torch.ops.aten, "_fused_rms_norm_backward", None)
    if op is None or not x.is_cuda or dy.dtype != x.dtype or \
            (scale is not None and scale.dtype != x.dtype):
        return None
    shape = _rms_shape(kernel, x)
    if rstd.shape != (*x.shape[:x.dim() - len(shape)], *([1] * len(shape))):
        return None
    weight = scale.expand(shape) if scale is not None else None
    dx, dw = op(dy, x, shape, rstd, weight, [bool(mask[0]), bool(mask[1] and weight is not None)])
    outs = [dx] if mask[0] else []
    if mask[1] and scale is not None:
        outs.append(sum_to(dw, scale.shape))
    return outs


@register(SILU)
def silu(kernel: Kernel, args: Tensors) -> torch.Tensor:
    return F.silu(args[0])


@register(SILU_GRAD)
def silu_grad(kernel: Kernel, args: Tensors) -> torch.Tensor:
    return torch.ops.aten.silu_backward(args[0], args[1])


# ---- rotary position embedding ----------------------------------------------------------------
def rotary_into(out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> None:
    """out = x cos + rotate_half(x) sin: out[:h] = x[:h] cos[:h] - x[h:] sin[:h], out[h:] =
    x[h:] cos[h:] + x[:h] sin[h:] (halves of the last axis; three launches)."""
    h = x.shape[-1] // 2
    torch.mul(x, cos, out=out)
    out[..., :h].addcmul_(x[..., h:], sin[..., :h], value=-1)
    out[..., h:].addcmul_(x[..., :h], sin[..., h:])


def rotary_grad_into(out: torch.Tensor, dy: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> None:
    """dX = dY cos + rotate_half^T(dY sin): dX[:h] = dY[:h] cos[:h] + dY[h:] sin[h:], dX[h:] =
    dY[h:] cos[h:] - dY[:h] sin[:h] (three launches)."""
    h = dy.shape[-1] // 2
    torch.mul(dy, cos, out=out)
    out[..., :h].addcmul_(dy[..., h:], sin[..., h:])
    out[..., h:].addcmul_(dy[..., :h], sin[..., :h], value=-1)


def _rotated(write: RotaryInto, a: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> torch.Tensor:
    """`write` (`rotary_into` or `rotary_grad_into`) of `a` into a new tensor of the operands'
    broadcast shape and promoted dtype."""
    shape = torch.broadcast_shapes(a.shape, cos.shape, sin.shape)
    dtype = a.dtype
    for t in (cos, sin):  # promote_types only where they differ: it is a dispatched op
        dtype = dtype if t.dtype == dtype else torch.promote_types(dtype, t.dtype)
    out = torch.empty(shape, dtype=dtype, device=a.device)
    write(out, a, cos, sin)
    return out


class _Rotary(torch.autograd.Function):
    """The fused forward under torch.autograd, its backward the gradient kernel (COS and SIN
    get none)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.x_dtype, ctx.x_shape = x.dtype, x.shape
        return _rotated(rotary_into, x, cos, sin)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        dx = _rotated(rotary_grad_into, dy, cos, sin)
        if dx.shape != ctx.x_shape:  # an X that the tables broadcast
            dx = sum_to(dx, ctx.x_shape)
        return dx.to(ctx.x_dtype), None, None


def rotary_tables(kernel: Kernel, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """COS and SIN as they broadcast into X: with `layout` "blhe" views of them padded to four
    axes with axes 1 and 2 swapped (given for (B, H, S, D), read for (B, S, H, D))."""
    if kernel.attr("layout") != BLHE:
        return cos, sin
    return _heads_swapped(cos), _heads_swapped(sin)


def _heads_swapped(t: torch.Tensor) -> torch.Tensor:
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)).transpose(1, 2)


@register(ROTARY)
def rotary(kernel: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    cos, sin = rotary_tables(kernel, args[1], args[2])
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        h = x.shape[-1] // 2  # the composite form, differentiable in every operand
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin
    if torch.is_grad_enabled() and x.requires_grad:
        return _Rotary.apply(x, cos, sin)
    return _rotated(rotary_into, x, cos, sin)


@register(ROTARY_GRAD)
def rotary_grad(kernel: Kernel, args: Tensors) -> torch.Tensor:
    dy = args[0]
    cos, sin = rotary_tables(kernel, args[1], args[2])
    return _rotated(rotary_grad_into, dy, cos, sin)
