"""Constant folding interleaved with ONNX shape inference.

A node is *static* when all its inputs are constants or weights (or, for Shape/Size, when its
input's shape is known). Static nodes never become kernels, except in one case; each gets a mode:
- VALUE: evaluated with NumPy (shape arithmetic, masks, scalars, tables). Its value is kept.
- SHAPE: a layout op (Transpose, Reshape, Cast...) applied to a weight whose value nobody needs:
  the result is a new weight, known by its shape only (weights are never read).
- KERNEL: a compute op on a weight whose value nobody needs (an embedding Gather of position
  ids, a Slice of a weight): it stays a kernel so the weight keeps its true size; its constant
  operands become CONSTANT tensors.
Floating-point initializers are weights; values derived from them are "weight-like". Modes are
decided in reverse topological order (a value is needed when a VALUE node reads it or when it
parametrizes a kernel), then values are computed in topological order. Each round runs ONNX
shape inference once; another round runs only when folding found a shape that was unknown
(a Reshape target computed by Range/Where chains), so most models need one or two.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from autotm_py.errors import ModelImportError, ShapeError
from autotm_py.frontend.fold_eval import EvalContext, evaluate
from autotm_py.frontend.infer import INLINE_VALUE_ELEMENTS, TensorInfo, infer_shapes
from autotm_py.frontend.onnx_graph import OnnxGraph, OnnxNode
from autotm_py.ir.ops import FORWARD_OPS, VARIADIC_OPS

log = logging.getLogger(__name__)

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
                         TensorProto.BFLOAT16})
LAYOUT_OPS = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast",
                        "Identity"})
NEVER_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                        "RandomUniformLike", "Multinomial", "Bernoulli"})
# Larger static results are not materialized unless some value truly needs them.
VALUE_CAP_ELEMENTS = 1 << 26
MAX_ROUNDS = 6
EXTRA_PARAM_SLOTS = {"Upsample": (1,)}
# Ops whose parameter operands are not the slots after their data slots: LSTM's and GRU's
# `sequence_lens` (slot 4) sits between data slots (`frontend/canonical_rnn.py`).
PARAM_SLOTS = {"LSTM": (4,), "GRU": (4,)}


class Mode(Enum):
    VALUE = "value"
    SHAPE = "shape"
    KERNEL = "kernel"


def param_slots(node: OnnxNode) -> range | tuple[int, ...]:
    """Input slots of a kernel node that parametrize it (folded into attrs)."""
    if node.op_type in PARAM_SLOTS:
        return PARAM_SLOTS[node.op_type]
    info = FORWARD_OPS.get(node.op_type)
    if info is None or node.op_type in VARIADIC_OPS:
        return EXTRA_PARAM_SLOTS.get(node.op_type, ())
    return range(len(info.data), len(node.inputs))


@dataclass
class FoldResult:
    """What the canonicalizer needs: kernel nodes, tensor infos, known values, statics."""

    kernels: list[OnnxNode]
    infos: dict[str, TensorInfo]
    values: dict[str, np.ndarray]
    static: set[str]
    weightlike: set[str]
    modes: dict[int, Mode]
    rounds: int = 1


@dataclass
class Folder:
    graph: OnnxGraph
    input_shapes: Mapping[str, tuple[int, ...]]
    model: onnx.ModelProto
    hint: str = ""
    values: dict[str, np.ndarray] = field(default_factory=dict)
    infos: dict[str, TensorInfo] = field(default_factory=dict)

    # ---- driver --------------------------------------------------------------------------
    def run(self) -> FoldResult:
        self._preload_small_initializers()
        folded: set[int] = set()
        for rounds in range(1, MAX_ROUNDS + 1):
            nodes = [n for n in self.graph.nodes if n.index not in folded]
            self.infos = self._infer(nodes)
            static, weightlike = self._static_sets()
            modes, needed = self._modes(static, weightlike)
            static, modes = self._demote(static, modes)
            new = self._load_needed(needed) + self._evaluate(modes)
            folded |= {i for i, m in modes.items() if m is Mode.VALUE}
            kernels = [n for n in self.graph.nodes if modes.get(n.index, Mode.KERNEL)
                       is Mode.KERNEL]
            missing = self._unknown_shapes(kernels)
            if not missing or not new:
                break
            log.debug("fold round %d: %d values found, %d shapes unknown", rounds, new,
                      len(missing))
        if missing:
            self._raise_unknown(missing[0])
        return FoldResult(kernels, self._all_infos(), self.values, static, weightlike, modes,
                          rounds)

    def _infer(self, nodes: list[OnnxNode]) -> dict[str, TensorInfo]:
        typed = {name: TensorInfo(t.data_type, tuple(t.dims))
                 for name, t in self.graph.initializers.items()}
        typed.update({name: _info_of_array(v) for name, v in self.values.items()})
        return infer_shapes(self.graph, nodes, self.input_shapes, self.values, typed,
                            ir_version=self.model.ir_version,
                            opsets=list(self.model.opset_import), hint=self.hint)

    # ---- classification ------------------------------------------------------------------
    def _static_sets(self) -> tuple[set[str], set[str]]:
        """Static tensors, and the weight-like ones among them (forward pass)."""
        static = set(self.graph.initializers) | set(self.values)
        weightlike = {n for n, t in self.graph.initializers.items()
                      if t.data_type in FLOAT_TYPES}
        for node in self.graph.nodes:
            if not self._is_static(node, static):
                continue
            static.update(o for o in node.outputs if o)
            if node.op_type not in ("Shape", "Size") and any(i in weightlike for i in node.inputs):
                weightlike.update(o for o in node.outputs if o)
        return static, weightlike

    def _is_static(self, node: OnnxNode, static: set[str]) -> bool:
        if node.domain != "" or node.op_type in NEVER_FOLD or not node.outputs:
            return False
        if all(o in self.values for o in node.outputs if o):
            return True
        if node.op_type in ("Shape", "Size"):
            return self.shape_of(node.inputs[0]) is not None
        return all(i in static for i in node.inputs if i)

    def _modes(self, static: set[str], weightlike: set[str]) -> tuple[dict[int, Mode],
                                                                      set[str]]:
        """Reverse topological pass: decide each static node's mode, and which values are
        needed (read by a VALUE node, or a parameter of a kernel)."""
        needed: set[str] = set()
        modes: dict[int, Mode] = {}
        for node in reversed(self.graph.nodes):
            outs = [o for o in node.outputs if o]
            if not all(o in static for o in outs):
                needed.update(node.inputs[s] for s in param_slots(node) if s < len(node.inputs))
                continue
            mode = self._mode(node, outs, needed, weightlike)
            modes[node.index] = mode
            if mode is Mode.VALUE and node.op_type not in ("Shape", "Size"):
                needed.update(i for i in node.inputs if i)
            elif mode is Mode.KERNEL:
                needed.update(node.inputs[s] for s in param_slots(node) if s < len(node.inputs))
        return modes, needed

    def _mode(self, node: OnnxNode, outs: list[str], needed: set[str],
              weightlike: set[str]) -> Mode:
        if all(o in self.values for o in outs) or any(o in needed for o in outs):
            return Mode.VALUE
        supported = node.op_type in FORWARD_OPS
        if supported and node.op_type != "Identity" and self._too_big(outs):
            return Mode.KERNEL
        floating = all(self.elem_type(o) in FLOAT_TYPES for o in outs)
        if not any(o in weightlike for o in outs) or not floating:
            return Mode.VALUE
        if node.op_type in LAYOUT_OPS and (node.op_type == "Identity" or self._sole_reader(node)):
            return Mode.SHAPE
        return Mode.KERNEL if supported else Mode.VALUE

    def _sole_reader(self, node: OnnxNode) -> bool:
        """True when no other node reads the layout op's input. Folding a Transpose of a weight
        that is also read elsewhere (a tied embedding and output projection) would untie it
        into two weights, so such a layout op stays a kernel."""
        source = node.inputs[0]
        return source not in self.graph.initializers or (
            self._readers[source] <= 1 and source not in self.graph.outputs)

    @cached_property
    def _readers(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.graph.nodes:
            for name in set(n.inputs):
                if name:
                    counts[name] = counts.get(name, 0) + 1
        return counts

    def _too_big(self, outs: list[str]) -> bool:
        shapes = [self.shape_of(o) for o in outs]
        return any(s is not None and int(np.prod(s, dtype=np.int64)) > VALUE_CAP_ELEMENTS
                   for s in shapes)

    def _demote(self, static: set[str], modes: dict[int, Mode]) -> tuple[set[str],
                                                                         dict[int, Mode]]:
        """Forward pass: outputs of KERNEL nodes are not static; a SHAPE node reading one
        becomes a kernel too."""
        dynamic: set[str] = set()
        for node in self.graph.nodes:
            mode = modes.get(node.index)
            if mode is Mode.SHAPE and any(i in dynamic for i in node.inputs):
                modes[node.index] = mode = Mode.KERNEL
            if mode is None or mode is Mode.KERNEL:
                dynamic.update(o for o in node.outputs if o)
        return static - dynamic, modes

    # ---- evaluation ----------------------------------------------------------------------
    def _load_needed(self, needed: set[str]) -> int:
        """Load initializers whose values are needed (a float Upsample scale, say), so the
        next inference round sees them."""
        todo = [n for n in needed if n in self.graph.initializers and n not in self.values]
        for name in todo:
            self.value_of(name)
        return len(todo)

    def _evaluate(self, modes: Mapping[int, Mode]) -> int:
        """Compute the values of VALUE nodes not computed yet; return how many were new."""
        ctx = EvalContext(self.graph.opset, list(self.model.opset_import), self.shape_of,
                          self.load_tensor)
        new = 0
        for node in self.graph.nodes:
            outs = [o for o in node.outputs if o]
            if modes.get(node.index) is not Mode.VALUE or all(o in self.values for o in outs):
                continue
            args = [self.value_of(i) if i and node.op_type not in ("Shape", "Size") else None
                    for i in node.inputs]
            for name, value in zip(node.outputs, evaluate(node, args, ctx), strict=False):
                if name:
                    self.values[name] = value
                    new += 1
        return new

    def value_of(self, name: str) -> np.ndarray:
        if name not in self.values:
            self.values[name] = self.load_tensor(self.graph.initializers[name])
        return self.values[name]

    def load_tensor(self, tensor: onnx.TensorProto) -> np.ndarray:
        """An initializer's or Constant's value, reading external data only if needed."""
        if tensor.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(tensor)
        location = {e.key: e.value for e in tensor.external_data}.get("location", "")
        base = self.graph.base_dir
        if base is None or not (Path(base) / location).is_file():
            raise ModelImportError(
                f"folding needs the value of tensor '{tensor.name}', stored in external file "
                f"'{location}', which is missing; place it next to model '{self.graph.source}' "
                "or build masks and shapes from Constant nodes")
        return numpy_helper.to_array(tensor, str(base))

    def _preload_small_initializers(self) -> None:
        """Small integer initializers (axes, shapes) feed shape inference's data propagation."""
        for name, t in self.graph.initializers.items():
            numel = int(np.prod(t.dims, dtype=np.int64))
            if (t.data_type not in FLOAT_TYPES and t.data_location != TensorProto.EXTERNAL
                    and numel <= INLINE_VALUE_ELEMENTS):
                self.values[name] = numpy_helper.to_array(t)

    # ---- shapes --------------------------------------------------------------------------
    def shape_of(self, name: str) -> tuple[int, ...] | None:
        if name in self.values:
            return tuple(self.values[name].shape)
        if name in self.graph.initializers:
            return tuple(self.graph.initializers[name].dims)
        if name in self.input_shapes:
            return tuple(self.input_shapes[name])
        info = self.infos.get(name)
        return info.static if info else None

    def elem_type(self, name: str) -> int:
        if name in self.values:
            return _info_of_array(self.values[name]).elem_type
        if name in self.graph.initializers:
            return self.graph.initializers[name].data_type
        info = self.infos.get(name)
        return info.elem_type if info else TensorProto.UNDEFINED

    def _all_infos(self) -> dict[str, TensorInfo]:
        infos = dict(self.infos)
        for name, t in self.graph.initializers.items():
            infos[name] = TensorInfo(t.data_type, tuple(t.dims))
        for name, value in self.values.items():
            infos[name] = _info_of_array(value)
        for name in self.graph.inputs:
            if name in self.input_shapes:
                infos[name] = TensorInfo(self.graph.inputs[name].type.tensor_type.elem_type,
                                         tuple(self.input_shapes[name]))
        return infos

    def _unknown_shapes(self, kernels: list[OnnxNode]) -> list[tuple[str, OnnxNode]]:
        """Kernel operands and results whose shape is still unknown (unread optional
        outputs, such as a Dropout mask, do not count)."""
        used = self._used
        return [(name, node) for node in kernels
                for name in (*node.inputs, *node.outputs[:1],
                             *(o for o in node.outputs[1:] if o in used))
                if name and self.shape_of(name) is None]

    @cached_property
    def _used(self) -> set[str]:
        return {i for n in self.graph.nodes for i in n.inputs} | set(self.graph.outputs)

    def _raise_unknown(self, missing: tuple[str, OnnxNode]) -> None:
        name, node = missing
        raise ShapeError(
            f"the shape of tensor '{name}' (at node '{node.label}', {node.op_type}) of model "
            f"'{self.graph.source}' stays unknown after binding dims and folding constants; "
            "it depends on run-time data (autotm needs static shapes): bind more dims with "
            f"--dim NAME=VALUE or re-export the model with static shapes{self.hint}")


def _info_of_array(value: np.ndarray) -> TensorInfo:
    return TensorInfo(helper.np_dtype_to_tensor_dtype(value.dtype), tuple(value.shape))
