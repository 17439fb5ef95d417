"""The values of an ONNX file's own weights, for the weight tensors of a graph imported from it.

    found = initializer_values("model.onnx", graph)      # or a ModelProto
    found.values[t.id]      # numpy array of t.shape and t.dtype, for each weight t with data
    found.missing           # ids of weights whose data the file does not have

The importer reads weights as shapes only (docs/import.md); this reads their bytes, for whoever
wants to compute with the file's values rather than random ones (the executor's `--seed`
values). A graph weight is either an initializer of the file, under its own name, or a weight
the importer derived from initializers by layout ops it folded ("shape" mode, `fold.py`): a
torch Linear exported as `MatMul(X, Transpose(W))` imports as a weight named after the
Transpose's output, of shape (in, out), while the file (and the torch module) hold W as
(out, in). Such values are computed here by the same NumPy rules the importer folds with
(`fold_eval.evaluate`), so each value has the graph's shape, not the file's; `derived` says
which weights were computed this way and from which initializers. Fusion does not change a
weight's layout (a fused `Linear` with `transB = 1` reads the initializer as it is).

Training graphs (`ir/training.py`) keep the forward weights' ids and names, so the same call
works on them; their `::next` weights (outputs of the update kernels) have no file value and
are left out. Values are logical (row-major, ONNX's shapes); a channels-last graph
(`ir/layout.py`) stores its convolution filters N, H, W, C, which `kernels.util.in_layout`
does when the values become device tensors.

External data is read from the model's folder (a path's parent, or `base_dir` for a
`ModelProto`), with the importer's rule that locations must stay inside it. A data file that
is missing is not an error: the weights that need it are listed in `missing`, so a caller can
say "random values where the file has none".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, numpy_helper

from autotm_py.errors import ModelImportError
from autotm_py.frontend.fold import FLOAT_TYPES, LAYOUT_OPS
from autotm_py.frontend.fold_eval import EvalContext, evaluate
from autotm_py.frontend.onnx_graph import OnnxGraph, OnnxNode, parse_graph
from autotm_py.frontend.onnx_load import check_external_locations, default_opset, read_model_file
from autotm_py.ir.graph import Role, Tensor, TensorGraph


@dataclass(frozen=True)
class Derived:
    """A graph weight computed from initializers: which ones, through which ops (in order).
    `perm`: where only Transposes (and Identities) lead from its one initializer, the axes
    the weight is that initializer transposed by (`numpy.transpose(init, perm)`), else None."""

    initializers: tuple[str, ...]
    ops: tuple[str, ...]
    perm: tuple[int, ...] | None = None


@dataclass(frozen=True)
class WeightValues:
    """`values`: weight id -> value (the graph's shape and dtype). `missing`: weight ids
    without data (their external data file is missing). `derived`: weight id -> how it was
    computed, for weights that are not initializers of the file themselves."""

    values: Mapping[int, np.ndarray]
    missing: tuple[int, ...] = ()
    derived: Mapping[int, Derived] = field(default_factory=dict)


def initializer_values(model_or_path: onnx.ModelProto | str | os.PathLike[str],
                       graph: TensorGraph, *, base_dir: str | os.PathLike[str] | None = None
                       ) -> WeightValues:
    """The file's values of `graph`'s weights (forward or training graph imported from it).

    Raises:
        ModelImportError: a weight the file does not define (the graph was imported from
            another model), a value whose shape or dtype differs from the graph's, or an
            unreadable or escaping external-data location.
    """
    model, base = _read(model_or_path, base_dir)
    source = model.graph.name if isinstance(model_or_path, onnx.ModelProto) else str(model_or_path)
    resolver = _Resolver(_parse(model, base, source), graph, list(model.opset_import))
    values: dict[int, np.ndarray] = {}
    missing: list[int] = []
    derived: dict[int, Derived] = {}
    for t in file_weights(graph):
        value = resolver.value(t.name)
        if value is None:
            missing.append(t.id)
        else:
            values[t.id] = _checked(value, t)
        if t.name not in resolver.onnx.initializers:
            derived[t.id] = resolver.derivation(t.name)
    return WeightValues(values, tuple(missing), derived)


def weight_derivations(model: onnx.ModelProto, graph: TensorGraph
                       ) -> dict[int, Derived | None]:
    """For every weight of `graph` that file `model` (held in memory) can hold
    (`file_weights`), how it is derived from the file's initializers (None: it is one), read
    from the nodes alone: no value is computed, so a model of billions of parameters costs no
    copy of them (`initializer_values` computes every derived value)."""
    resolver = _Resolver(_parse(model, None, model.graph.name), graph, list(model.opset_import))
    return {t.id: None if t.name in resolver.onnx.initializers else resolver.derivation(t.name)
            for t in file_weights(graph)}


def file_weights(graph: TensorGraph) -> list[Tensor]:
    """The weights a file can hold: role weight and no producer (a training graph's updated
    weights `W::next` are computed by its update kernels)."""
    return [t for t in graph.tensors if t.role is Role.WEIGHT and t.producer is None]


def _read(model_or_path: onnx.ModelProto | str | os.PathLike[str],
          base_dir: str | os.PathLike[str] | None) -> tuple[onnx.ModelProto, Path | None]:
    """The model (without external data) and the folder its external data lives in."""
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, Path(base_dir) if base_dir is not None else None
    path = Path(model_or_path)
    return read_model_file(path), Path(base_dir) if base_dir is not None else path.parent


def _parse(model: onnx.ModelProto, base: Path | None, source: str) -> OnnxGraph:
    """The ONNX graph as the importer parsed it (local functions inlined, the same checks)."""
    label = source or "<model>"
    opset = default_opset(model, label)
    # refuse absolute or escaping locations before anything is read (the importer's rule)
    check_external_locations(model, base, label)
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    return parse_graph(model, opset=opset, source=label, name=label, base_dir=base)


def _checked(value: np.ndarray, t: Tensor) -> np.ndarray:
    """The value, after checking it has the graph tensor's shape and dtype: C-contiguous and
    writable (onnx's arrays are read-only views of the protobuf's bytes, which torch refuses
    to share), copied only when it is not."""
    if tuple(value.shape) != t.shape or value.dtype.name != t.dtype:
        raise ModelImportError(
            f"the file's value of weight '{t.name}' has shape {tuple(value.shape)} and dtype "
            f"{value.dtype.name}, the graph's {t.shape} and {t.dtype}: the graph was not "
            "imported from this file (or with other options)")
    return np.require(value, requirements=["C", "W"])


class _NoData(ModelImportError):
    """A tensor that folding needs has no data (its external data file is missing); a
    ModelImportError so that `fold_eval.evaluate` lets it through unchanged."""


class _Resolver:
    """Values of ONNX tensors by name: initializers (None where external data is missing),
    and the outputs of the static nodes that lead from them to a derived weight."""

    def __init__(self, onnx_graph: OnnxGraph, graph: TensorGraph,
                 opsets: list[onnx.OperatorSetIdProto]) -> None:
        self.onnx = onnx_graph
        self.producer = {o: n for n in onnx_graph.nodes for o in n.outputs if o}
        self.shapes = {t.name: t.shape for t in graph.tensors}
        self.known: dict[str, np.ndarray | None] = {}
        self.ctx = EvalContext(onnx_graph.opset, opsets, self.shape_of, self._load_or_raise)

    def value(self, name: str) -> np.ndarray | None:
        if name not in self.known:
            self.known[name] = self._compute(name)
        return self.known[name]

    def _compute(self, name: str) -> np.ndarray | None:
        if name in self.onnx.initializers:
            return self.load(self.onnx.initializers[name])
        node = self.producer.get(name)
        if node is None:
            raise ModelImportError(f"weight '{name}' of the graph is neither an initializer of "
                                   f"model '{self.onnx.source}' nor computed from one: the "
                                   "graph was not imported from this model")
        return self._evaluate(node, name)

    def _evaluate(self, node: OnnxNode, name: str) -> np.ndarray | None:
        sized = node.op_type in ("Shape", "Size")  # they read a shape, not a value
        if sized and self.shape_of(node.inputs[0]) is None:
            return None
        args = [self.value(i) if i and not sized else None for i in node.inputs]
        if not sized and any(a is None for i, a in zip(node.inputs, args, strict=True) if i):
            return None  # an input without data: so is this output
        try:
            outs = evaluate(node, args, self.ctx)
        except _NoData:  # a Constant node whose external data is missing
            return None
        for out, value in zip(node.outputs, outs, strict=False):
            if out:
                self.known[out] = value
        return self.known[name]

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        if name in self.shapes:
            return self.shapes[name]
        if name in self.onnx.initializers:
            return tuple(self.onnx.initializers[name].dims)
        value = self.known.get(name)
        return tuple(value.shape) if value is not None else None

    def load(self, tensor: TensorProto) -> np.ndarray | None:
        """A tensor's value; None when its external data file is missing."""
        if tensor.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(tensor)
        location = {e.key: e.value for e in tensor.external_data}.get("location", "")
        base = self.onnx.base_dir
        if base is None or not (base / location).is_file():
            return None
        try:
            return numpy_helper.to_array(tensor, str(base))
        except (OSError, ValueError) as exc:  # a truncated data file, say
            raise ModelImportError(f"cannot read the external data of tensor '{tensor.name}' "
                                   f"from '{base / location}': {exc}") from None

    def _load_or_raise(self, tensor: TensorProto) -> np.ndarray:
        value = self.load(tensor)
        if value is None:
            raise _NoData(tensor.name)
        return value

    def derivation(self, name: str) -> Derived:
        """The float initializers a derived weight comes from and the ops between them, in
        evaluation order (a walk back that follows only the data operand of layout ops: a
        Reshape's target shape is no source)."""
        inits: list[str] = []
        ops: list[str] = []
        todo, seen = [name], set()
        while todo:
            current = todo.pop()
            if current in seen or not current:
                continue
            seen.add(current)
            init = self.onnx.initializers.get(current)
            if init is not None:
                if init.data_type in FLOAT_TYPES:
                    inits.append(current)
            elif (node := self.producer.get(current)) is not None:
                ops.append(node.op_type)
                todo.extend(node.inputs[:1] if node.op_type in LAYOUT_OPS else node.inputs)
        perm = self._permutation(name) if len(inits) == 1 and \
            set(ops) <= {"Transpose", "Identity"} else None
        return Derived(tuple(sorted(inits)), tuple(reversed(ops)), perm)

    def _permutation(self, name: str) -> tuple[int, ...] | None:
        """The axes a chain of Transposes (and Identities) from one initializer to `name`
        permutes: `name` is `numpy.transpose(initializer, perm)`."""
        shape = self.shape_of(name)
        if shape is None:
            return None
        total = list(range(len(shape)))  # name, as itself
        while name not in self.onnx.initializers:
            node = self.producer[name]
            if node.op_type == "Transpose":
                step = list(node.attrs.get("perm") or range(len(total) - 1, -1, -1))
                total = [step[axis] for axis in total]
            name = node.inputs[0]
        return tuple(int(a) for a in total)
