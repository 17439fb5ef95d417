"""Backward torch kernels of the network ops and of the loss (ops of domain "autotm").

Each calls the aten backward that PyTorch's autograd calls for the same forward op
(convolution_backward for dX and dW together, or with a one-output mask where only one is
needed, batch_norm_backward (cuDNN's on CUDA, `kernels/batch_norm.py`),
native_layer_norm_backward, _softmax_backward_data, max_pool*_with_indices_backward...), so
their cost matches what torch pays in a real training step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.geometry import pool_output_size
from autotm_py.kernels.batch_norm import batch_norm_backward
from autotm_py.kernels.loss_grad import fused_softmax_grad
from autotm_py.kernels.nn import (
    avg_pool_counts,
    channel_window_sum,
    class_last,
    lrn_denominator,
    torch_pool_ok,
    transpose_crop,
    transpose_fast,
)
from autotm_py.kernels.util import (
    conv_padding,
    expanded_like,
    negate,
    over_batch_chunks,
    over_image_chunks,
    pad_spatial,
    register,
    softmax_grad_rows,
    sum_to,
    torch_dtype,
)

Tensors = Sequence[torch.Tensor]


def _ints(k: Kernel, name: str) -> list[int]:
    return [int(v) for v in k.attr(name)]


def _padded(shape: Sequence[int], pads: Sequence[int] | None) -> list[int]:
    shape = list(shape)
    if pads is None:
        return shape
    nd = len(pads) // 2
    for i in range(nd):
        shape[len(shape) - nd + i] += int(pads[i]) + int(pads[nd + i])
    return shape


def _conv_backward(k: Kernel, dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                   mask: list[bool]) -> tuple[torch.Tensor, ...]:
    """aten.convolution_backward with the kernel's resolved geometry."""
    pads, nd = _ints(k, "pads"), len(k.attr("strides"))
    transposed = k.op_type.startswith("ConvTranspose")
    if transposed:
        out_pad = _ints(k, "output_padding")
        if transpose_fast(pads, out_pad, _ints(k, "strides"), _ints(k, "dilations")):
            padding, out_padding = pads[:nd], out_pad
        else:  # undo the crop/pad that the forward applied to the full output
            dy = pad_spatial(dy, negate(transpose_crop(pads, out_pad)))
            padding, out_padding = [0] * nd, [0] * nd
    else:
        padding, _ = conv_padding(pads)
        out_padding = [0] * nd
    return torch.ops.aten.convolution_backward(
        dy, x, w, None, _ints(k, "strides"), padding, _ints(k, "dilations"), transposed,
        out_padding, int(k.attr("group", 1)), mask)


def _explicit_pads(k: Kernel) -> Sequence[int] | None:
    """Pads a plain Conv applied to X before the convolution (asymmetric case)."""
    if k.op_type.startswith("ConvTranspose"):
        return None
    return conv_padding(_ints(k, "pads"))[1]


@register("ConvGradData", "ConvTransposeGradData")
def conv_grad_data(k: Kernel, args: Tensors) -> torch.Tensor:
    """dX from dY and W; with `batch_chunks` (`ir.conv_split`) over slices of the batch in
    turn, each slice's dX written into the whole one (bitwise the whole batch's: the images of
    a batch are independent)."""
    explicit, shape = _explicit_pads(k), list(k.attr("shape"))

    def data(part: Sequence[torch.Tensor]) -> torch.Tensor:
        dy, w = part
        x = expanded_like(dy, _padded([dy.shape[0], *shape[1:]], explicit))
        dx = _conv_backward(k, dy, x, w, [True, False, False])[0]
        return dx if explicit is None else pad_spatial(dx, negate(explicit))

    return over_image_chunks(k, args, data)


