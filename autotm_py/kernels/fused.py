"""Torch kernels of the fused ops (`ir/rules/fused.py`): scaled dot-product attention and its
gradient.

Inference (one output) calls `torch.nn.functional.scaled_dot_product_attention`, which picks
the best backend of the device. Training (a second output, the logsumexp) and the gradient
call the backend pair that autograd itself uses for SDPA, so the forward saves only the
logsumexp and the backward recomputes the scores blockwise:

- CPU: `_scaled_dot_product_flash_attention_for_cpu` and its `_backward` (float32/64,
  bfloat16, float16; Q, K and V of one head size);
- CUDA, bf16 or fp16 without a mask (causal or not), one head size of at most 128 that is a
  multiple of 8, as many key/value heads as query heads: cuDNN's attention on Hopper and later,
  flash attention on Ampere (`_cuda_backend`: torch's own dispatcher picks cuDNN there too; on
  an H200, GPT-2 small's attention in bf16 took 12.1 ms a step in the memory-efficient
  kernels against 4.2 ms in native's cuDNN ones, experiments/results/bf16/2026-12-02).
  `AUTOTM_SDPA_BACKEND` (cudnn, flash or efficient) forces one of them for such operands;
- CUDA otherwise: `_scaled_dot_product_efficient_attention` and its `_backward` (additive
  masks, any head size), with the mask padded and expanded as torch's own dispatcher does;
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

`LinearCrossEntropy` and its gradient (`--loss-chunks`) go through the rows of X a block at a
time, in one logits buffer of a block's size that every block reuses (the kernel's only large
temporary, so that under the placed allocator it is the kernel's window; on CUDA a vocabulary
of 1024 classes or more is padded with zero-weight classes to rows of 128 bytes, `_Head`, so
that cuBLAS runs its aligned kernels): the forward keeps
each row's logsumexp and the label's logit, the backward computes the block's logits again,
turns them into the block's gradient in place and adds its products into dX, dW and dB. Under
torch.autograd (the eager baselines, `runtime.eager`) the forward is an autograd Function whose
backward is that gradient kernel, so autograd saves no logits either.

`ConvRelu` (Conv + Relu) runs on CUDA as one cuDNN call that adds the bias and applies the
ReLU in its epilogue (`torch.cudnn_convolution_relu`: 2-d, ungrouped, symmetric pads, float;
on an H200 bitwise the unfused pair's for every VGG19 shape in both layouts,
`experiments/gpu/conv_relu_probe.py`); elsewhere, and under torch.autograd (that op has no
derivative), the convolution and then the ReLU, in place unless autograd records it.

The Llama-style decoder's fused ops (RMSNorm, SiLU, the rotary embedding) are in
`kernels/decoder.py`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from autotm_py.errors import ConfigError
from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.fused import (
    BLHE,
    CONV_RELU,
    block_rows,
    lse_dtype,
    padded_classes,
)
from autotm_py.kernels.loss_grad import fused_softmax_grad
from autotm_py.kernels.nn import convolution, cudnn_window
from autotm_py.kernels.util import (
    log_softmax_rows,
    loss_dtype,
    over_image_chunks,
    register,
    softmax_grad_rows,
)

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


SDPA_BACKEND_ENV = "AUTOTM_SDPA_BACKEND"
CUDA_BACKENDS = ("cudnn", "flash", "efficient")
HALF_DTYPES = (torch.bfloat16, torch.float16)


def _cuda_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None) -> str:
    """The CUDA kernel pair that runs this attention. A function of the operands alone: the
    forward and its gradient kernel must agree, because the gradient reads the logsumexp in
    the form the forward's backend wrote it."""
    head = q.shape[-1]
    fused = (q.dtype in HALF_DTYPES and mask is None and head == k.shape[-1] == v.shape[-1]
             and head % 8 == 0 and head <= 128 and q.shape[1] == k.shape[1] == v.shape[1])
    if not fused:
        return "efficient"
    forced = os.environ.get(SDPA_BACKEND_ENV, "")
    if forced:
        if forced not in CUDA_BACKENDS:
            raise ConfigError(f"{SDPA_BACKEND_ENV}={forced!r}: choose one of "
                              f"{', '.join(CUDA_BACKENDS)}, or unset it")
        return forced
    major = torch.cuda.get_device_capability(q.device)[0]
    return "cudnn" if major >= 9 else "flash" if major >= 8 else "efficient"


