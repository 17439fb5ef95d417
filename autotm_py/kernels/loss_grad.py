"""The softmax cross-entropy's gradient in one pass over the classes on CUDA (a Triton kernel).

The logits' gradient of a mean cross-entropy is (exp(x - shift) - onehot(label)) * scale per
row: x the log-probabilities (shift 0) or the logits (shift their logsumexp). Written with torch
ops it takes an exp pass, a scatter and a scaling pass, each over all of the rows' classes; for
GPT-2's 16384 x 50257 fp32 log-probabilities and a bf16 gradient that was 1.55 + 3.42 ms on the
H200, where native autocast's fused log-softmax backward took about 2 ms (docs/results.md,
2026-12-03). One Triton program a row reads x once and writes the gradient once, in the output's
dtype, rounded once from fp32 math in torch's order (exp, minus one at the label, times the
scale).

`fused_softmax_grad` runs it where it can (a CUDA tensor, Triton installed, rows of unit stride)
and returns False elsewhere, having written nothing: the callers then run the torch ops. The CPU
(and CI) always takes the torch ops; the GPU tests compare the two (tests/test_loss_grad_gpu.py).
"""

from __future__ import annotations

import torch

try:  # Triton ships with torch's CUDA wheels, not its CPU one
    import triton
    import triton.language as tl
except ImportError:
    triton = None
else:
    try:  # CUDA's own expf, which torch's exp calls, so fp32 gradients equal the torch ops'
        # (tl.exp is the faster ex2.approx, a few ulp away)
        from triton.language.extra.libdevice import exp as _exp
    except ImportError:
        _exp = tl.exp

# dtypes the kernel reads and writes (upcast to fp32 on load, rounded once on store)
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# classes each program handles per step of its loop over a row: 4096 fp32 is 16 KiB in
# registers across 8 warps, enough to keep the row's loads in flight
_MAX_BLOCK = 4096


def fused_softmax_grad(src: torch.Tensor, labels: torch.Tensor, scale: float,
                       out: torch.Tensor | None = None, shift: torch.Tensor | None = None
                       ) -> torch.Tensor | None:
    """out[r, c] = (exp(src[r, c] - shift[r]) - (c == labels[r])) * scale for (rows, classes)
    `src` and `out` (new, in src's dtype, where None; it may be `src` itself: each element is
    read before it is written), `labels` the rows' class indices in [0, classes), `shift` None
    (0) or one fp32 value a row. Returns `out`; None, with nothing written or allocated, where
    the kernel cannot run."""
    if triton is None or not _runs(src, labels, out, shift):
        return None
    if out is None:
        out = torch.empty(src.shape, dtype=src.dtype, device=src.device)
    rows, classes = src.shape
    if rows == 0:
        return out
    block = min(_MAX_BLOCK, max(128, 1 << (classes - 1).bit_length()))
    _softmax_grad[(rows,)](src, src.stride(0), src if shift is None else shift,
                           labels.contiguous(), out, out.stride(0), classes, float(scale),
                           SHIFTED=shift is not None, BLOCK=block,
                           num_warps=8 if block >= 2048 else 4)
    return out


def _runs(src: torch.Tensor, labels: torch.Tensor, out: torch.Tensor | None,
          shift: torch.Tensor | None) -> bool:
    """The operands the kernel takes: 2-D CUDA rows of unit stride on one device, float dtypes,
    integer labels one a row, an fp32 shift one a row."""
    if not (src.is_cuda and labels.device == src.device) or src.dim() != 2 or \
            labels.numel() != src.shape[0] or labels.is_floating_point():
        return False
    if src.dtype not in _FLOATS or src.stride(1) != 1:
        return False
    if out is not None and (out.device != src.device or out.shape != src.shape
                            or out.dtype not in _FLOATS or out.stride(1) != 1):
        return False
    return shift is None or (shift.dtype == torch.float32 and shift.is_contiguous()
                             and shift.numel() == src.shape[0] and shift.device == src.device)


if triton is not None:
    @triton.jit
    def _softmax_grad(src, src_stride, shift, labels, out, out_stride, classes, scale,
                      SHIFTED: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        label = tl.load(labels + row)
        top = 0.0
        if SHIFTED:
            top = tl.load(shift + row).to(tl.float32)
        for start in range(0, classes, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < classes
            x = tl.load(src + row * src_stride + cols, mask=inside, other=0.0).to(tl.float32)
            g = _exp(x - top)
            g = tl.where(cols == label, g - 1.0, g) * scale
            tl.store(out + row * out_stride + cols, g.to(out.dtype.element_ty), mask=inside)
