"""Pure-Python resolution of ONNX window attributes (pads, auto_pad, strides, dilations).

Shared by the training rules (which write fully resolved attributes into backward kernels) and
by the torch kernels (which resolve forward kernels the same way), so both agree exactly.
Pads are in ONNX order: all begins, then all ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotm_py.errors import ShapeError


@dataclass(frozen=True)
class Window:
    """Resolved geometry of a convolution or pooling window over `nd` spatial axes."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends
    dilations: tuple[int, ...]

    @property
    def nd(self) -> int:
        return len(self.kernel)

    @property
    def symmetric(self) -> bool:
        return self.pads[: self.nd] == self.pads[self.nd:]

    @property
    def begins(self) -> tuple[int, ...]:
        return self.pads[: self.nd]

    @property
    def ends(self) -> tuple[int, ...]:
        return self.pads[self.nd:]


def _ints(value: Any, nd: int, default: int) -> tuple[int, ...]:
    if value is None or value == ():
        return (default,) * nd
    return tuple(int(v) for v in value)


def same_pads(auto_pad: str, in_sizes: Sequence[int], kernel: Sequence[int],
              strides: Sequence[int], dilations: Sequence[int]) -> tuple[int, ...]:
    """ONNX SAME_UPPER/SAME_LOWER: output = ceil(in / stride); the odd pad goes last/first."""
    begins, ends = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        big = total - small
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return (*begins, *ends)


