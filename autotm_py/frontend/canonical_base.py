"""Shared pieces of per-op canonicalization: the result types, the context, the registry.

A canonicalizer turns one ONNX node (any opset from 9 on) into kernels in the canonical form
of `autotm_py.ir.ops`: data operands as inputs, parameter operands and ONNX attributes (with
defaults) as attrs. It may emit several kernels (an old-opset Softmax, an n-ary Max) with
intermediate tensors, or none (an Identity becomes an alias).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from autotm_py.errors import ModelImportError
from autotm_py.frontend.onnx_graph import OnnxNode, short_float
from autotm_py.ir.ops import FORWARD_OPS


@dataclass(frozen=True)
class KernelSpec:
    """One kernel to add, with ONNX tensor names (resolved to ids when the graph is built)."""

    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    name: str


@dataclass
class Lowered:
    """The canonical form of one node: kernels, new intermediate tensors, and aliases."""

    kernels: list[KernelSpec] = field(default_factory=list)
    tensors: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # new constant operands


class Ctx(Protocol):
    """What a canonicalizer may ask about tensors (shapes are static by now)."""

    opset: int
    hint: str  # appended to shape errors (e.g. why --batch may have broken the graph)

    def shape(self, name: str) -> tuple[int, ...]: ...

    def dtype(self, name: str) -> str: ...

    def value(self, node: OnnxNode, slot: int) -> np.ndarray | None: ...

    def known(self, name: str) -> np.ndarray | None: ...

    def used(self, name: str) -> bool: ...

    def fresh(self, base: str) -> str: ...


Canonicalizer = Callable[[OnnxNode, Ctx], Lowered]
REGISTRY: dict[str, Canonicalizer] = {}


def canonical(*ops: str) -> Callable[[Canonicalizer], Canonicalizer]:
    """Register the decorated function as the canonicalizer of `ops`."""
    def register(fn: Canonicalizer) -> Canonicalizer:
        for op in ops:
            REGISTRY[op] = fn
        return fn
    return register


# ---- helpers -------------------------------------------------------------------------------
REQUIRED = object()  # marks an attribute without an ONNX default


def norm_axis(axis: int, rank: int, node: OnnxNode) -> int:
    """A non-negative axis, or an error naming the node when it is out of range."""
    if not -rank <= axis < max(rank, 1):
        raise ModelImportError(f"node '{node.label}' ({node.op_type}) has axis {axis}, out of "
                               f"range for rank {rank}; the model is malformed")
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Iterable[int], rank: int, node: OnnxNode) -> tuple[int, ...]:
    return tuple(sorted({norm_axis(int(a), rank, node) for a in axes}))


def data_inputs(node: OnnxNode, count: int) -> tuple[str, ...]:
    """The first `count` input slots with trailing absent optionals dropped."""
    slots = list(node.inputs[:count])
    while slots and not slots[-1]:
        slots.pop()
    if "" in slots:
        raise ModelImportError(f"node '{node.label}' ({node.op_type}) leaves a middle input "
                               "empty, which autotm does not support; re-export the model")
    return tuple(slots)


def first_output(node: OnnxNode, ctx: Ctx) -> tuple[str, ...]:
    """Ops whose extra outputs are optional (masks, saved statistics, indices) keep only the
    first; an extra output that something reads is an error."""
    for extra in node.outputs[1:]:
        if extra and ctx.used(extra):
            raise ModelImportError(
                f"node '{node.label}' ({node.op_type}) has its optional output '{extra}' read "
                "by the graph; autotm imports only the first output of this op, re-export the "
                "model in inference mode")
    return (node.outputs[0],)


def attrs_with_defaults(node: OnnxNode, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The node's attributes named in `defaults`, missing ones filled in."""
    out = {}
    for key, default in defaults.items():
        value = node.attrs.get(key, default)
        if value is REQUIRED:
            raise ModelImportError(f"node '{node.label}' ({node.op_type}) lacks its required "
                                   f"attribute '{key}'; the model is malformed")
        out[key] = value
    return out


def spec(node: OnnxNode, inputs: Sequence[str], attrs: Mapping[str, Any],
         outputs: Sequence[str] | None = None, op_type: str | None = None,
         suffix: str = "") -> KernelSpec:
    name = node.name or f"{node.op_type}_{node.index}"
    return KernelSpec(op_type or node.op_type, tuple(inputs),
                      tuple(outputs if outputs is not None else node.outputs[:1]), dict(attrs),
                      f"{name}{suffix}")


def single(node: OnnxNode, inputs: Sequence[str], attrs: Mapping[str, Any],
           outputs: Sequence[str] | None = None, op_type: str | None = None) -> Lowered:
    return Lowered([spec(node, inputs, attrs, outputs, op_type)])


def data_count(op_type: str) -> int:
    return len(FORWARD_OPS[op_type].data)


def as_float(value: np.ndarray | None) -> float | None:
    if value is None or value.size == 0:
        return None
    first = value.reshape(-1)[0]
    return short_float(first) if value.dtype == np.float32 else float(first)


def as_ints(value: np.ndarray | Sequence[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in np.asarray(value).reshape(-1))
