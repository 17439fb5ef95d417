"""Canonical forms of the shape and data-movement ops: explicit, opset-independent parameters.

Where an old opset had an attribute and a newer one an input (Slice, Pad, Split, Squeeze,
Unsqueeze, Resize...), both read into the same attr; shapes are taken from shape inference, so
0/-1 placeholders and defaults become explicit values.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autotm_py.errors import ModelImportError, ShapeError
from autotm_py.frontend.canonical_base import (
    Ctx,
    Lowered,
    as_float,
    as_ints,
    canonical,
    norm_axes,
    norm_axis,
    single,
)
from autotm_py.frontend.onnx_graph import OnnxNode, short_float


@canonical("Reshape")
def _reshape(node: OnnxNode, ctx: Ctx) -> Lowered:
    ctx.value(node, 1)  # the target must be constant, even though inference resolved it
    src, dst = ctx.shape(node.inputs[0]), ctx.shape(node.outputs[0])
    if math.prod(src) != math.prod(dst):  # ONNX shape inference does not check this
        raise ShapeError(f"Reshape node '{node.label}' cannot reshape {src} "
                         f"({math.prod(src)} elements) to {dst} ({math.prod(dst)}){ctx.hint}")
    return single(node, node.inputs[:1], {"shape": dst})


@canonical("Expand")
def _expand(node: OnnxNode, ctx: Ctx) -> Lowered:
    ctx.value(node, 1)
    return single(node, node.inputs[:1], {"shape": ctx.shape(node.outputs[0])})


@canonical("Tile")
def _tile(node: OnnxNode, ctx: Ctx) -> Lowered:
    return single(node, node.inputs[:1], {"repeats": as_ints(ctx.value(node, 1))})


@canonical("Flatten")
def _flatten(node: OnnxNode, ctx: Ctx) -> Lowered:
    rank = len(ctx.shape(node.inputs[0]))
    axis = int(node.attrs.get("axis", 1))
    if not -rank <= axis <= rank:
        raise ModelImportError(f"Flatten node '{node.label}' has axis {axis}, out of range for "
                               f"rank {rank}; the model is malformed")
    return single(node, node.inputs[:1], {"axis": axis + rank if axis < 0 else axis})


@canonical("Transpose")
def _transpose(node: OnnxNode, ctx: Ctx) -> Lowered:
    rank = len(ctx.shape(node.inputs[0]))
    perm = node.attrs.get("perm") or list(reversed(range(rank)))
    return single(node, node.inputs[:1], {"perm": tuple(norm_axis(p, rank, node) for p in perm)})


def _axes_operand(node: OnnxNode, ctx: Ctx) -> tuple[int, ...] | None:
    """Squeeze/Unsqueeze axes: an attribute before opset 13, an input from 13 on."""
    return as_ints(ctx.value(node, 1)) if ctx.opset >= 13 else node.attrs.get("axes")


@canonical("Squeeze")
def _squeeze(node: OnnxNode, ctx: Ctx) -> Lowered:
    shape = ctx.shape(node.inputs[0])
    axes = _axes_operand(node, ctx)
    axes = norm_axes(axes, len(shape), node) if axes else \
        tuple(i for i, d in enumerate(shape) if d == 1)
    return single(node, node.inputs[:1], {"axes": axes})


@canonical("Unsqueeze")
def _unsqueeze(node: OnnxNode, ctx: Ctx) -> Lowered:
    rank = len(ctx.shape(node.outputs[0]))
    axes = _axes_operand(node, ctx) or ()
    return single(node, node.inputs[:1], {"axes": norm_axes(axes, rank, node)})


@canonical("Concat")
def _concat(node: OnnxNode, ctx: Ctx) -> Lowered:
    inputs = [i for i in node.inputs if i]
    rank = len(ctx.shape(inputs[0]))
    return single(node, inputs, {"axis": norm_axis(int(node.attrs["axis"]), rank, node)})


@canonical("Split")
def _split(node: OnnxNode, ctx: Ctx) -> Lowered:
    """`split` lists every output's size (from inference, whether the file gave sizes, an
    equal split or opset 18's num_outputs)."""
    x = node.inputs[0]
    axis = norm_axis(int(node.attrs.get("axis", 0)), len(ctx.shape(x)), node)
    if ctx.opset >= 13:
        ctx.value(node, 1)  # must be constant when given
    if any(not o for o in node.outputs):
        raise ModelImportError(f"Split node '{node.label}' leaves an output unnamed; "
                               "re-export the model")
    split = tuple(ctx.shape(o)[axis] for o in node.outputs)
    return single(node, [x], {"axis": axis, "split": split}, node.outputs)


