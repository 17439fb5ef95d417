"""Forward torch kernels of the network ops: convolutions, matrix products, normalizations,
softmax, pooling, and the softmax cross-entropy loss. All are differentiable by autograd, which
the training tests use as the reference."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.geometry import (
    Window,
    conv_transpose_window,
    pool_output_size,
    torch_avg_pool_ok,
    torch_pool_ok,
    window,
)
from autotm_py.kernels.batch_norm import batch_norm_apply, batch_norm_training
from autotm_py.kernels.util import (
    attrs,
    conv_padding,
    log_softmax_rows,
    over_image_chunks,
    pad_spatial,
    register,
    unsupported,
)

Tensors = Sequence[torch.Tensor]


@register("Conv")
def conv(k: Kernel, args: Tensors) -> torch.Tensor:
    """The convolution; with `batch_chunks` (`ir.conv_split`) over slices of the batch in
    turn, each slice's output written into the whole one."""
    return over_image_chunks(k, args, lambda part: convolution(k, part))


def convolution(k: Kernel, args: Tensors) -> torch.Tensor:
    """One convolution over the whole of `args`."""
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    geo = window(attrs(k), x.shape[2:], w.shape[2:])
    padding, explicit = conv_padding(geo.pads)
    if explicit is not None:
        x = pad_spatial(x, explicit)
    return torch.ops.aten.convolution(x, w, bias, geo.strides, padding, geo.dilations, False,
                                      [0] * geo.nd, int(k.attr("group", 1)))


def cudnn_window(k: Kernel, x: torch.Tensor, w: torch.Tensor) -> Window | None:
    """The window of a Conv-like kernel where cuDNN runs it as aten's convolution does on CUDA
    (2-d, ungrouped, symmetric pads, a float type cuDNN takes); None elsewhere, where callers
    fall back to `conv`."""
    if not (x.is_cuda and torch.backends.cudnn.enabled and x.dim() == 4
            and int(k.attr("group", 1)) == 1
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16)):
        return None
    geo = window(attrs(k), x.shape[2:], w.shape[2:])
    return geo if geo.begins == geo.ends else None


def transpose_fast(geo_pads: Sequence[int], out_pad: Sequence[int], strides: Sequence[int],
                   dilations: Sequence[int]) -> bool:
    """torch's transposed convolution handles symmetric pads and output_padding < stride."""
    n = len(geo_pads) // 2
    return (list(geo_pads[:n]) == list(geo_pads[n:]) and
            all(p < max(s, d) for p, s, d in zip(out_pad, strides, dilations, strict=True)))


def transpose_crop(pads: Sequence[int], out_pad: Sequence[int]) -> list[int]:
    """ONNX pads of the full transposed output: crop `begin`, add output_padding, crop `end`."""
    n = len(pads) // 2
    return [-int(p) for p in pads[:n]] + [int(o) - int(p) for o, p in
                                           zip(out_pad, pads[n:], strict=True)]


@register("ConvTranspose")
def conv_transpose(k: Kernel, args: Tensors) -> torch.Tensor:
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    geo, out_pad = conv_transpose_window(attrs(k), x.shape[2:], w.shape[2:])
    group = int(k.attr("group", 1))
    if transpose_fast(geo.pads, out_pad, geo.strides, geo.dilations):
        return torch.ops.aten.convolution(x, w, bias, geo.strides, list(geo.begins),
                                          geo.dilations, True, list(out_pad), group)
    y = torch.ops.aten.convolution(x, w, None, geo.strides, [0] * geo.nd, geo.dilations, True,
                                   [0] * geo.nd, group)
    y = pad_spatial(y, transpose_crop(geo.pads, out_pad))
    return y if bias is None else y + bias.reshape(1, -1, *([1] * geo.nd))


@register("Gemm")
def gemm(k: Kernel, args: Tensors) -> torch.Tensor:
    a, b = args[0], args[1]
    a = a.t() if k.attr("transA", 0) else a
    b = b.t() if k.attr("transB", 0) else b
    alpha, beta = float(k.attr("alpha", 1.0)), float(k.attr("beta", 1.0))
    if len(args) > 2 and beta != 0.0:
        return torch.addmm(args[2], a, b, beta=beta, alpha=alpha)
    y = torch.mm(a, b)
    return y if alpha == 1.0 else y * alpha


