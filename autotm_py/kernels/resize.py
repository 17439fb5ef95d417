"""ONNX Resize (nearest, linear, cubic) and its gradient, one axis at a time.

Each resized axis is a small linear map: output position o reads input positions idx[t, o]
with weights w[t, o] (1 tap for nearest, 2 for linear, 4 for cubic), computed from ONNX's
coordinate transformation. Applying the axes one after another is exactly ONNX's separable
(bi/tri)linear and cubic interpolation. The gradient applies the transposed maps in reverse
order (index_add).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from autotm_py.ir.graph import Kernel
from autotm_py.ir.rules.geometry import resize_plan
from autotm_py.kernels.util import attrs, register, unsupported

Tensors = Sequence[torch.Tensor]


def source_coords(in_len: int, out_len: int, scale: float, ctm: str) -> np.ndarray:
    """ONNX coordinate_transformation_mode: the input coordinate of each output position."""
    o = np.arange(out_len, dtype=np.float64)
    if ctm == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_len)
    if ctm == "align_corners":
        return o * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros(out_len)
    if ctm == "asymmetric":
        return o / scale
    if ctm == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        offset = in_len / 2 * (1 - adjustment)
        return offset + (o + 0.5) / scale - 0.5
    raise ValueError(ctm)


def nearest_index(x: np.ndarray, mode: str) -> np.ndarray:
    if mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if mode == "floor":
        return np.floor(x)
    if mode == "ceil":
        return np.ceil(x)
    raise ValueError(mode)


def cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution weights of the taps at offsets -1, 0, 1, 2 from floor(x)."""
    d = np.abs(np.stack([1 + t, t, 1 - t, 2 - t]))
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


@functools.lru_cache(maxsize=256)
def axis_taps(in_len: int, out_len: int, scale: float, mode: str, ctm: str, nearest: str,
              cubic_a: float, exclude_outside: bool) -> tuple[np.ndarray, np.ndarray]:
    """(idx, w), each of shape (taps, out_len), for one resized axis."""
    x = source_coords(in_len, out_len, scale, ctm)
    if mode == "nearest":
        idx, w = nearest_index(x, nearest)[None], np.ones((1, out_len))
    elif mode == "linear":
        base = np.floor(x)
        t = x - base
        idx, w = np.stack([base, base + 1]), np.stack([1 - t, t])
    elif mode == "cubic":
        base = np.floor(x)
        idx = np.stack([base - 1, base, base + 1, base + 2])
        w = cubic_weights(x - base, cubic_a)
        if exclude_outside:
            w = np.where((idx < 0) | (idx > in_len - 1), 0.0, w)
            w = w / w.sum(axis=0, keepdims=True)
    else:
        raise ValueError(mode)
    return np.clip(idx, 0, in_len - 1).astype(np.int64), w