def _no_rng(q: torch.Tensor) -> torch.Tensor:
    """The seed/offset operand of a backward without dropout (read only with dropout)."""
    return torch.empty((), dtype=torch.int64, device=q.device)


def _half_forward(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN's or flash attention's output and logsumexp, (B, H, L) in float32 both."""
    if backend == "cudnn":
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
        return out, lse.reshape(lse.shape[:3])  # cuDNN keeps it as (B, H, L, 1)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False, scale=scale)[:2]
    return out, lse


def _half_backward(backend: str, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, causal: bool,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    l_len, s_len = q.shape[-2], k.shape[-2]
    if backend == "cudnn":  # None: an undefined tensor (no bias, no sequence offsets)
        grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse.unsqueeze(-1), _no_rng(q), _no_rng(q), None, None, None,
            l_len, s_len, 0.0, causal, scale=scale)
    else:
        grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, None, None, l_len, s_len, 0.0, causal, _no_rng(q),
            _no_rng(q), scale=scale)
    return grads[0], grads[1], grads[2]


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
    backend = _cuda_backend(q, k, v, mask) if q.device.type == "cuda" else None
    if backend in ("cudnn", "flash"):
        return _half_forward(backend, q, k, v, causal, scale)
    if backend is not None:
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
    backend = _cuda_backend(q, k, v, mask) if q.device.type == "cuda" else None
    if backend in ("cudnn", "flash"):
        return _half_backward(backend, dout, q, k, v, out, lse, causal, scale)
    if backend is not None:
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


# ---- LinearCrossEntropy: the loss over X op(W) + B a block of rows at a time ------------------
def _ce_operands(args: Tensors, trans: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(rows of X, op(W) as (K, V), the bias as (V,) or None, labels as one int64 row)."""
    x, w, labels = args[0], args[1], args[-1]
    bias = args[2].reshape(-1) if len(args) > 3 else None
    return _rows(x), w.t() if trans else w, bias, labels.reshape(-1).long()


# On these devices a vocabulary of PAD_MIN_CLASSES or more whose rows are not a multiple of 128
# bytes (GPT-2's 50257 classes; BERT's 30522 in bf16) is padded with zero classes
# (`padded_classes`) for the loss's products: cuBLAS runs its 1- and 2-element-aligned kernels
# on an odd or unaligned dimension (H200, GPT-2 b16 s1024 bf16: the chunked loss and its
# gradient took 19.3 + 34.9 ms a step, their products at about 95 TFLOP/s). The padded weight
# (and bias, and the weight's gradient) are kernel temporaries; the zero classes' logits are
# exactly 0 (0 * x) and never read by the loss, so their gradient stays 0 and adds nothing to
# dX.
PADDED_DEVICES = ("cuda",)


class _Head:
    """op(W) as (K, V) and the bias (V,) of a chunked loss, padded to `width` >= V zero
    classes where the device pads (`PADDED_DEVICES`), else themselves (width V)."""

    def __init__(self, w: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.classes = w.shape[1]
        self.width = self.classes
        if w.device.type in PADDED_DEVICES:
            self.width = padded_classes(self.classes, w.element_size())
        self.w, self.bias = w, bias
        if self.padded:
            extra = self.width - self.classes
            if w.stride(0) == 1 and w.stride(1) != 1:  # a (V, K) weight read as its transpose
                self.w = F.pad(w.t(), (0, 0, 0, extra)).t()
            else:
                self.w = F.pad(w, (0, extra))
            self.bias = None if bias is None else F.pad(bias, (0, extra))

    @property
    def padded(self) -> bool:
        return self.width != self.classes

    def weight_grad(self, like: torch.Tensor, trans: bool) -> torch.Tensor:
        """Where the weight's gradient is summed: `like` (W's own gradient) unpadded, else a
        (width, K) temporary for a transposed W, (K, width) for another."""
        if not self.padded:
            return like
        k = like.shape[1] if trans else like.shape[0]
        shape = (self.width, k) if trans else (k, self.width)
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def unpad(self, grad: torch.Tensor, trans: bool) -> torch.Tensor:
        """The first V classes of a gradient from `weight_grad`."""
        return grad[: self.classes] if trans else grad[:, : self.classes]


def _blocks(rows: int, chunks: int) -> list[slice]:
    step = block_rows(rows, chunks)
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def _block_logits(buf: torch.Tensor, rows: torch.Tensor, head: _Head) -> torch.Tensor:
    """The block's logits over the padded classes, written into the first rows of the shared
    (rows, width) buffer."""
    logits = buf[: rows.shape[0]]
    if head.bias is None:
        torch.mm(rows, head.w, out=logits)
    else:
        torch.addmm(head.bias, rows, head.w, out=logits)
    return logits


def _ce_forward(args: Tensors, trans: bool, chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, logsumexp of each row); args X, W[, B], labels."""
    rows, w, bias, labels = _ce_operands(args, trans)
    n, acc = rows.shape[0], loss_dtype(rows.dtype)
    blocks = _blocks(n, chunks)
    lse = torch.empty(n, dtype=getattr(torch, lse_dtype(str(rows.dtype).split(".")[-1])),
                      device=rows.device)
    head = _Head(w, bias)
    buf = torch.empty((blocks[0].stop, head.width), dtype=rows.dtype, device=rows.device)
    total = torch.zeros((), dtype=acc, device=rows.device)
    half = acc != rows.dtype  # the logits in bf16 or fp16, the loss in fp32
    for block in blocks:
        logits = _block_logits(buf, rows[block], head)[:, : head.classes]
        label = labels[block].unsqueeze(1)
        picked = logits.gather(1, label).squeeze(1).to(acc)
        if half:  # one fused pass: bf16 in, fp32 math and out (autocast's loss)
            block_loss = -log_softmax_rows(logits, 1).gather(1, label).squeeze(1)
            block_lse = picked + block_loss
        else:
            top = logits.amax(1)
            block_lse = logits.sub_(top.unsqueeze(1)).exp_().sum(1).log_().add_(top)
            block_loss = block_lse - picked
        lse[block] = block_lse
        total += block_loss.sum()
    return total / n, lse.reshape(args[0].shape[:-1])


def _ce_backward(args: Tensors, trans: bool, chunks: int,
                 mask: Sequence[int]) -> list[torch.Tensor]:
    """dX, dW, dB (those `mask` asks for) with d(loss) = 1; args X, W[, B], labels,
    logsumexp. The outputs are allocated first, at their sizes, then the block buffer."""
    inputs, lse = args[:-1], args[-1].reshape(-1)
    rows, w, bias, labels = _ce_operands(inputs, trans)
    n, classes = rows.shape[0], w.shape[1]
    dx = torch.empty_like(rows) if mask[0] else None
    dw = torch.empty_like(inputs[1]) if mask[1] else None
    db = torch.empty(classes, dtype=rows.dtype, device=rows.device) if mask[2] else None
    blocks = _blocks(n, chunks)
    head = _Head(w, bias)
    dw_sum = head.weight_grad(dw, trans) if dw is not None else None
    buf = torch.empty((blocks[0].stop, head.width), dtype=rows.dtype, device=rows.device)
    minus_one = torch.full((blocks[0].stop, 1), -1.0, dtype=loss_dtype(rows.dtype),
                           device=rows.device)
    for i, block in enumerate(blocks):
        part = rows[block]
        full = _block_logits(buf, part, head)  # the padded classes' logits and gradient: 0
        logits = full[:, :classes]
        # on CUDA one pass over the block's logits, in place (`loss_grad`); else torch's ops
        grad = fused_softmax_grad(logits, labels[block], 1.0 / n, logits, lse[block])
        if grad is None:
            grad = _block_grad(logits, lse[block], labels[block], 1.0 / n, minus_one)
        if dx is not None:
            torch.mm(full, head.w.t(), out=dx[block])
        if dw_sum is not None:
            a, b = (full.t(), part) if trans else (part.t(), full)
            if i == 0:
                torch.mm(a, b, out=dw_sum)
            else:
                dw_sum.addmm_(a, b)
        if db is not None:
            if i == 0:
                torch.sum(grad, 0, out=db)
            else:
                db.add_(grad.sum(0))
    if dw is not None and dw_sum is not dw:
        dw.copy_(head.unpad(dw_sum, trans))
    outs = []
    if dx is not None:
        outs.append(dx.reshape(inputs[0].shape))
    if dw is not None:
        outs.append(dw)
    if db is not None:
        outs.append(db.reshape(inputs[2].shape))
    return outs


def _block_grad(logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, scale: float,
                minus_one: torch.Tensor) -> torch.Tensor:
    """A block's logits' gradient with torch's ops, written over the logits."""
    acc = loss_dtype(logits.dtype)
    if acc != logits.dtype:  # bf16 or fp16 logits: softmax in one fused pass (fp32 out) ...
        probs = torch.softmax(logits, 1, dtype=acc)
        # ... and the gradient scaled and rounded into the logits, which the softmax has read
        return softmax_grad_rows(probs, labels, scale, logits, minus_one)
    probs = logits.sub_(lse.unsqueeze(1).to(logits.dtype)).exp_()
    return softmax_grad_rows(probs, labels, scale, None, minus_one)


class _LinearCrossEntropyFn(torch.autograd.Function):
    """The chunked loss under torch.autograd: nothing but X, W, B, the labels and the
    logsumexp is saved; the backward is `LinearCrossEntropyGrad`'s kernel."""

    @staticmethod
    def forward(ctx, trans: bool, chunks: int,  # type: ignore[override]
                *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss, lse = _ce_forward(args, trans, chunks)
        ctx.trans, ctx.chunks = trans, chunks
        ctx.save_for_backward(*args, lse)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, dloss: torch.Tensor, _dlse: torch.Tensor  # type: ignore[override]
                 ) -> tuple[torch.Tensor | None, ...]:
        saved = ctx.saved_tensors
        weighted = len(saved) - 2  # X, W[, B]
        mask = [int(ctx.needs_input_grad[2 + i]) for i in range(weighted)]
        grads = iter(_ce_backward(saved, ctx.trans, ctx.chunks, mask + [0] * (3 - weighted)))
        out = [next(grads) * dloss if wanted else None for wanted in mask]
        return (None, None, *out, None)


def _trans_chunks(kernel: Kernel) -> tuple[bool, int]:
    return bool(kernel.attr("transB", 0)), int(kernel.attr("chunks", 1))


@register("LinearCrossEntropy")
def linear_cross_entropy(kernel: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    """(loss, logsumexp); differentiable by autograd through `_LinearCrossEntropyFn`."""
    if torch.is_grad_enabled() and any(a.requires_grad for a in args):
        return _LinearCrossEntropyFn.apply(*_trans_chunks(kernel),  # type: ignore[no-any-return]
                                           *args)
    return _ce_forward(args, *_trans_chunks(kernel))


@register("LinearCrossEntropyGrad")
def linear_cross_entropy_grad(kernel: Kernel, args: Tensors) -> list[torch.Tensor]:
    return _ce_backward(args, *_trans_chunks(kernel), kernel.attr("output_mask", (1, 1, 0)))


# ---- ConvRelu: the convolution with its bias and ReLU in cuDNN's epilogue -------------------
@register(CONV_RELU)
def conv_relu(kernel: Kernel, args: Tensors) -> torch.Tensor:
    """Conv then Relu (with `batch_chunks`, over slices of the batch in turn, as Conv)."""
    return over_image_chunks(kernel, args, lambda part: _conv_relu(kernel, part))


def _conv_relu(kernel: Kernel, args: Tensors) -> torch.Tensor:
    if torch.is_grad_enabled() and any(a.requires_grad for a in args):
        return torch.relu(convolution(kernel, args))
    x, w = args[0], args[1]
    geo = cudnn_window(kernel, x, w)  # where cuDNN's fused call computes what Conv + Relu do
    if geo is not None:
        return torch.cudnn_convolution_relu(x, w, args[2] if len(args) > 2 else None,
                                            list(geo.strides), list(geo.begins),
                                            list(geo.dilations), 1)
    return convolution(kernel, args).relu_()