@canonical("Slice")
def _slice(node: OnnxNode, ctx: Ctx) -> Lowered:
    """starts/ends/axes/steps explicit; starts and ends clamped as ONNX defines."""
    shape = ctx.shape(node.inputs[0])
    if ctx.opset < 10:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes"), None
    else:
        starts, ends = as_ints(ctx.value(node, 1)), as_ints(ctx.value(node, 2))
        axes, steps = as_ints(ctx.value(node, 3)), as_ints(ctx.value(node, 4))
    axes = [norm_axis(a, len(shape), node) for a in (axes or range(len(starts)))]
    steps = list(steps or [1] * len(axes))
    if 0 in steps:
        raise ModelImportError(f"Slice node '{node.label}' has a step of 0; the model is "
                               "malformed")
    lo, hi = [], []
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        s, e = _clamp(int(start), int(end), step, shape[axis])
        lo.append(s)
        hi.append(e)
    attrs = {"starts": tuple(lo), "ends": tuple(hi), "axes": tuple(axes), "steps": tuple(steps)}
    return single(node, node.inputs[:1], attrs)


def _clamp(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX's clamping. The results keep ONNX meaning (clamping them again changes nothing):
    a negative-step slice that runs through index 0 ends at -dim-1, not at -1."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    end = min(max(end, -1), dim - 1)
    return min(max(start, 0), dim - 1), -dim - 1 if end == -1 else end


@canonical("Gather")
def _gather(node: OnnxNode, ctx: Ctx) -> Lowered:
    """Constant indices are made non-negative (torch's index ops reject negative ones)."""
    data, indices = node.inputs[0], node.inputs[1]
    shape = ctx.shape(data)
    axis = norm_axis(int(node.attrs.get("axis", 0)), len(shape), node)
    value = ctx.known(indices)
    if value is None or not (value < 0).any():
        return single(node, [data, indices], {"axis": axis})
    fixed = ctx.fresh(f"{indices}.nonneg")
    lowered = single(node, [data, fixed], {"axis": axis})
    lowered.constants[fixed] = np.where(value < 0, value + shape[axis], value)
    return lowered


@canonical("Pad")
def _pad(node: OnnxNode, ctx: Ctx) -> Lowered:
    """Full-rank pads (2 x rank, ONNX order), all axes listed, a numeric constant_value."""
    x = node.inputs[0]
    rank = len(ctx.shape(x))
    if ctx.opset < 11:
        pads, value, axes = node.attrs.get("pads"), node.attrs.get("value", 0.0), None
    else:
        pads, value = as_ints(ctx.value(node, 1)), as_float(ctx.value(node, 2))
        axes = as_ints(ctx.value(node, 3)) if ctx.opset >= 18 else None
    if pads is None:
        raise ModelImportError(f"Pad node '{node.label}' has no pads; the model is malformed")
    full = [0] * (2 * rank)
    axes = [norm_axis(a, rank, node) for a in (axes or range(rank))]
    for i, axis in enumerate(axes):
        full[axis], full[axis + rank] = int(pads[i]), int(pads[i + len(axes)])
    number: Any = float(value or 0.0)
    if not ctx.dtype(x).startswith(("float", "bfloat")):
        number = int(number)
    return single(node, [x], {"pads": tuple(full), "constant_value": number,
                              "axes": tuple(range(rank)),
                              "mode": node.attrs.get("mode", "constant")})


@canonical("Trilu")
def _trilu(node: OnnxNode, ctx: Ctx) -> Lowered:
    k = as_ints(ctx.value(node, 1))
    return single(node, node.inputs[:1], {"k": k[0] if k else 0,
                                          "upper": int(node.attrs.get("upper", 1))})


_RESIZE_DEFAULTS: dict[str, Any] = {
    "antialias": 0, "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75,
    "exclude_outside": 0, "extrapolation_value": 0.0, "mode": "nearest",
    "nearest_mode": "round_prefer_floor",
}


@canonical("Resize", "Upsample")
def _resize(node: OnnxNode, ctx: Ctx) -> Lowered:
    """Resize at any opset, and opset-9 Upsample, as one Resize form: explicit output `sizes`,
    per-axis `scales`. Opset 9/10 semantics are 'asymmetric' coordinates with floor rounding."""
    x, y = node.inputs[0], node.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(y)
    attrs = {k: node.attrs.get(k, v) for k, v in _RESIZE_DEFAULTS.items()}
    old = node.op_type == "Upsample" or ctx.opset < 11
    if old:
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        given, roi = ctx.value(node, 1), None
    else:
        roi, given = ctx.value(node, 1), ctx.value(node, 2)
    scales = _full_scales(node, given, in_shape, out_shape, ctx)
    roi_t = () if roi is None else tuple(float(v) for v in roi.reshape(-1))
    attrs.update(roi=roi_t, scales=scales, sizes=out_shape)
    return single(node, [x], attrs, op_type="Resize")


def _full_scales(node: OnnxNode, given: np.ndarray | None, in_shape: tuple[int, ...],
                 out_shape: tuple[int, ...], ctx: Ctx) -> tuple[float, ...]:
    rank = len(in_shape)
    if given is not None and given.size:
        axes = node.attrs.get("axes") if ctx.opset >= 18 else None
        axes = [norm_axis(a, rank, node) for a in (axes or range(rank))]
        scales = [1.0] * rank
        number = short_float if given.dtype == np.float32 else float
        for axis, s in zip(axes, given.reshape(-1).tolist(), strict=True):
            scales[axis] = number(s)
        return tuple(scales)
    return tuple(o / i if i else 1.0 for i, o in zip(in_shape, out_shape, strict=True))
