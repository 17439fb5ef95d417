"""Canonical forms of the compute ops: elementwise, matrix products, convolution, pooling,
normalization, softmax, reductions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autotm_py.errors import ModelImportError, ShapeError
from autotm_py.frontend.canonical_base import (
    REQUIRED,
    Ctx,
    Lowered,
    as_float,
    as_ints,
    attrs_with_defaults,
    canonical,
    data_count,
    data_inputs,
    first_output,
    norm_axes,
    norm_axis,
    single,
    spec,
)
from autotm_py.frontend.onnx_graph import OnnxNode

# Ops whose canonical form is their data inputs plus these attributes with ONNX defaults.
PLAIN: dict[str, dict[str, Any]] = {
    **{op: {} for op in ("MatMul", "Add", "Sub", "Mul", "Div", "Pow", "Where", "Relu",
                         "Sigmoid", "Tanh", "Erf", "Sqrt", "Reciprocal", "Neg", "Exp", "Log",
                         "Abs", "GlobalAveragePool", "GlobalMaxPool")},
    "LeakyRelu": {"alpha": 0.01},
    "Gelu": {"approximate": "none"},
    "Gemm": {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
    "LRN": {"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": REQUIRED},
    "BatchNormalization": {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0},
    "SoftmaxCrossEntropyLoss": {"ignore_index": None, "reduction": "mean"},
}


@canonical(*PLAIN)
def _plain(node: OnnxNode, ctx: Ctx) -> Lowered:
    inputs = data_inputs(node, data_count(node.op_type))
    return single(node, inputs, attrs_with_defaults(node, PLAIN[node.op_type]),
                  first_output(node, ctx))


@canonical("Identity")
def _identity(node: OnnxNode, ctx: Ctx) -> Lowered:
    return Lowered(aliases={node.outputs[0]: node.inputs[0]})


@canonical("Max", "Min", "Sum")
def _nary(node: OnnxNode, ctx: Ctx) -> Lowered:
    """n-ary ONNX nodes: one input is an alias, Max/Min become binary chains, Sum takes up to
    8 operands per kernel."""
    inputs = [i for i in node.inputs if i]
    if len(inputs) == 1:
        return Lowered(aliases={node.outputs[0]: inputs[0]})
    width = 8 if node.op_type == "Sum" else 2
    out = Lowered()
    acc, rest, step = inputs[:width], inputs[width:], 0
    while True:
        last = not rest
        target = node.outputs[0] if last else ctx.fresh(f"{node.outputs[0]}.part{step}")
        out.kernels.append(spec(node, acc, {}, [target], suffix="" if last and not step
                                else f".part{step}"))
        if last:
            return out
        shape = tuple(np.broadcast_shapes(*(ctx.shape(i) for i in acc)))
        out.tensors[target] = (shape, ctx.dtype(inputs[0]))
        acc, rest, step = [target, *rest[:width - 1]], rest[width - 1:], step + 1


@canonical("Cast")
def _cast(node: OnnxNode, ctx: Ctx) -> Lowered:
    """A Cast to the dtype its input already has is an alias, not a copy: transformers' Llama
    casts to float32 around RMSNorm and the softmax whatever the model's dtype, so a float32
    export copies the attention probabilities (and hides them from the attention fusion)."""
    to = ctx.dtype(node.outputs[0])
    if to == ctx.dtype(node.inputs[0]):
        return Lowered(aliases={node.outputs[0]: node.inputs[0]})
    return single(node, node.inputs[:1], {"to": to})


@canonical("CastLike")
def _cast_like(node: OnnxNode, ctx: Ctx) -> Lowered:
    """A Cast to the second input's dtype (the dynamo exporter casts SDPA's scale like the
    queries): only that input's dtype is read, not its values."""
    return _cast(node, ctx)


@canonical("Clip")
def _clip(node: OnnxNode, ctx: Ctx) -> Lowered:
    if ctx.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    else:
        lo, hi = as_float(ctx.value(node, 1)), as_float(ctx.value(node, 2))
    return single(node, node.inputs[:1], {"min": None if lo is None else float(lo),
                                          "max": None if hi is None else float(hi)})


@canonical("Dropout")
def _dropout(node: OnnxNode, ctx: Ctx) -> Lowered:
    if ctx.opset < 12:
        ratio, training = float(node.attrs.get("ratio", 0.5)), 0
    else:
        ratio = as_float(ctx.value(node, 1))
        mode = ctx.value(node, 2)
        ratio = 0.5 if ratio is None else ratio
        training = int(bool(mode.reshape(-1)[0])) if mode is not None and mode.size else 0
    return single(node, node.inputs[:1], {"ratio": ratio, "training_mode": training},
                  first_output(node, ctx))


@canonical("LayerNormalization")
def _layer_norm(node: OnnxNode, ctx: Ctx) -> Lowered:
    rank = len(ctx.shape(node.inputs[0]))
    attrs = attrs_with_defaults(node, {"axis": -1, "epsilon": 1e-5, "stash_type": 1})
    attrs["axis"] = norm_axis(attrs["axis"], rank, node)
    return single(node, data_inputs(node, 3), attrs, first_output(node, ctx))