def _taps(k: Kernel, in_len: int, out_len: int, scale: float, like: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    mode = str(k.attr("mode", "nearest"))
    ctm = str(k.attr("coordinate_transformation_mode", "half_pixel"))
    if int(k.attr("antialias", 0)) or ctm == "tf_crop_and_resize":
        raise unsupported(k, f"Resize with antialias or {ctm!r}")
    key = (in_len, out_len, float(scale), mode, ctm,
           str(k.attr("nearest_mode", "round_prefer_floor")),
           float(k.attr("cubic_coeff_a", -0.75)), bool(k.attr("exclude_outside", 0)))
    try:
        return _device_taps(key, like.device, like.dtype)
    except ValueError as exc:
        raise unsupported(k, f"Resize option {exc}") from None


@functools.lru_cache(maxsize=256)
def _device_taps(key: tuple, device: torch.device, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`axis_taps` as tensors on `device`, made once: a copy from the host at every call
    cost time and broke CUDA-graph capture ("Cannot copy between CPU and CUDA tensors during
    CUDA graph capture": the corpus U-Net on an H100, 2026-12-06); the first, eager,
    iteration makes them before a replay's capture."""
    idx, w = axis_taps(*key)
    weights = None if key[3] == "nearest" else torch.as_tensor(w, dtype=dtype, device=device)
    return torch.as_tensor(idx, device=device), weights


def _view(rank: int, axis: int) -> list[int]:
    shape = [1] * rank
    shape[axis] = -1
    return shape


# ---- torch's own 2-d upsampling kernels ------------------------------------------------------
# Where one of torch's upsampling kernels computes ONNX's map (the forms torch exports
# `F.interpolate` as), Resize and its gradient run it: one pass over the output, where the
# taps above make two index_selects, products and sums per axis, and the gradient index_adds
# (the corpus U-Net's bilinear Resize, b32 128 -> 256: 1.49 + 2.00 ms of device time on the
# H200 by taps). Its source coordinates are ONNX's, clamped at the edges where ONNX repeats
# the edge value: the same values up to the last bit of the weights' sum.
def _upsampling(k: Kernel, in_shape: Sequence[int], out_shape: Sequence[int],
                scales: Sequence[float]) -> str | None:
    """"bilinear", "corners" (bilinear, align_corners) or "nearest" where torch's kernel of
    that name computes this Resize of a 4-d tensor's two last axes; else None."""
    if len(in_shape) != 4 or tuple(in_shape[:2]) != tuple(out_shape[:2]) or \
            tuple(scales[:2]) != (1.0, 1.0) or int(k.attr("antialias", 0)) or \
            min(out_shape[2:]) < 2 or min(scales[2:]) <= 0:
        return None
    mode = str(k.attr("mode", "nearest"))
    ctm = str(k.attr("coordinate_transformation_mode", "half_pixel"))
    if mode == "linear" and ctm in ("half_pixel", "pytorch_half_pixel"):
        return "bilinear"
    if mode == "linear" and ctm == "align_corners":
        return "corners"
    if mode == "nearest" and ctm == "asymmetric" and \
            str(k.attr("nearest_mode", "round_prefer_floor")) == "floor":
        return "nearest"
    return None


def _upsample(kind: str, x: torch.Tensor, out_hw: list[int], scales: Sequence[float]
              ) -> torch.Tensor:
    if kind == "nearest":
        return torch.ops.aten.upsample_nearest2d(x, out_hw, *scales[2:])
    return torch.ops.aten.upsample_bilinear2d(x, out_hw, kind == "corners", *scales[2:])


def _upsample_backward(kind: str, dy: torch.Tensor, in_shape: list[int],
                       scales: Sequence[float]) -> torch.Tensor:
    out_hw = list(dy.shape[2:])
    if kind == "nearest":
        return torch.ops.aten.upsample_nearest2d_backward(dy, out_hw, in_shape, *scales[2:])
    return torch.ops.aten.upsample_bilinear2d_backward(dy, out_hw, in_shape, kind == "corners",
                                                       *scales[2:])


@register("Resize")
def resize(k: Kernel, args: Tensors) -> torch.Tensor:
    x = args[0]
    out_shape, scales = resize_plan(tuple(x.shape), attrs(k))
    kind = _upsampling(k, x.shape, out_shape, scales)
    if kind is not None:
        return _upsample(kind, x, list(out_shape[2:]), scales)
    for axis, (size, out_len) in enumerate(zip(tuple(x.shape), out_shape, strict=True)):
        if size == out_len and scales[axis] == 1.0:
            continue
        idx, w = _taps(k, size, out_len, scales[axis], x)
        y = None
        for t in range(idx.shape[0]):
            term = torch.index_select(x, axis, idx[t])
            term = term if w is None else term * w[t].reshape(_view(x.dim(), axis))
            y = term if y is None else y + term
        assert y is not None
        x = y
    return x


@register("ResizeGrad")
def resize_grad(k: Kernel, args: Tensors) -> torch.Tensor:
    dy = args[0]
    shape, scales = tuple(k.attr("shape")), tuple(k.attr("scales"))
    kind = _upsampling(k, shape, dy.shape, scales)
    if kind is not None:
        return _upsample_backward(kind, dy, list(shape), scales)
    for axis in range(dy.dim() - 1, -1, -1):
        size, out_len = shape[axis], dy.shape[axis]
        if size == out_len and scales[axis] == 1.0:
            continue
        idx, w = _taps(k, size, out_len, scales[axis], dy)
        grad_shape = list(dy.shape)
        grad_shape[axis] = size
        g = dy.new_zeros(grad_shape)
        for t in range(idx.shape[0]):
            part = dy if w is None else dy * w[t].reshape(_view(dy.dim(), axis))
            g.index_add_(axis, idx[t], part)
        dy = g
    return dy
