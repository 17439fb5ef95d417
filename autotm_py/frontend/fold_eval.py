"""NumPy evaluation of the ONNX ops that appear in constant subgraphs (shapes, masks, scalars).

`evaluate(node, args, ctx)` computes a node's outputs from constant inputs. The ops exporters
use to compute shapes and masks have small NumPy rules here (opset differences included);
anything else falls back to onnx's reference evaluator on a one-node model, which is slower
(about a millisecond) but rare. Both run under `np.errstate(all="ignore")`: a division by zero,
a log of 0 or a cast of inf/NaN to an integer gives the IEEE value (what onnxruntime gives)
and no RuntimeWarning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from autotm_py.errors import ModelImportError
from autotm_py.frontend.onnx_graph import OnnxNode

Arrays = list[np.ndarray]


@dataclass(frozen=True)
class EvalContext:
    opset: int
    opsets: Sequence[onnx.OperatorSetIdProto]
    shape_of: Callable[[str], tuple[int, ...] | None]
    load_tensor: Callable[[onnx.TensorProto], np.ndarray]


_RULES: dict[str, Callable[[OnnxNode, list[Any], EvalContext], Arrays]] = {}


def rule(*ops: str) -> Callable[[Callable[..., Arrays]], Callable[..., Arrays]]:
    def register(fn: Callable[..., Arrays]) -> Callable[..., Arrays]:
        for op in ops:
            _RULES[op] = fn
        return fn
    return register


def evaluate(node: OnnxNode, args: list[np.ndarray | None], ctx: EvalContext) -> Arrays:
    """The node's output values; `args` follows `node.inputs` (None for absent inputs)."""
    fn = _RULES.get(node.op_type) if node.domain == "" else None
    try:
        # IEEE results, as onnxruntime computes them, without NumPy's RuntimeWarnings: index
        # arithmetic folds log(0) = -inf, 0/0 and casts of inf/NaN to integers in lanes a
        # Where then discards (T5's relative-position buckets take log of every distance,
        # 0 included, and keep it only where the distance is large)
        with np.errstate(all="ignore"):
            outs = fn(node, args, ctx) if fn else _reference(node, args, ctx)
    except ModelImportError:
        raise
    except Exception as exc:  # numpy or the reference evaluator rejected the values
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise ModelImportError(f"cannot fold constant node '{node.label}' ({node.op_type}): "
                               f"{type(exc).__name__}: {reason}; the model is probably "
                               "malformed") from None
    return [np.asarray(o) for o in outs]


def _reference(node: OnnxNode, args: list[np.ndarray | None], ctx: EvalContext) -> Arrays:
    from onnx.reference import ReferenceEvaluator

    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in zip(node.inputs, args, strict=False) if n and a is not None]
    outputs = [onnx.ValueInfoProto(name=n) for n in node.outputs if n]
    model = helper.make_model(helper.make_graph([node.proto], "fold", inputs, outputs),
                              opset_imports=list(ctx.opsets))
    feeds = {n: a for n, a in zip(node.inputs, args, strict=False) if n and a is not None}
    return list(ReferenceEvaluator(model).run(None, feeds))


def _axes(node: OnnxNode, args: list[Any], slot: int, since: int, ctx: EvalContext) -> list[int]:
    """Axes given as an attribute before opset `since`, as an optional input from it on."""
    if ctx.opset < since:
        return list(node.attrs.get("axes", []))
    arg = args[slot] if slot < len(args) else None
    return [] if arg is None else [int(a) for a in np.asarray(arg).reshape(-1)]


