"""Torch kernels of the fused ops (`ir/rules/fused.py`): scaled dot-product attention and its
gradient.

Inference (one output) calls `torch.nn.functional.scaled_dot_product_attention`, which picks
the best backend of the device. Training (a second output, the logsumexp) and the gradient
call the backend pair that autograd itself uses for SDPA, so the forward saves only the
logsumexp and the backward recomputes the scores blockwise:

- CPU: `_scaled_dot_product_flash_attention_for_cpu` and its `_backward` (float32/64,
  bfloat16, float16; Q, K and V of one head size);
- CUDA: `_scaled_dot_product_efficient_attention` and its `_backward` (additive masks, any
  head size), with the mask padded and expanded as torch's own dispatcher does;
- anywhere else, or when the fused backend refuses the shapes: the math form, which
  materializes the (L, S) scores inside the kernel (numerically the same; more memory).

Boolean masks become additive ones (0 / -inf) of the query's dtype: torch's fused kernels
take additive masks only. Rank-3 operands (N, L, E) run as (N, 1, L, E). With `layout`
"blhe", Q, K, V, O, dO and the gradients are (B, L, H, E): the kernels pass torch (B, H, L, E)
views of them, and torch's fused kernels write their outputs in (B, L, H, E) memory, so the
results are contiguous as they come (in the default layout the executor's contract makes a
copy of each, `run_kernel`).

`Linear` (X, W[, B] -> X op(W) + B) is one addmm over the rows of X (mm without a bias), as
torch's nn.Linear; `LinearGrad` computes dX and dW with one mm each and dB as the row sum of
dY, the three kernels autograd runs for addmm.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.fused import BLHE
from autotm_py.kernels.util import register

Tensors = Sequence[torch.Tensor]
FLASH_CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
MEM_EFF_BIAS_ALIGN = 16  # torch pads an attention bias's last dim to this many elements


def _four_d(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(1) if t.dim() == 3 else t


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf"))


def _mask_4d(mask: torch.Tensor | None, dtype: torch.dtype,
             rank3: bool) -> torch.Tensor | None:
    """The mask as a 4-d additive tensor (torch's CPU kernel takes 2-d or 4-d masks): a
    rank-3 graph's (N, L, S) mask gets the head axis, shorter masks leading ones."""
    mask = _additive(mask, dtype)
    if mask is None:
        return None
    if rank3 and mask.dim() == 3:
        mask = mask.unsqueeze(1)
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def _operands(args: Tensors) -> tuple[torch.Tensor, ...]:
    """(q, k, v, additive mask or None) as 4-d tensors."""
    q, k, v = (_four_d(a) for a in args[:3])
    mask = _mask_4d(args[3], q.dtype, args[0].dim() == 3) if len(args) > 3 else None
    return q, k, v, mask


def _causal_bias(l_len: int, s_len: int, like: torch.Tensor) -> torch.Tensor:
    keep = torch.ones(l_len, s_len, dtype=torch.bool, device=like.device).tril()
    return torch.zeros(l_len, s_len, dtype=like.dtype, device=like.device).masked_fill_(
        ~keep, float("-inf"))


def _flash_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return (q.device.type == "cpu" and q.dtype in FLASH_CPU_DTYPES
            and q.shape[-1] == k.shape[-1] == v.shape[-1])


def _efficient_bias(mask: torch.Tensor | None, q: torch.Tensor,
                    k: torch.Tensor) -> torch.Tensor | None:
    """The mask as the CUDA kernel takes it: aligned last dim, expanded to (B, H, L, S)."""
    if mask is None:
        return None
    s_len = k.shape[-2]
    pad = -s_len % MEM_EFF_BIAS_ALIGN
    if pad:
        mask = F.pad(mask.expand(*mask.shape[:-1], s_len), (0, pad))[..., :s_len]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], s_len)


def _math_scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                 scale: float) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None:
        s = s + mask
    if causal:
        s = s + _causal_bias(q.shape[-2], k.shape[-2], s)
    return s


def _forward_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None, causal: bool,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    if _flash_cpu(q, k, v):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
        return out, lse
    if q.device.type == "cuda":
        try:
            out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, _efficient_bias(mask, q, k), True, 0.0, causal, scale=scale)
            return out, lse[..., : q.shape[-2]]
        except RuntimeError:
            pass  # shapes or dtype the kernel does not take: the math form below
    s = _math_scores(q, k, mask, causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v), lse


def _heads_first(kernel: Kernel, args: Tensors, count: int) -> list[torch.Tensor]:
    """With layout "blhe", the first `count` operands as (B, H, L, E) views of their
    (B, L, H, E) memory (which is how torch's fused kernels keep them); else as they are."""
    if kernel.attr("layout") != BLHE:
        return list(args)
    return [a.transpose(1, 2) if i < count else a for i, a in enumerate(args)]