def window(attrs: dict[str, Any], in_sizes: Sequence[int],
           kernel: Sequence[int] | None = None) -> Window:
    """Resolve a Conv/MaxPool/AveragePool kernel's attributes for spatial sizes `in_sizes`."""
    nd = len(in_sizes)
    kshape = tuple(int(v) for v in (kernel if kernel is not None else attrs["kernel_shape"]))
    strides = _ints(attrs.get("strides"), nd, 1)
    dilations = _ints(attrs.get("dilations"), nd, 1)
    auto_pad = str(attrs.get("auto_pad") or "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(auto_pad, in_sizes, kshape, strides, dilations)
    elif auto_pad == "VALID":
        pads = (0,) * (2 * nd)
    else:
        pads = _ints(attrs.get("pads"), 2 * nd, 0)
    if len(kshape) != nd or len(strides) != nd or len(pads) != 2 * nd:
        raise ShapeError(f"window attributes {attrs} do not match {nd} spatial axes")
    return Window(kshape, strides, pads, dilations)


def conv_transpose_window(attrs: dict[str, Any], in_sizes: Sequence[int],
                          kernel: Sequence[int]) -> tuple[Window, tuple[int, ...]]:
    """ConvTranspose geometry and output_padding; pads derived from output_shape if given."""
    nd = len(in_sizes)
    strides = _ints(attrs.get("strides"), nd, 1)
    dilations = _ints(attrs.get("dilations"), nd, 1)
    out_pad = _ints(attrs.get("output_padding"), nd, 0)
    auto_pad = str(attrs.get("auto_pad") or "NOTSET")
    out_shape = attrs.get("output_shape")
    if not out_shape and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [size * s for size, s in zip(in_sizes, strides, strict=True)]
    if out_shape:
        out_shape = tuple(int(v) for v in out_shape)[-nd:]
        begins, ends = [], []
        for i in range(nd):
            total = (strides[i] * (in_sizes[i] - 1) + out_pad[i]
                     + (kernel[i] - 1) * dilations[i] + 1 - out_shape[i])
            half = total // 2
            upper = auto_pad == "SAME_UPPER"
            begins.append(half if upper else total - half)
            ends.append(total - half if upper else half)
        pads = (*begins, *ends)
    elif auto_pad == "VALID":
        pads = (0,) * (2 * nd)
    else:
        pads = _ints(attrs.get("pads"), 2 * nd, 0)
    return Window(tuple(int(k) for k in kernel), strides, pads, dilations), out_pad


def pool_output_size(size: int, k: int, s: int, pb: int, pe: int, d: int, ceil: bool) -> int:
    """ONNX pooling output length (ceil_mode drops a last window that starts in the end pad)."""
    span = (k - 1) * d + 1
    if ceil:
        out = -(-(size + pb + pe - span) // s) + 1
        if (out - 1) * s >= size + pb:
            out -= 1
        return out
    return (size + pb + pe - span) // s + 1


def normalize_axes(axes: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """Non-negative, sorted axes; `None` means all axes."""
    if axes is None:
        return tuple(range(rank))
    return tuple(sorted(int(a) % rank if rank else 0 for a in axes))


def slice_ranges(shape: Sequence[int], starts: Sequence[int], ends: Sequence[int],
                 axes: Sequence[int] | None,
                 steps: Sequence[int] | None) -> list[tuple[int, int, int, int]]:
    """ONNX Slice as (axis, start, end, step) with ONNX clamping (end may be -1 for step < 0)."""
    rank = len(shape)
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    out = []
    for a, st, en, sp in zip(axes, starts, ends, steps, strict=True):
        axis, dim, st, en, sp = int(a) % rank, 0, int(st), int(en), int(sp)
        dim = shape[axis]
        st = st + dim if st < 0 else st
        en = en + dim if en < 0 else en
        if sp > 0:
            st, en = min(max(st, 0), dim), min(max(en, 0), dim)
        else:
            st, en = min(max(st, 0), dim - 1), min(max(en, -1), dim - 1)
        out.append((axis, st, en, sp))
    return out


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    """Numpy broadcasting of several shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        if len(dims) > 1:
            raise ShapeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def full_pads(rank: int, pads: Sequence[int], axes: Sequence[int] | None) -> tuple[int, ...]:
    """ONNX Pad's pads (begins then ends, for `axes` or all axes) widened to every axis."""
    axes_n = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    n = len(axes_n)
    out = [0] * (2 * rank)
    for i, axis in enumerate(axes_n):
        out[axis] = int(pads[i])
        out[rank + axis] = int(pads[n + i])
    return tuple(out)


def resize_plan(x_shape: Sequence[int], attrs: dict[str, Any]) -> tuple[tuple[int, ...],
                                                                       tuple[float, ...]]:
    """Resize output shape and the per-axis scales of ONNX's coordinate transformation.

    The output shape is `sizes` when given, else floor(input * scales); the scales are
    `scales` when given (ONNX maps coordinates with them even when sizes were rounded), else
    sizes / input. Both may be listed for `axes` only (opset 18)."""
    rank = len(x_shape)
    axes = [int(a) % rank for a in attrs.get("axes") or range(rank)]
    scales, out = [1.0] * rank, list(x_shape)
    given_scales = attrs.get("scales") or None
    sizes = [int(v) for v in attrs.get("sizes") or ()] or None
    policy = str(attrs.get("keep_aspect_ratio_policy") or "stretch")
    if sizes is not None and given_scales is None and policy != "stretch":
        ratios = [sizes[i] / x_shape[a] for i, a in enumerate(axes)]
        pick = min(ratios) if policy == "not_larger" else max(ratios)
        given_scales = [pick] * len(axes)
        sizes = [round(pick * x_shape[a]) for a in axes]
    for i, a in enumerate(axes):
        if sizes is not None:
            out[a] = sizes[i]
        else:
            out[a] = int(x_shape[a] * float(given_scales[i]))  # type: ignore[index]
        scales[a] = (float(given_scales[i]) if given_scales is not None
                     else out[a] / x_shape[a])
    return tuple(out), tuple(scales)


def torch_pool_ok(kernel: Sequence[int], pads: Sequence[int], dilations: Sequence[int] = ()
                  ) -> bool:
    """torch pools need symmetric pads of at most half the window (without torch: the
    planner asks it too, `memory.scratch.writes_in_place`)."""
    n = len(kernel)
    return (list(pads[:n]) == list(pads[n:]) and
            all(2 * p <= kk for p, kk in zip(pads[:n], kernel, strict=True)))


def torch_avg_pool_ok(geo: Window) -> bool:
    """Whether torch's own average pool computes this window (else a general path does)."""
    return torch_pool_ok(geo.kernel, geo.pads) and set(geo.dilations) <= {1}