@register("ConvGradFilter", "ConvTransposeGradFilter")
def conv_grad_filter(k: Kernel, args: Tensors) -> torch.Tensor:
    """dW from dY and X; with `batch_chunks` the slices' filter gradients summed (within
    float rounding of the whole batch's: the sum's order differs)."""
    explicit = _explicit_pads(k)

    def filter_(part: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        dy, x = part
        if explicit is not None:
            x = pad_spatial(x, explicit)
        w = expanded_like(dy, k.attr("shape"))
        return [_conv_backward(k, dy, x, w, [False, True, False])[1]]

    return over_batch_chunks(k, args, [0, 0], [None], filter_)[0]


@register("ConvGrad", "ConvTransposeGrad")
def conv_grad(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    """dX and dW from one convolution_backward (as autograd does), and dB if asked: the sum of
    dY over all axes but 1, as ConvGradBias, from dY as the forward's output received it."""
    dy, x, w = args
    explicit = _explicit_pads(k)
    if explicit is not None:
        x = pad_spatial(x, explicit)
    dx, dw, _ = _conv_backward(k, dy, x, w, [True, True, False])
    if explicit is not None:
        dx = pad_spatial(dx, negate(explicit))
    if not k.attr("output_mask", (1, 1, 0))[2]:
        return dx, dw
    return dx, dw, conv_grad_bias(k, [dy])


@register("ConvGradBias")
def conv_grad_bias(k: Kernel, args: Tensors) -> torch.Tensor:
    dy = args[0]
    return dy.sum(dim=[d for d in range(dy.dim()) if d != 1])


@register("GemmGradA")
def gemm_grad_a(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, b = args
    op_b_t = b if k.attr("transB", 0) else b.t()  # op(B)^T
    da = torch.mm(op_b_t.t(), dy.t()) if k.attr("transA", 0) else torch.mm(dy, op_b_t)
    alpha = float(k.attr("alpha", 1.0))
    return da if alpha == 1.0 else da.mul_(alpha)


@register("GemmGradB")
def gemm_grad_b(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, a = args
    op_a_t = a if k.attr("transA", 0) else a.t()  # op(A)^T
    db = torch.mm(dy.t(), op_a_t.t()) if k.attr("transB", 0) else torch.mm(op_a_t, dy)
    alpha = float(k.attr("alpha", 1.0))
    return db if alpha == 1.0 else db.mul_(alpha)


@register("MatMulGradA")
def matmul_grad_a(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, b = args
    shape = tuple(k.attr("shape"))
    if b.dim() == 1:  # y[..., m] = a[..., m, :] . b
        return sum_to(dy.unsqueeze(-1) * b, shape)
    if len(shape) == 1:  # y[..., n] = a . b[..., :, n]
        return sum_to(torch.matmul(b, dy.unsqueeze(-1)).squeeze(-1), shape)
    return sum_to(torch.matmul(dy, b.transpose(-1, -2)), shape)


@register("MatMulGradB")
def matmul_grad_b(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, a = args
    shape = tuple(k.attr("shape"))
    if a.dim() == 1:
        return sum_to(a.unsqueeze(-1) * dy.unsqueeze(-2), shape)
    if len(shape) == 1:
        return torch.mv(a.reshape(-1, a.shape[-1]).t(), dy.reshape(-1))
    if len(shape) == 2 and a.dim() > 2:  # shared weight: fold the batch into one GEMM
        return torch.mm(a.reshape(-1, a.shape[-1]).t(), dy.reshape(-1, dy.shape[-1]))
    return sum_to(torch.matmul(a.transpose(-1, -2), dy), shape)


def _masked(outs: Sequence[torch.Tensor | None], mask: Sequence[int]) -> tuple[torch.Tensor, ...]:
    return tuple(o for o, m in zip(outs, mask, strict=True) if m)  # type: ignore[misc]


@register("BatchNormGrad")
def batch_norm_grad(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    dy, x, scale, mean, invstd = args
    mask = [bool(m) for m in k.attr("output_mask")]
    outs = batch_norm_backward(dy, x, scale, mean, invstd, float(k.attr("epsilon", 1e-5)), mask)
    return _masked(outs, mask)


@register("LayerNormGrad")
def layer_norm_grad(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    dy, x, scale, mean, invstd = args
    mask = [bool(m) for m in k.attr("output_mask")]
    shape = tuple(x.shape[int(k.attr("axis")):])
    weight = scale if tuple(scale.shape) == shape else scale.expand(shape).contiguous()
    # the bias only tells aten that dB is wanted; its values are never read
    bias = dy.new_empty(shape) if mask[2] else None
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy, x, shape, mean, invstd, weight,
                                                           bias, mask)
    if dw is not None:
        dw = sum_to(dw, scale.shape)
    if db is not None and k.attr("bias_shape") is not None:
        db = sum_to(db, k.attr("bias_shape"))
    return _masked((dx, dw, db), mask)


@register("LRNGrad")
def lrn_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    """dX = dY s^-beta - (2 alpha beta / size) X sum_window^T(dY Y / s)."""
    dy, x, y = args
    size, beta = int(k.attr("size")), float(k.attr("beta", 0.75))
    alpha = float(k.attr("alpha", 1e-4))
    s = lrn_denominator(k, x)
    back = channel_window_sum(dy * y / s, size // 2, (size - 1) // 2)
    return dy * s.pow(-beta) - (2.0 * alpha * beta / size) * x * back


@register("SoftmaxGrad")
def softmax_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, y = args
    return torch.ops.aten._softmax_backward_data(dy, y, int(k.attr("axis")), y.dtype)


@register("LogSoftmaxGrad")
def log_softmax_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy, y = args
    return torch.ops.aten._log_softmax_backward_data(dy, y, int(k.attr("axis")), y.dtype)


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(2)


@register("MaxPoolGrad")
def max_pool_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    """Recompute the argmax from X (nothing but X is saved), then scatter dY to it."""
    dy, x = args
    kernel, strides = _ints(k, "kernel_shape"), _ints(k, "strides")
    pads, dilations, ceil = _ints(k, "pads"), _ints(k, "dilations"), bool(k.attr("ceil_mode"))
    nd = len(kernel)
    explicit = None if torch_pool_ok(kernel, pads) else pads
    padding = [0] * nd if explicit is not None else pads[:nd]
    xin = x if explicit is None else pad_spatial(x, explicit, value=float("-inf"))
    if nd == 1:  # run 1-d pooling as 2-d with a unit leading spatial axis
        xin, dy = _as_2d(xin), _as_2d(dy)
        kernel, strides = [1, *kernel], [1, *strides]
        padding, dilations = [0, *padding], [1, *dilations]
    if len(kernel) == 2:
        _, idx = torch.ops.aten.max_pool2d_with_indices(xin, kernel, strides, padding,
                                                        dilations, ceil)
        dx = torch.ops.aten.max_pool2d_with_indices_backward(dy, xin, kernel, strides, padding,
                                                             dilations, ceil, idx)
    else:
        _, idx = torch.ops.aten.max_pool3d_with_indices(xin, kernel, strides, padding,
                                                        dilations, ceil)
        dx = torch.ops.aten.max_pool3d_with_indices_backward(dy, xin, kernel, strides, padding,
                                                             dilations, ceil, idx)
    dx = dx.squeeze(2) if nd == 1 else dx
    return dx if explicit is None else pad_spatial(dx, negate(explicit))


AVG_BACKWARD = {2: torch.ops.aten.avg_pool2d_backward, 3: torch.ops.aten.avg_pool3d_backward}


@register("AveragePoolGrad")
def average_pool_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy = args[0]
    shape, kernel, strides = _ints(k, "shape"), _ints(k, "kernel_shape"), _ints(k, "strides")
    pads, dilations = _ints(k, "pads"), _ints(k, "dilations")
    ceil, include = bool(k.attr("ceil_mode")), bool(k.attr("count_include_pad"))
    nd = len(kernel)
    if not (torch_pool_ok(kernel, pads) and set(dilations) <= {1}):
        return _avg_pool_grad_general(dy, shape, kernel, strides, pads, dilations, ceil,
                                      include)
    padding = pads[:nd]
    if nd == 1:
        dx = AVG_BACKWARD[2](_as_2d(dy), expanded_like(dy, [*shape[:2], 1, shape[2]]),
                             [1, *kernel], [1, *strides], [0, *padding], ceil, include, None)
        return dx.squeeze(2)
    return AVG_BACKWARD[nd](dy, expanded_like(dy, shape), kernel, strides, padding, ceil,
                            include, None)


def _avg_pool_grad_general(dy: torch.Tensor, shape: Sequence[int], kernel: Sequence[int],
                           strides: Sequence[int], pads: Sequence[int],
                           dilations: Sequence[int], ceil: bool, include: bool) -> torch.Tensor:
    """Transpose of `avg_pool_general`: divide by the counts, then a ones-window
    transposed convolution back onto the padded input, then crop the pads."""
    n, c, *spatial = shape
    nd = len(spatial)
    outs = list(dy.shape[2:])
    extra = [max(0, (o - 1) * st + (kk - 1) * d + 1 - (s + pads[i] + pads[nd + i]))
             for i, (o, s, kk, st, d) in
             enumerate(zip(outs, spatial, kernel, strides, dilations, strict=True))]
    assert outs == [pool_output_size(s, kk, st, pads[i], pads[nd + i], d, ceil)
                    for i, (s, kk, st, d) in
                    enumerate(zip(spatial, kernel, strides, dilations, strict=True))]
    counts = avg_pool_counts(dy, spatial, pads, extra, kernel, strides, dilations, include)
    full = [*pads[:nd], *[pads[nd + i] + extra[i] for i in range(nd)]]
    g = (dy / counts).reshape(n * c, 1, *outs)
    xs = expanded_like(dy, [n * c, 1, *_padded(spatial, full)])
    dxs = torch.ops.aten.convolution_backward(g, xs, dy.new_ones((1, 1, *kernel)), None,
                                              list(strides), [0] * nd, list(dilations), False,
                                              [0] * nd, 1, [True, False, False])[0]
    return pad_spatial(dxs, negate(full)).reshape(shape)


@register("GlobalAveragePoolGrad")
def global_average_pool_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy = args[0]
    shape = _ints(k, "shape")
    count = 1
    for s in shape[2:]:
        count *= s
    return dy.expand(shape) / count


@register("GlobalMaxPoolGrad")
def global_max_pool_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    """dY shared equally by the elements that tie for the maximum (as torch.amax does)."""
    dy, x, y = args
    mask = x == y
    counts = mask.sum(dim=tuple(range(2, x.dim())), keepdim=True)
    return mask * (dy / counts)


@register("SoftmaxCrossEntropyGrad")
def softmax_cross_entropy_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    """(softmax - onehot(label)) * per-row weight / normalizer, with d(loss) = 1; computed in
    the log-probabilities' dtype and written in `to` where given (fp32 log-probabilities of
    bf16 logits: the gradient rounded once to bf16, `util.softmax_grad_rows`)."""
    log_prob, labels = args[0], args[1]
    weights = args[2] if len(args) > 2 else None
    axis = int(k.attr("axis"))
    ignore = k.attr("ignore_index")
    rows = class_last(log_prob, axis)
    lab = labels.reshape(-1).long()
    to = k.attr("to")
    out = None if to is None else torch.empty(rows.shape, dtype=torch_dtype(to),
                                              device=rows.device)
    moved = list(log_prob.movedim(axis, -1).shape)
    if weights is None and ignore is None:  # one scale for every row: one pass on CUDA
        mean = str(k.attr("reduction", "mean")) == "mean"
        fused = fused_softmax_grad(rows, lab, 1.0 / lab.numel() if mean else 1.0, out)
        if fused is not None:
            return fused.reshape(moved).movedim(-1, axis)
    coef = torch.ones(lab.shape, dtype=rows.dtype, device=rows.device)
    if weights is not None:
        coef = weights[lab.clamp(0, rows.shape[1] - 1)].to(rows.dtype)
    if ignore is not None:
        keep = lab != int(ignore)
        coef = coef * keep
        lab = torch.where(keep, lab, torch.zeros_like(lab))
    if str(k.attr("reduction", "mean")) == "mean":
        coef = coef / coef.sum()
    grad = softmax_grad_rows(rows.exp(), lab, coef.unsqueeze(1), out)
    return grad.reshape(moved).movedim(-1, axis)


@register("MeanSquaredErrorGrad")
def mean_squared_error_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    """2 (prediction - target) / numel, with d(loss) = 1 (as autograd's mse_loss_backward)."""
    prediction, target = args[0], args[1].to(args[0].dtype)
    return torch.ops.aten.mse_loss_backward(torch.ones((), dtype=prediction.dtype,
                                                       device=prediction.device),
                                            prediction, target, 1)  # 1: Reduction::Mean