def _heads_back(kernel: Kernel, t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2) if kernel.attr("layout") == BLHE else t


@register("ScaledDotProductAttention")
def scaled_dot_product_attention(kernel: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    args = _heads_first(kernel, args, 3)
    q, k, v, mask = _operands(args)
    scale, causal = float(kernel.attr("scale")), bool(kernel.attr("is_causal", 0))
    if len(kernel.outputs) > 1:
        out, lse = _forward_with_lse(q, k, v, mask, causal, scale)
        lse = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
        if args[0].dim() == 3:
            return out.squeeze(1), lse.squeeze(1)
        return _heads_back(kernel, out), lse
    if causal and mask is not None:  # F.sdpa takes one of them: fold the causal part in
        mask, causal = mask + _causal_bias(q.shape[-2], k.shape[-2], mask), False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    return (out.squeeze(1) if args[0].dim() == 3 else _heads_back(kernel, out),)


def _backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, mask: torch.Tensor | None, causal: bool,
              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if _flash_cpu(q, k, v):
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, causal, attn_mask=mask, scale=scale)
        return grads[0], grads[1], grads[2]
    if q.device.type == "cuda":
        try:
            pad = -lse.shape[-1] % 32  # the kernel's logsumexp rows are padded to 32
            grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
                dout, q, k, v, _efficient_bias(mask, q, k), out,
                F.pad(lse, (0, pad)), torch.empty((), dtype=torch.int64, device=q.device),
                torch.empty((), dtype=torch.int64, device=q.device), 0.0,
                [True, True, True, False], causal, scale=scale)
            return grads[0], grads[1], grads[2]
        except RuntimeError:
            pass
    p = torch.exp(_math_scores(q, k, mask, causal, scale) - lse.unsqueeze(-1).to(q.dtype))
    dv = torch.matmul(p.transpose(-2, -1), dout)
    dp = torch.matmul(dout, v.transpose(-2, -1))
    ds = p * (dp - (dout * out).sum(dim=-1, keepdim=True))
    return torch.matmul(ds, k) * scale, torch.matmul(ds.transpose(-2, -1), q) * scale, dv


@register("ScaledDotProductAttentionGrad")
def scaled_dot_product_attention_grad(kernel: Kernel, args: Tensors) -> list[torch.Tensor]:
    squeeze = args[1].dim() == 3  # rank-3 operands run as (N, 1, L, E)
    args = _heads_first(kernel, args, 5)
    dout, q, k, v, out = (_four_d(a) for a in args[:5])
    lse = args[5].unsqueeze(1) if squeeze else args[5]
    mask = _mask_4d(args[6], q.dtype, squeeze) if len(args) > 6 else None
    grads = _backward(dout, q, k, v, out, lse, mask, bool(kernel.attr("is_causal", 0)),
                      float(kernel.attr("scale")))
    mask_out = kernel.attr("output_mask", (1, 1, 1))
    return [g.squeeze(1) if squeeze else _heads_back(kernel, g)
            for g, wanted in zip(grads, mask_out, strict=True) if wanted]


# ---- Linear: MatMul(X, W) + bias as one addmm ------------------------------------------------
def _rows(t: torch.Tensor) -> torch.Tensor:
    """(..., K) as (rows, K): a view of a contiguous tensor."""
    return t.reshape(-1, t.shape[-1])


@register("Linear")
def linear(kernel: Kernel, args: Tensors) -> torch.Tensor:
    """Y = X op(W) + B over the rows of X: one addmm (mm without a bias), as torch's Linear."""
    x, w = args[0], args[1]
    w = w.t() if kernel.attr("transB", 0) else w
    rows = _rows(x)
    y = torch.mm(rows, w) if len(args) < 3 else torch.addmm(args[2].reshape(-1), rows, w)
    return y.reshape(*x.shape[:-1], w.shape[1])


@register("LinearGrad")
def linear_grad(kernel: Kernel, args: Tensors) -> list[torch.Tensor]:
    """dX = dY op(W)^T, dW = X^T dY (or dY^T X for transB), dB = dY summed over its rows."""
    dy, x, w = args
    mask = kernel.attr("output_mask", (1, 1, 0))
    trans = bool(kernel.attr("transB", 0))
    dy_rows = _rows(dy)
    outs = []
    if mask[0]:
        outs.append(torch.mm(dy_rows, w if trans else w.t()).reshape(x.shape))
    if mask[1]:
        rows = _rows(x)
        outs.append(torch.mm(dy_rows.t(), rows) if trans else torch.mm(rows.t(), dy_rows))
    if mask[2]:
        outs.append(dy_rows.sum(0).reshape(kernel.attr("bias_shape")))
    return outs