@canonical("Softmax", "LogSoftmax")
def _softmax(node: OnnxNode, ctx: Ctx) -> Lowered:
    """Opset-13 semantics everywhere. Before 13, softmax ran over the input flattened to 2-D
    at `axis`: unless `axis` is the last dim, that becomes Reshape -> Softmax -> Reshape."""
    x, y = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    default = -1 if ctx.opset >= 13 else 1
    axis = norm_axis(node.attrs.get("axis", default), rank, node) if rank else 0
    if ctx.opset >= 13 or axis >= rank - 1:
        return single(node, [x], {"axis": max(axis, 0)})
    flat = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    x2, y2 = ctx.fresh(f"{x}.2d"), ctx.fresh(f"{y}.2d")
    dtype = ctx.dtype(x)
    return Lowered(
        kernels=[spec(node, [x], {"shape": flat}, [x2], "Reshape", ".flatten"),
                 spec(node, [x2], {"axis": 1}, [y2]),
                 spec(node, [y2], {"shape": shape}, [y], "Reshape", ".unflatten")],
        tensors={x2: (flat, dtype), y2: (flat, dtype)})


@canonical("ReduceMean", "ReduceSum")
def _reduce(node: OnnxNode, ctx: Ctx) -> Lowered:
    x = node.inputs[0]
    rank = len(ctx.shape(x))
    since = 13 if node.op_type == "ReduceSum" else 18  # axes became an input
    axes = as_ints(ctx.value(node, 1)) if ctx.opset >= since else node.attrs.get("axes")
    if not axes and node.attrs.get("noop_with_empty_axes", 0):
        return Lowered(aliases={node.outputs[0]: x})
    axes = norm_axes(axes, rank, node) if axes else tuple(range(rank))
    return single(node, [x], {"axes": axes, "keepdims": int(node.attrs.get("keepdims", 1))})


# ---- convolution and pooling ---------------------------------------------------------------
def _spatial(node: OnnxNode, in_shape: tuple[int, ...], kernel: tuple[int, ...]) -> dict:
    """strides, dilations and explicit pads (auto_pad resolved) of a conv or pool node."""
    n = len(kernel)
    strides = tuple(node.attrs.get("strides", (1,) * n))
    dilations = tuple(node.attrs.get("dilations", (1,) * n))
    pads = list(node.attrs.get("pads", (0,) * (2 * n)))
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if auto_pad == "VALID":
        pads = [0] * (2 * n)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(n):
            size = in_shape[2 + i]
            out = -(-size // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size)
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pads[i], pads[i + n] = begin, total - begin
    return {"strides": strides, "dilations": dilations, "pads": tuple(pads)}


def conv_inputs(node: OnnxNode, ctx: Ctx) -> tuple[str, ...]:
    """X, W and the bias, without a bias that is a constant of zeros: torch's dynamo exporter
    gives every bias-free convolution one, and adding it cost ResNet-50 b64 channels-last 2.1
    ms an iteration on an H200 (a broadcast add per convolution). A trainable bias is a
    weight, never a known constant, so it stays."""
    inputs = data_inputs(node, 3)
    bias = ctx.known(inputs[2]) if len(inputs) == 3 else None
    return inputs[:2] if bias is not None and not np.any(bias) else inputs


@canonical("Conv")
def _conv(node: OnnxNode, ctx: Ctx) -> Lowered:
    x, w = node.inputs[0], node.inputs[1]
    kernel = tuple(node.attrs.get("kernel_shape", ctx.shape(w)[2:]))
    attrs = {"group": int(node.attrs.get("group", 1)), "kernel_shape": kernel,
             **_spatial(node, ctx.shape(x), kernel)}
    return single(node, conv_inputs(node, ctx), attrs)


@canonical("ConvTranspose")
def _conv_transpose(node: OnnxNode, ctx: Ctx) -> Lowered:
    """`output_shape` and `auto_pad` are folded into explicit pads and output_padding."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    kernel = tuple(node.attrs.get("kernel_shape", ctx.shape(w)[2:]))
    n = len(kernel)
    base = _spatial(node, ctx.shape(x), kernel)
    strides, dil = base["strides"], base["dilations"]
    pads = list(node.attrs.get("pads", (0,) * (2 * n)))
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    in_sp, out_sp = ctx.shape(x)[2:], ctx.shape(y)[2:]
    if "output_shape" in node.attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(n):
            full = strides[i] * (in_sp[i] - 1) + (kernel[i] - 1) * dil[i] + 1
            total = max(0, full - out_sp[i])
            small = total // 2
            pads[i], pads[i + n] = (small, total - small) if auto_pad == "SAME_UPPER" \
                else (total - small, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    extra = [out_sp[i] - (strides[i] * (in_sp[i] - 1) + (kernel[i] - 1) * dil[i] + 1
                          - pads[i] - pads[i + n]) for i in range(n)]
    if any(e < 0 for e in extra):
        raise ShapeError(f"ConvTranspose node '{node.label}': output shape {ctx.shape(y)} "
                         "is inconsistent with its pads and strides; re-export the model")
    attrs = {"group": int(node.attrs.get("group", 1)), "kernel_shape": kernel,
             "strides": strides, "dilations": dil, "pads": tuple(pads),
             "output_padding": tuple(extra)}
    return single(node, conv_inputs(node, ctx), attrs)


@canonical("MaxPool", "AveragePool")
def _pool(node: OnnxNode, ctx: Ctx) -> Lowered:
    x = node.inputs[0]
    if "kernel_shape" not in node.attrs:
        raise ModelImportError(f"{node.op_type} node '{node.label}' has no kernel_shape; the "
                               "model is malformed")
    kernel = tuple(node.attrs["kernel_shape"])
    attrs = {"kernel_shape": kernel, "ceil_mode": int(node.attrs.get("ceil_mode", 0)),
             **_spatial(node, ctx.shape(x), kernel)}
    if node.op_type == "MaxPool":
        attrs["storage_order"] = int(node.attrs.get("storage_order", 0))
    else:
        attrs["count_include_pad"] = int(node.attrs.get("count_include_pad", 0))
    return single(node, [x], attrs, first_output(node, ctx))
