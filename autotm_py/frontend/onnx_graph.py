"""The ONNX graph as the importer sees it: parsed nodes in topological order, checked.

`parse_graph` turns a `ModelProto` into an `OnnxGraph` of frozen `OnnxNode`s (attributes as
Python values), sorts the nodes topologically (keeping the file's order when it is already
valid), and rejects dangling inputs, tensors produced twice and cycles, naming the node.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper

from autotm_py.errors import ModelImportError


@dataclass(frozen=True)
class OnnxNode:
    """One ONNX node. `inputs` keeps "" for an absent optional input, as in the file."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    proto: onnx.NodeProto = field(repr=False, compare=False)

    @property
    def label(self) -> str:
        """How messages name the node: its name, else op type and position."""
        return self.name or f"{self.op_type} #{self.index}"

    def input(self, slot: int) -> str:
        """The input name at `slot`, or "" when absent."""
        return self.inputs[slot] if slot < len(self.inputs) else ""


@dataclass(frozen=True)
class OnnxGraph:
    """Nodes in execution order, initializers, the true graph inputs, and the outputs."""

    name: str
    source: str
    nodes: tuple[OnnxNode, ...]
    initializers: Mapping[str, onnx.TensorProto]
    inputs: Mapping[str, onnx.ValueInfoProto]  # graph inputs that are not initializers
    outputs: tuple[str, ...]
    opset: int
    base_dir: Path | None


def short_float(value: float) -> float:
    """ONNX stores float32: 1e-5 arrives as 9.999999747378752e-06. Keep the shortest decimal
    that round-trips through float32, so attrs and kernel signatures read as written."""
    return float(str(np.float32(value)))


def _attr_value(attr: AttributeProto) -> Any:
    if attr.type == AttributeProto.TENSOR:
        return attr.t  # kept as a proto: Constant values are decoded only when folded
    if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
        return attr  # control flow: such ops are unsupported and rejected later
    value = helper.get_attribute_value(attr)
    if attr.type == AttributeProto.FLOAT:
        return short_float(value)
    if attr.type == AttributeProto.FLOATS:
        return [short_float(v) for v in value]
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


def _parse_node(index: int, proto: onnx.NodeProto) -> OnnxNode:
    attrs = {a.name: _attr_value(a) for a in proto.attribute}
    domain = "" if proto.domain == "ai.onnx" else proto.domain
    return OnnxNode(index, proto.name, proto.op_type, domain, tuple(proto.input),
                    tuple(proto.output), attrs, proto)


def parse_graph(model: onnx.ModelProto, *, opset: int, source: str, name: str,
                base_dir: Path | None) -> OnnxGraph:
    """Parse and check the main graph; raise `ModelImportError` naming what is broken."""
    g = model.graph
    if g.sparse_initializer:
        raise ModelImportError(f"model '{source}' has sparse initializers (e.g. "
                               f"'{g.sparse_initializer[0].values.name}'), which autotm does not "
                               "support; convert them to dense initializers")
    initializers = {t.name: t for t in g.initializer}
    inputs = {v.name: v for v in g.input if v.name not in initializers}
    nodes = [_parse_node(i, p) for i, p in enumerate(g.node)]
    producer = _producers(nodes, set(initializers) | set(inputs), source)
    _check_defined(nodes, producer, set(initializers) | set(inputs), source)
    outputs = tuple(v.name for v in g.output)
    for out in outputs:
        if out not in producer and out not in initializers and out not in inputs:
            raise ModelImportError(f"graph output '{out}' of model '{source}' is produced by no "
                                   "node; the file is malformed, re-export it")
    ordered = _toposort(nodes, producer, source)
    return OnnxGraph(name, source, tuple(ordered), initializers, inputs, outputs, opset,
                     base_dir)


def _producers(nodes: list[OnnxNode], given: set[str], source: str) -> dict[str, int]:
    producer: dict[str, int] = {}
    for node in nodes:
        for out in node.outputs:
            if not out:
                continue
            if out in producer or out in given:
                raise ModelImportError(
                    f"tensor '{out}' of model '{source}' is defined twice (again by node "
                    f"'{node.label}'); ONNX tensors are SSA, the file is malformed")
            producer[out] = node.index
    return producer


def _check_defined(nodes: list[OnnxNode], producer: Mapping[str, int], given: set[str],
                   source: str) -> None:
    for node in nodes:
        for name in node.inputs:
            if name and name not in producer and name not in given:
                raise ModelImportError(
                    f"node '{node.label}' ({node.op_type}) of model '{source}' reads '{name}', "
                    "which no node produces and which is neither a graph input nor an "
                    "initializer (a dangling input); re-export the model")


def _toposort(nodes: list[OnnxNode], producer: Mapping[str, int],
              source: str) -> list[OnnxNode]:
    """Kahn's algorithm with the file position as priority: the file's order when valid."""
    consumers: list[list[int]] = [[] for _ in nodes]
    missing = [0] * len(nodes)
    for node in nodes:
        for dep in {producer[n] for n in node.inputs if n in producer}:
            consumers[dep].append(node.index)
            missing[node.index] += 1
    ready = [i for i, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    order: list[OnnxNode] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for c in consumers[i]:
            missing[c] -= 1
            if missing[c] == 0:
                heapq.heappush(ready, c)
    if len(order) < len(nodes):
        stuck = _on_cycle(nodes, producer, missing)
        raise ModelImportError(f"the graph of model '{source}' has a cycle through node "
                               f"'{stuck.label}' ({stuck.op_type}); ONNX graphs must be acyclic, "
                               "re-export the model")
    return order


def _on_cycle(nodes: list[OnnxNode], producer: Mapping[str, int],
              missing: list[int]) -> OnnxNode:
    """A node that lies on a cycle: walk back through unsorted producers until one repeats."""
    current = next(n for n in nodes if missing[n.index] > 0)
    seen: set[int] = set()
    while current.index not in seen:
        seen.add(current.index)
        current = next(nodes[producer[n]] for n in current.inputs
                       if n in producer and missing[producer[n]] > 0)
    return current
