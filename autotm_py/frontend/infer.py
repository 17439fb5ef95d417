"""ONNX shape inference on a weightless *skeleton* of the graph.

The skeleton holds the nodes still to be imported, the bound graph inputs, small known values
as initializers, and everything else that is constant (weights, large folded values) as typed
graph inputs: shape inference sees every shape but no weight bytes, so it stays fast and never
hits protobuf's 2 GB limit. Stale `value_info` and output shapes of the file are dropped, so
the bound dimensions propagate everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autotm_py.errors import ShapeError
from autotm_py.frontend.onnx_graph import OnnxGraph, OnnxNode

# Known values up to this many elements go into the skeleton as initializers (shape logic
# needs them: data propagation, Reshape targets); larger ones only as typed inputs.
INLINE_VALUE_ELEMENTS = 1 << 16


@dataclass(frozen=True)
class TensorInfo:
    """What inference knows of a tensor: ONNX elem type and dims (None where unknown)."""

    elem_type: int
    shape: tuple[int | None, ...] | None

    @property
    def static(self) -> tuple[int, ...] | None:
        """The shape if every dim is known, else None."""
        if self.shape is None or any(d is None for d in self.shape):
            return None
        return self.shape  # type: ignore[return-value]


def info_of(value: onnx.ValueInfoProto) -> TensorInfo | None:
    if value.type.WhichOneof("value") != "tensor_type":
        return None
    ttype = value.type.tensor_type
    if not ttype.HasField("shape"):
        return TensorInfo(ttype.elem_type, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim)
    return TensorInfo(ttype.elem_type, dims)


def infer_shapes(graph: OnnxGraph, nodes: Iterable[OnnxNode], input_shapes: Mapping[str, tuple],
                 values: Mapping[str, np.ndarray], typed: Mapping[str, TensorInfo],
                 *, ir_version: int, opsets: list[onnx.OperatorSetIdProto],
                 hint: str = "") -> dict[str, TensorInfo]:
    """Run ONNX shape inference once on the skeleton; return the info of every tensor."""
    skeleton = _skeleton(graph, list(nodes), input_shapes, values, typed)
    skeleton.opset_import.extend(opsets)
    skeleton.ir_version = max(ir_version, 4)  # IR >= 4: initializers need not be inputs
    inferred = _run_inference(skeleton, graph.source, hint)
    found: dict[str, TensorInfo] = {}
    for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        info = info_of(value)
        if info is not None:
            found[value.name] = info
    for init in inferred.graph.initializer:
        found[init.name] = TensorInfo(init.data_type, tuple(init.dims))
    return found


def _run_inference(skeleton: onnx.ModelProto, source: str, hint: str) -> onnx.ModelProto:
    """Strict inference with data propagation (it resolves most Shape->Reshape chains); data
    propagation is only a shortcut (we fold those chains anyway), so if it trips, retry
    without it before reporting the error."""
    errors = (onnx.shape_inference.InferenceError, onnx.checker.ValidationError)
    try:
        return onnx.shape_inference.infer_shapes(skeleton, strict_mode=True, data_prop=True)
    except errors as exc:
        first = exc
    try:
        return onnx.shape_inference.infer_shapes(skeleton, strict_mode=True, data_prop=False)
    except errors:
        fix = hint or "; the shapes are inconsistent: check --batch/--dim or re-export the model"
        raise ShapeError(f"ONNX shape inference failed on model '{source}': "
                         f"{_first_line(str(first))}{fix}") from None


def _skeleton(graph: OnnxGraph, nodes: list[OnnxNode], input_shapes: Mapping[str, tuple],
              values: Mapping[str, np.ndarray], typed: Mapping[str, TensorInfo]
              ) -> onnx.ModelProto:
    """The nodes, the bound inputs, small values as initializers, other statics as typed
    inputs, and the outputs without their (possibly stale) shapes."""
    used = {n for node in nodes for n in node.inputs if n}
    inputs = [helper.make_tensor_value_info(n, graph.inputs[n].type.tensor_type.elem_type,
                                            list(s)) for n, s in input_shapes.items()]
    inits = []
    for name in sorted(used - set(input_shapes)):
        if name in values and values[name].size <= INLINE_VALUE_ELEMENTS:
            inits.append(numpy_helper.from_array(np.array(values[name], order="C"), name))
        elif name in typed:
            info = typed[name]
            inputs.append(helper.make_tensor_value_info(name, info.elem_type, info.shape))
    produced = {o for node in nodes for o in node.outputs}
    outputs = [onnx.ValueInfoProto(name=n) for n in graph.outputs if n in produced]
    proto = helper.make_graph([n.proto for n in nodes], graph.name or "g", inputs, outputs,
                              initializer=inits)
    model = onnx.ModelProto()
    model.graph.CopyFrom(proto)
    return model


def _first_line(text: str) -> str:
    """ONNX packs several errors into one message; keep the first, on one line."""
    lines = [ln.strip() for ln in text.replace("\\n", "\n").splitlines() if ln.strip()]
    return " ".join(lines[:2])[:400] if lines else "unknown error"