# ---- sources -------------------------------------------------------------------------------
@rule("Constant")
def _constant(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    a = node.attrs
    if "value" in a:
        return [ctx.load_tensor(a["value"])]
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in a:
            return [np.array(a[key], dtype=dtype)]
    raise ModelImportError(f"Constant node '{node.label}' holds {', '.join(a) or 'nothing'}; "
                           "only numeric tensors are supported")


@rule("ConstantOfShape")
def _constant_of_shape(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    fill = ctx.load_tensor(node.attrs["value"]) if "value" in node.attrs \
        else np.zeros(1, np.float32)
    shape = tuple(int(d) for d in args[0].reshape(-1))
    # a zero-stride view: a large fill (a weight in some model-zoo files) costs no memory
    return [np.broadcast_to(fill.reshape(()), shape)]


@rule("Shape")
def _shape(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    shape = ctx.shape_of(node.inputs[0])
    assert shape is not None
    start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
    return [np.array(shape[slice(start, end)], dtype=np.int64)]


@rule("Size")
def _size(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    shape = ctx.shape_of(node.inputs[0])
    assert shape is not None
    return [np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]


@rule("Range")
def _range(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    start, limit, delta = args
    return [np.arange(start, limit, delta, dtype=np.asarray(start).dtype)]


# ---- elementwise ---------------------------------------------------------------------------
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Pow": np.power,
    "Equal": np.equal, "Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or,
    "Xor": np.logical_xor, "BitShift": np.left_shift,
}
_UNARY: dict[str, Callable[[Any], Any]] = {
    "Neg": np.negative, "Abs": np.abs, "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log,
    "Floor": np.floor, "Ceil": np.ceil, "Reciprocal": np.reciprocal, "Not": np.logical_not,
    "Sign": np.sign, "Relu": lambda x: np.maximum(x, 0), "Identity": lambda x: x,
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)), "Tanh": np.tanh,
}


@rule(*_BINARY)
def _binary(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    a, b = args
    out = _BINARY[node.op_type](a, b)
    keep_dtype = node.op_type in ("Add", "Sub", "Mul", "Pow")
    return [out.astype(a.dtype) if keep_dtype else out]


@rule("Div")
def _div(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    a, b = args
    if np.issubdtype(a.dtype, np.integer):  # ONNX integer division truncates toward zero
        return [(np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))).astype(a.dtype)]
    return [np.divide(a, b).astype(a.dtype)]


@rule("Mod")
def _mod(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    a, b = args
    return [np.fmod(a, b) if node.attrs.get("fmod", 0) else np.mod(a, b)]


@rule(*_UNARY)
def _unary(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x = args[0]
    out = _UNARY[node.op_type](x)
    return [out if node.op_type == "Not" else np.asarray(out).astype(x.dtype)]


@rule("Max", "Min", "Sum", "Mean")
def _variadic(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    ops = {"Max": np.maximum, "Min": np.minimum, "Sum": np.add, "Mean": np.add}
    values = [a for a in args if a is not None]
    out = values[0]
    for v in values[1:]:
        out = ops[node.op_type](out, v)
    if node.op_type == "Mean":
        out = out / len(values)
    return [np.asarray(out).astype(values[0].dtype)]


@rule("Where")
def _where(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    cond, x, y = args
    return [np.where(cond, x, y).astype(np.result_type(x, y))]


@rule("Cast")
def _cast(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    return [args[0].astype(helper.tensor_dtype_to_np_dtype(node.attrs["to"]))]


@rule("Clip")
def _clip(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x = args[0]
    if ctx.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    else:
        lo = args[1] if len(args) > 1 else None
        hi = args[2] if len(args) > 2 else None
    return [np.clip(x, lo, hi).astype(x.dtype)]


@rule("Trilu")
def _trilu(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x = args[0]
    k = int(args[1]) if len(args) > 1 and args[1] is not None else 0
    return [np.triu(x, k) if node.attrs.get("upper", 1) else np.tril(x, k)]


# ---- shape and data movement ---------------------------------------------------------------
@rule("Gather")
def _gather(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    data, indices = args
    return [np.take(data, indices.astype(np.int64), axis=node.attrs.get("axis", 0))]


@rule("GatherElements")
def _gather_elements(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    """numpy's take_along_axis: onnx's reference GatherElements fails on a broadcast input
    (BERT's token type ids, `Expand` of a (1, N) buffer gathered by sliced positions)."""
    data, indices = args
    axis = int(node.attrs.get("axis", 0)) % max(data.ndim, 1)
    indices = indices.astype(np.int64)
    return [np.take_along_axis(data, np.where(indices < 0, indices + data.shape[axis], indices),
                               axis=axis)]


@rule("Unsqueeze")
def _unsqueeze(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x = args[0]
    rank = x.ndim + len(_axes(node, args, 1, 13, ctx))
    axes = sorted(a % rank for a in _axes(node, args, 1, 13, ctx))
    return [np.expand_dims(x, tuple(axes))]


@rule("Squeeze")
def _squeeze(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x = args[0]
    axes = _axes(node, args, 1, 13, ctx)
    return [np.squeeze(x, tuple(a % x.ndim for a in axes)) if axes else np.squeeze(x)]


@rule("Concat")
def _concat(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    return [np.concatenate([a for a in args if a is not None], axis=node.attrs["axis"])]


@rule("Slice")
def _slice(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x = args[0]
    if ctx.opset < 10:
        a = node.attrs
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts, ends = args[1].tolist(), args[2].tolist()
        axes = args[3].tolist() if len(args) > 3 and args[3] is not None else None
        steps = args[4].tolist() if len(args) > 4 and args[4] is not None else None
    index = [slice(None)] * x.ndim
    for i, axis in enumerate(axes if axes is not None else range(len(starts))):
        step = steps[i] if steps else 1
        index[axis % x.ndim] = slice(int(starts[i]), int(ends[i]), int(step))
    # Python slices clamp out-of-range starts/ends exactly as ONNX Slice does
    return [x[tuple(index)]]


@rule("Reshape")
def _reshape(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x, shape = args[0], [int(d) for d in args[1].reshape(-1)]
    if not node.attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [x.reshape(shape)]


@rule("Flatten")
def _flatten(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x = args[0]
    axis = node.attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)]


@rule("Transpose")
def _transpose(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    return [np.transpose(args[0], node.attrs.get("perm"))]


@rule("Expand")
def _expand(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x, shape = args
    return [np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int(d) for d in shape)))]


@rule("Tile")
def _tile(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    return [np.tile(args[0], [int(r) for r in args[1]])]


@rule("Split")
def _split(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x, axis = args[0], node.attrs.get("axis", 0)
    count = len(node.outputs)
    if ctx.opset < 13:
        split = node.attrs.get("split")
    else:
        split = args[1].tolist() if len(args) > 1 and args[1] is not None else None
    if split is None:
        size = -(-x.shape[axis] // count)
        split = [min(size, x.shape[axis] - i * size) for i in range(count)]
    return list(np.split(x, np.cumsum(split)[:-1], axis=axis))


_REDUCE: dict[str, Callable[..., Any]] = {
    "ReduceSum": np.sum, "ReduceProd": np.prod, "ReduceMax": np.max, "ReduceMin": np.min,
    "ReduceMean": np.mean,
}
# the opset from which each reduction takes its axes as an input instead of an attribute
_REDUCE_AXES_INPUT = {"ReduceSum": 13}


@rule(*_REDUCE)
def _reduce(node: OnnxNode, args: list[Any], ctx: EvalContext) -> Arrays:
    x = args[0]
    axes = _axes(node, args, 1, _REDUCE_AXES_INPUT.get(node.op_type, 18), ctx)
    if not axes and node.attrs.get("noop_with_empty_axes", 0):
        return [x]
    out = _REDUCE[node.op_type](x, axis=tuple(a % x.ndim for a in axes) if axes else None,
                                keepdims=bool(node.attrs.get("keepdims", 1)))
    return [np.asarray(out).astype(x.dtype)]


def foldable_ops() -> frozenset[str]:
    """Ops with a NumPy folding rule (others fold through onnx's reference evaluator)."""
    return frozenset(_RULES)
