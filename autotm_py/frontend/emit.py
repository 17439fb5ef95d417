"""From folded ONNX nodes to a `TensorGraph`: canonical kernels, tensor roles, aliases.

Roles: non-initializer graph inputs are INPUT (LABEL when they feed a loss's labels); constant
operands of floating dtype that derive from initializers, or that sit in a weight slot (a
Conv filter made by ConstantOfShape in old zoo files), are WEIGHT and keep no value; every
other constant operand is CONSTANT with its value in `graph.constants`; graph outputs are
OUTPUT; the rest ACTIVATION. Identity nodes become aliases; an Identity that only renames an
activation into a graph output renames the activation instead of copying it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import TensorProto

from autotm_py.errors import ModelImportError, ShapeError
from autotm_py.frontend.canonical import KernelSpec, Lowered, lower
from autotm_py.frontend.fold import FLOAT_TYPES, FoldResult, Mode
from autotm_py.frontend.onnx_graph import OnnxGraph, OnnxNode
from autotm_py.ir.builder import GraphBuilder
from autotm_py.ir.graph import Role, TensorGraph

DTYPES = {TensorProto.FLOAT: "float32", TensorProto.DOUBLE: "float64",
          TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16",
          TensorProto.INT64: "int64", TensorProto.INT32: "int32", TensorProto.INT16: "int16",
          TensorProto.INT8: "int8", TensorProto.UINT8: "uint8", TensorProto.BOOL: "bool"}
# Data slots where a constant float operand is a parameter of the model, not a constant.
WEIGHT_SLOTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (0, 1),
                "BatchNormalization": (1, 2, 3, 4), "LayerNormalization": (1, 2),
                "Gather": (0,), "LSTM": (1, 2, 3), "GRU": (1, 2, 3)}
LABEL_SLOTS = {"SoftmaxCrossEntropyLoss": (1,)}
# constants of at least this many bytes that are equal are one tensor (`Emitter._constant`)
SHARED_CONSTANT_MIN_BYTES = 1024


@dataclass
class ImportCtx:
    """The `Ctx` canonicalizers see: static shapes, dtypes and constant operands."""

    graph: OnnxGraph
    fold: FoldResult
    load: Callable[[str], np.ndarray]
    hint: str = ""
    opset: int = 0
    _used: set[str] = field(default_factory=set)
    _names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.opset = self.graph.opset
        self._used = {i for n in self.graph.nodes for i in n.inputs if i} | set(self.graph.outputs)
        self._names = set(self.fold.infos) | {o for n in self.graph.nodes for o in n.outputs}

    def shape(self, name: str) -> tuple[int, ...]:
        info = self.fold.infos.get(name)
        if info is None or info.static is None:
            raise ShapeError(f"the shape of tensor '{name}' of model '{self.graph.source}' is "
                             "unknown after binding dims; bind them with --dim NAME=VALUE or "
                             "--batch N, or re-export with static shapes")
        return info.static

    def dtype(self, name: str) -> str:
        info = self.fold.infos.get(name)
        elem = info.elem_type if info else TensorProto.UNDEFINED
        if elem not in DTYPES:
            label = TensorProto.DataType.Name(elem) if elem in TensorProto.DataType.values() \
                else str(elem)
            raise ModelImportError(f"tensor '{name}' of model '{self.graph.source}' has dtype "
                                   f"{label}, which autotm does not support (supported: "
                                   f"{', '.join(sorted(set(DTYPES.values())))})")
        return DTYPES[elem]

    def known(self, name: str) -> np.ndarray | None:
        if name in self.fold.values and name not in self.fold.weightlike:
            return self.fold.values[name]
        return None

    def value(self, node: OnnxNode, slot: int) -> np.ndarray | None:
        name = node.input(slot)
        if not name:
            return None
        if name in self.fold.values or (name in self.graph.initializers):
            return self.load(name)
        raise ModelImportError(
            f"input {slot} ('{name}') of {node.op_type} node '{node.label}' of model "
            f"'{self.graph.source}' is computed at run time, but autotm needs it constant "
            "(static shapes); re-export the model with static shapes or bind dims with --dim")

    def used(self, name: str) -> bool:
        return name in self._used

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self._names:
            i += 1
            name = f"{base}.{i}"
        self._names.add(name)
        return name


def lower_all(graph: OnnxGraph, fold: FoldResult, ctx: ImportCtx) -> Lowered:
    """Canonical kernels of every kernel node, in order, plus aliases from static Identities."""
    total = Lowered()
    for node in graph.nodes:
        if fold.modes.get(node.index) is Mode.SHAPE and node.op_type == "Identity":
            total.aliases[node.outputs[0]] = node.inputs[0]  # a tied weight: one tensor
    for node in fold.kernels:
        part = lower(node, ctx)
        total.kernels.extend(part.kernels)
        total.tensors.update(part.tensors)
        total.aliases.update(part.aliases)
        total.constants.update(part.constants)
    return total


@dataclass
class Emitter:
    """Adds tensors on first use (role decided then) and kernels in order to a builder."""

    graph: OnnxGraph
    fold: FoldResult
    ctx: ImportCtx
    lowered: Lowered
    builder: GraphBuilder
    names: dict[str, str] = field(default_factory=dict)  # ONNX name -> tensor name
    weight_uses: set[str] = field(default_factory=set)
    label_uses: set[str] = field(default_factory=set)
    # whether a static float in a weight slot that no initializer makes is a weight (a file
    # whose weights are Constant nodes) or a constant (a captured module's zero bias)
    slot_weights: bool = True

    def emit(self) -> TensorGraph:
        self._resolve_names()
        for k in self.lowered.kernels:
            for slot in WEIGHT_SLOTS.get(k.op_type, ()):
                if slot < len(k.inputs):
                    self.weight_uses.add(self._name(k.inputs[slot]))
            for slot in LABEL_SLOTS.get(k.op_type, ()):
                if slot < len(k.inputs):
                    self.label_uses.add(self._name(k.inputs[slot]))
        for k in self.lowered.kernels:
            self._kernel(k)
        if not self.builder.num_kernels:
            raise ModelImportError(f"model '{self.graph.source}' has no kernel left after "
                                   "folding constants: its outputs do not depend on its inputs")
        self._graph_io()
        return self.builder.build()

    def _name(self, onnx_name: str) -> str:
        return self.names.get(onnx_name, onnx_name)

    def _resolve_names(self) -> None:
        """Follow alias chains; an alias whose target is a graph output must stay a copy,
        other graph-output aliases rename their source activation."""
        aliases = self.lowered.aliases
        outputs = set(self.graph.outputs)

        def root(name: str) -> str:
            while name in aliases:
                name = aliases[name]
            return name

        renamed: set[str] = set()
        for out in self.graph.outputs:
            if out not in aliases:
                continue
            src = root(out)
            if self._renamable(src, outputs, renamed):
                renamed.add(src)
                self.names[src] = out
            else:
                self.lowered.kernels.append(KernelSpec("Identity", (src,), (out,), {},
                                                       f"Identity:{out}"))
                del aliases[out]
        for name in aliases:
            self.names[name] = self._name(root(name))

    def _renamable(self, src: str, outputs: set[str], renamed: set[str]) -> bool:
        produced = any(src in k.outputs for k in self.lowered.kernels)
        return produced and src not in outputs and src not in renamed

    def _tensor(self, onnx_name: str) -> int:
        name = self._name(onnx_name)
        if self.builder.has(name):
            return self.builder.id_of(name)
        if name in self.lowered.constants:
            return self._constant(name, self.lowered.constants[name])
        if name in self.graph.inputs:
            role = Role.LABEL if name in self.label_uses else Role.INPUT
            tid = self.builder.add_tensor(name, self.ctx.shape(name), self.ctx.dtype(name), role)
            return tid
        if name not in self.fold.static:
            raise ModelImportError(f"tensor '{name}' is read before any kernel produces it; "
                                   "this is a bug of the importer, please report it")
        return self._static(name)

    def _static(self, name: str) -> int:
        floating = self.fold.infos[name].elem_type in FLOAT_TYPES
        if floating and (name in self.fold.weightlike or
                         (self.slot_weights and name in self.weight_uses)):
            return self.builder.add_tensor(name, self.ctx.shape(name), self.ctx.dtype(name),
                                           Role.WEIGHT)
        self.ctx.dtype(name)  # reject unsupported dtypes with a clear message
        return self._constant(name, self.ctx.load(name))

    def _constant(self, name: str, value: np.ndarray) -> int:
        """A constant; a table equal to one the graph holds already is that one (an exporter's
        per-layer copies: `GraphBuilder.shared_constant`). Scalars and small index vectors
        keep tensors of their own."""
        if np.asarray(value).nbytes >= SHARED_CONSTANT_MIN_BYTES:
            return self.builder.shared_constant(name, value)
        return self.builder.add_constant(name, value)

    def _kernel(self, k: KernelSpec) -> None:
        inputs = [self._tensor(i) for i in k.inputs]
        outputs = []
        for out in k.outputs:
            name = self._name(out)
            if out in self.lowered.tensors:
                shape, dtype = self.lowered.tensors[out]
            else:
                shape, dtype = self.ctx.shape(out), self.ctx.dtype(out)
            role = Role.OUTPUT if name in self.graph.outputs else Role.ACTIVATION
            outputs.append(self.builder.add_tensor(name, shape, dtype, role))
        self.builder.add_kernel(k.op_type, inputs, outputs, name=k.name, attrs=k.attrs)

    def _graph_io(self) -> None:
        b = self.builder
        b.inputs.extend(b.id_of(n) for n in self.graph.inputs if b.has(n))
        for out in self.graph.outputs:
            b.outputs.append(self._tensor(out))


def build_graph(graph: OnnxGraph, fold: FoldResult, load: Callable[[str], np.ndarray],
                meta: Mapping[str, Any], hint: str = "", slot_weights: bool = True
                ) -> TensorGraph:
    """The forward `TensorGraph` of a folded ONNX graph (`slot_weights`: see `Emitter`)."""
    ctx = ImportCtx(graph, fold, load, hint)
    lowered = lower_all(graph, fold, ctx)
    builder = GraphBuilder(graph.name)
    builder.meta.update(meta)
    return Emitter(graph, fold, ctx, lowered, builder, slot_weights=slot_weights).emit()