@register("MatMul")
def matmul(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.matmul(args[0], args[1])


@register("BatchNormalization")
def batch_norm(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    """Inference: running statistics. Training mode (outputs Y, mean', var', saved mean,
    saved invstd): batch statistics; the running ones are updated PyTorch-style (unbiased
    variance), with ONNX momentum = weight of the old value. cuDNN where autograd would use
    it, else the native kernel (`kernels/batch_norm.py`)."""
    x, scale, bias, mean, var = args
    eps, momentum = float(k.attr("epsilon", 1e-5)), float(k.attr("momentum", 0.9))
    n_out = len(k.outputs)
    if not k.attr("training_mode", 0):
        return (F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps),)
    return batch_norm_training(x, scale, bias, mean, var, 1.0 - momentum, eps)[:n_out]


@register("BatchNormApply")
def batch_norm_again(k: Kernel, args: Tensors) -> torch.Tensor:
    """A training-mode batch norm's re-run (`ir.rerun`): Y from X, the scale, the bias and the
    saved mean and invstd of its first run."""
    return batch_norm_apply(*args, eps=float(k.attr("epsilon", 1e-5)))


@register("LayerNormalization")
def layer_norm(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    x, scale = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    axis = int(k.attr("axis", -1)) % x.dim()
    shape = tuple(x.shape[axis:])
    scale = scale if tuple(scale.shape) == shape else scale.expand(shape)
    bias = bias if bias is None or tuple(bias.shape) == shape else bias.expand(shape)
    out = torch.ops.aten.native_layer_norm(x, shape, scale, bias,
                                           float(k.attr("epsilon", 1e-5)))
    return tuple(out[: len(k.outputs)])


def channel_window_sum(t: torch.Tensor, front: int, back: int) -> torch.Tensor:
    """s[:, c] = sum of t[:, c - front .. c + back] (zero outside), for any rank >= 2."""
    n, c = t.shape[0], t.shape[1]
    flat = t.reshape(n, 1, c, -1)
    flat = F.pad(flat, (0, 0, front, back))
    summed = F.avg_pool2d(flat, (front + back + 1, 1), stride=1, divisor_override=1)
    return summed.reshape(t.shape)


def lrn_denominator(k: Kernel, x: torch.Tensor) -> torch.Tensor:
    """bias + alpha / size * (sum of squares over the ONNX channel window)."""
    size = int(k.attr("size"))
    sq = channel_window_sum(x * x, (size - 1) // 2, size // 2)
    return float(k.attr("bias", 1.0)) + float(k.attr("alpha", 1e-4)) / size * sq


@register("LRN")
def lrn(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    return x * lrn_denominator(k, x).pow(-float(k.attr("beta", 0.75)))


@register("Softmax")
def softmax(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.softmax(args[0], int(k.attr("axis", -1)))


@register("LogSoftmax")
def log_softmax(k: Kernel, args: Tensors) -> torch.Tensor:
    return torch.log_softmax(args[0], int(k.attr("axis", -1)))


# ---- pooling ----------------------------------------------------------------------------
MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


@register("MaxPool")
def max_pool(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    x = args[0]
    geo = window(attrs(k), x.shape[2:])
    ceil = bool(k.attr("ceil_mode", 0))
    want_indices = len(k.outputs) > 1
    if torch_pool_ok(geo.kernel, geo.pads):
        out = MAX_POOL[geo.nd](x, geo.kernel, geo.strides, list(geo.begins), geo.dilations,
                               ceil, return_indices=want_indices)
        if not want_indices:
            return (out,)
        return out[0], onnx_indices(k, x, out[1])
    if want_indices:
        raise unsupported(k, "MaxPool Indices with asymmetric pads")
    xp = pad_spatial(x, geo.pads, value=float("-inf"))
    return (MAX_POOL[geo.nd](xp, geo.kernel, geo.strides, 0, geo.dilations, ceil),)


def onnx_indices(k: Kernel, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """torch's per-plane argmax as ONNX flat indices (row-major, or column-major if asked)."""
    spatial = x.shape[2:]
    plane = 1
    for s in spatial:
        plane *= s
    if int(k.attr("storage_order", 0)) and len(spatial) == 2:
        h, w = spatial
        idx = (idx % w) * h + idx // w
    base = torch.arange(x.shape[0] * x.shape[1], device=x.device).reshape(
        x.shape[0], x.shape[1], *([1] * len(spatial))) * plane
    return idx + base


def avg_pool_general(x: torch.Tensor, geo_kernel: Sequence[int], strides: Sequence[int],
                     pads: Sequence[int], dilations: Sequence[int], ceil: bool,
                     include_pad: bool) -> torch.Tensor:
    """Average pooling as a depthwise convolution with a ones window, for what torch's pools
    lack (asymmetric pads, dilation): window sums divided by per-position counts."""
    n, c, *spatial = x.shape
    nd = len(spatial)
    outs = [pool_output_size(s, kk, st, pads[i], pads[nd + i], d, ceil) for i, (s, kk, st, d)
            in enumerate(zip(spatial, geo_kernel, strides, dilations, strict=True))]
    extra = [max(0, (o - 1) * st + (kk - 1) * d + 1 - (s + pads[i] + pads[nd + i]))
             for i, (o, s, kk, st, d) in
             enumerate(zip(outs, spatial, geo_kernel, strides, dilations, strict=True))]
    full = [*pads[:nd], *[pads[nd + i] + extra[i] for i in range(nd)]]
    ones_w = x.new_ones((1, 1, *geo_kernel))
    xs = pad_spatial(x.reshape(n * c, 1, *spatial), full)
    sums = torch.ops.aten.convolution(xs, ones_w, None, strides, [0] * nd, dilations, False,
                                      [0] * nd, 1)
    counts = avg_pool_counts(x, spatial, pads, extra, geo_kernel, strides, dilations,
                             include_pad)
    return (sums / counts).reshape(n, c, *sums.shape[2:])


def avg_pool_counts(x: torch.Tensor, spatial: Sequence[int], pads: Sequence[int],
                    extra: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                    dilations: Sequence[int], include_pad: bool) -> torch.Tensor:
    nd = len(spatial)
    if include_pad:  # the explicit pads count, the ceil_mode overhang does not
        mask = x.new_ones((1, 1, *[s + pads[i] + pads[nd + i] for i, s in enumerate(spatial)]))
        mask = pad_spatial(mask, [0] * nd + list(extra))
    else:
        mask = pad_spatial(x.new_ones((1, 1, *spatial)),
                           [*pads[:nd], *[pads[nd + i] + extra[i] for i in range(nd)]])
    return torch.ops.aten.convolution(mask, x.new_ones((1, 1, *kernel)), None, strides,
                                      [0] * nd, dilations, False, [0] * nd, 1)


@register("AveragePool")
def average_pool(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    geo = window(attrs(k), x.shape[2:])
    ceil, include = bool(k.attr("ceil_mode", 0)), bool(k.attr("count_include_pad", 0))
    if torch_avg_pool_ok(geo):
        return AVG_POOL[geo.nd](x, geo.kernel, geo.strides, list(geo.begins), ceil, include)
    return avg_pool_general(x, geo.kernel, geo.strides, geo.pads, geo.dilations, ceil, include)


@register("GlobalAveragePool")
def global_average_pool(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@register("GlobalMaxPool")
def global_max_pool(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    return torch.amax(x, dim=tuple(range(2, x.dim())), keepdim=True)


# ---- loss --------------------------------------------------------------------------------
def class_last(t: torch.Tensor, axis: int) -> torch.Tensor:
    """(rows, classes) view of t with the class axis moved last."""
    return t.movedim(axis, -1).reshape(-1, t.shape[axis])


@register("SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropy")
def softmax_cross_entropy(k: Kernel, args: Tensors) -> tuple[torch.Tensor, ...]:
    """Loss and log-probabilities; ONNX semantics (weights, ignore_index, reductions). Ours
    (the training derivation's, domain "autotm") reads bf16 or fp16 logits as they are and
    computes in fp32 (`util.log_softmax_rows`): its loss and log-probabilities are fp32."""
    scores, labels = args[0], args[1]
    weights = args[2] if len(args) > 2 else None
    axis = int(k.attr("axis", 1 if k.domain == "" else -1)) % scores.dim()
    log_prob = log_softmax_rows(scores, axis) if k.domain else torch.log_softmax(scores, axis)
    ignore = k.attr("ignore_index")
    reduction = str(k.attr("reduction", "mean"))
    loss = F.nll_loss(class_last(log_prob, axis), labels.reshape(-1).long(), weight=weights,
                      ignore_index=-100 if ignore is None else int(ignore), reduction=reduction)
    if reduction == "none":
        loss = loss.reshape(labels.shape)
    return (loss, log_prob)[: len(k.outputs)]


@register("MeanSquaredError")
def mean_squared_error(k: Kernel, args: Tensors) -> torch.Tensor:
    """mean((prediction - target)^2) over every element (`--loss mse`)."""
    return F.mse_loss(args[0], args[1].to(args[0].dtype), reduction="mean")


__all__ = ["channel_window_sum", "class_last", "lrn_denominator", "transpose_crop",
           "transpose_fast"]
