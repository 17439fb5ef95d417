"""The fusion pass: standard multi-kernel patterns of an imported forward graph become one
fused kernel each.

    fused = fuse_graph(graph)            # import_onnx/import_model call it unless fuse=False
    fused.meta["fusion"]                 # {"attention": 12, "gelu": 13}

Patterns (each in its own module; docs/fusion.md has the exact forms):
- scaled dot-product attention (`fuse_attention`): MatMul(Q, K^T) -> scale -> mask ->
  Softmax(last axis) -> MatMul(., V) becomes `ScaledDotProductAttention` (domain "autotm"),
  whose backward saves a logsumexp per query row instead of the probability matrix;
- GELU (`fuse_gelu`): the erf and tanh forms exporters write before opset 20 become ONNX
  `Gelu` (approximate "none" / "tanh"), whose backward saves only its input.

A pattern matches only when the fused op computes the same function (constants checked,
softmax over the last axis, K^T really the transpose of K, intermediate tensors read by
nothing else); anything else is left as it is. A graph without matches keeps its kernels
and tensors (only `meta` gains the counts). Matching sees the original graph; the accepted
rewrites are disjoint and are applied in one rebuild, in which every surviving tensor keeps
its name (ids are renumbered) and the fused kernel runs where the last kernel of its pattern
ran.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from autotm_py.errors import GraphError
from autotm_py.ir.builder import GraphBuilder
from autotm_py.ir.graph import Kernel, Role, TensorGraph
from autotm_py.ir.rules.base import FLOAT_DTYPES

log = logging.getLogger(__name__)

FUSION_META_KEY = "fusion"
KINDS = ("attention", "gelu")


@dataclass(frozen=True)
class NewTensor:
    """A tensor a rewrite creates (`value` for a constant)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: Role = Role.ACTIVATION
    value: np.ndarray | None = None


Ref = int | NewTensor  # an existing tensor id, or a tensor the rewrite creates


@dataclass(frozen=True)
class NewKernel:
    op_type: str
    inputs: tuple[Ref, ...]
    outputs: tuple[Ref, ...]
    attrs: dict[str, Any]
    name: str
    domain: str = ""
    workspace_bytes: int = 0


@dataclass(frozen=True)
class Rewrite:
    """One match: the kernels it removes and the kernels that replace them, each emitted at
    the position of one removed kernel (`placed`: (removed kernel id, new kernel))."""

    kind: str
    removed: frozenset[int]
    placed: tuple[tuple[int, NewKernel], ...]


@dataclass
class Matcher:
    """Read-only helpers over the graph being fused, shared by the pattern modules."""

    graph: TensorGraph
    _names: set[str] = field(default_factory=set)  # kernel names taken

    def __post_init__(self) -> None:
        self._names.update(k.name for k in self.graph.kernels)

    def producer(self, tid: int) -> Kernel | None:
        p = self.graph.tensors[tid].producer
        return None if p is None else self.graph.kernels[p]

    def sole_user(self, tid: int) -> Kernel | None:
        """The one kernel reading `tid`, when nothing else (nor the graph's outputs) does."""
        t = self.graph.tensors[tid]
        if len(t.users) != 1 or tid in self._outputs:
            return None
        return self.graph.kernels[t.users[0]]

    @cached_property
    def _outputs(self) -> frozenset[int]:
        return frozenset(self.graph.outputs)

    def constant(self, tid: int) -> np.ndarray | None:
        return self.graph.constants.get(tid)

    def scalar(self, tid: int) -> float | None:
        """The value of a one-element float constant, else None."""
        value = self.graph.constants.get(tid)
        if value is None or value.size != 1 or self.graph.tensors[tid].dtype not in FLOAT_DTYPES:
            return None
        return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])

    def is_float(self, tid: int) -> bool:
        return self.graph.tensors[tid].dtype in FLOAT_DTYPES

    @cached_property
    def weight_dependent(self) -> frozenset[int]:
        """Tensors that depend on a trainable weight (float WEIGHT without a producer)."""
        dep = {t.id for t in self.graph.tensors
               if t.role == Role.WEIGHT and t.producer is None and t.dtype in FLOAT_DTYPES}
        for k in self.graph.kernels:
            if any(t in dep for t in k.inputs):
                dep.update(k.outputs)
        return frozenset(dep)

    def interior_ok(self, kernels: Iterable[int], keep: Iterable[int] = ()) -> bool:
        """Every output of `kernels` but `keep` is read only inside them (and is no graph
        output): removing them loses nothing the rest of the graph reads."""
        inside = set(kernels)
        kept = set(keep)
        for kid in inside:
            for out in self.graph.kernels[kid].outputs:
                if out in kept:
                    continue
                t = self.graph.tensors[out]
                if out in self._outputs or any(u not in inside for u in t.users):
                    return False
        return True

    def kernel_name(self, kernels: Iterable[int], op: str) -> str:
        """`<common scope of the kernels' names><op>`, e.g. `encoder.0.attention.Gelu`."""
        names = [self.graph.kernels[k].name for k in kernels]
        prefix = _common_scope(names)
        base = f"{prefix}{op}" if prefix else f"{names[-1]}/{op}"
        name, i = base, 1
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name


def _common_scope(names: Sequence[str]) -> str:
    """The longest common prefix of `names` that ends at a scope separator ('.' or '/')."""
    first, last = min(names), max(names)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    cut = max(first.rfind(".", 0, n), first.rfind("/", 0, n))
    return first[: cut + 1] if cut >= 0 else ""


# ---- the pass ---------------------------------------------------------------------------------
def find_rewrites(graph: TensorGraph) -> list[Rewrite]:
    """Every accepted, mutually disjoint rewrite of the graph, attention first."""
    from autotm_py.frontend.fuse_attention import match_attention
    from autotm_py.frontend.fuse_gelu import match_gelu

    m = Matcher(graph)
    accepted: list[Rewrite] = []
    removed: set[int] = set()
    for matcher in (match_attention, match_gelu):
        for k in graph.kernels:
            rewrite = matcher(m, k)
            if rewrite is not None and _disjoint(graph, rewrite, removed):
                accepted.append(rewrite)
                removed |= rewrite.removed
    return accepted


def _disjoint(graph: TensorGraph, rewrite: Rewrite, removed: set[int]) -> bool:
    """No kernel removed twice, and no input produced by a kernel another rewrite removes."""
    if rewrite.removed & removed:
        return False
    for _, nk in rewrite.placed:
        for ref in nk.inputs:
            if isinstance(ref, int) and graph.tensors[ref].producer in removed:
                return False
    return True


def fuse_graph(graph: TensorGraph) -> TensorGraph:
    """The graph with every recognized pattern fused; `meta["fusion"]` counts them by kind."""
    if "training" in graph.meta:
        raise GraphError(f"graph {graph.name!r} is a training graph; fuse the forward graph, "
                         "then derive training")
    rewrites = find_rewrites(graph)
    counts = {kind: sum(1 for r in rewrites if r.kind == kind) for kind in KINDS}
    if not rewrites:
        return _with_meta(graph, counts)
    fused = apply_rewrites(graph, rewrites)
    log.info("fused %s of %s: %d kernels -> %d", ", ".join(f"{n} {k}" for k, n in
             counts.items()), graph.name, len(graph.kernels), len(fused.kernels))
    return _with_meta(fused, counts)


def _with_meta(graph: TensorGraph, counts: dict[str, int]) -> TensorGraph:
    return replace(graph, meta={**graph.meta, FUSION_META_KEY: counts})


def apply_rewrites(graph: TensorGraph, rewrites: Sequence[Rewrite]) -> TensorGraph:
    """Rebuild the graph without the removed kernels and with the new ones in place."""
    removed = set().union(*(r.removed for r in rewrites))
    placed: dict[int, list[NewKernel]] = {}
    for r in rewrites:
        for pos, nk in r.placed:
            placed.setdefault(pos, []).append(nk)
    out = _Rebuild(graph, GraphBuilder(graph.name))
    out.copy_tensors(removed, [nk for nks in placed.values() for nk in nks])
    for k in graph.kernels:
        for nk in placed.get(k.id, ()):
            out.b.add_kernel(nk.op_type, [out.ref(r) for r in nk.inputs],
                             [out.ref(r) for r in nk.outputs], name=nk.name, domain=nk.domain,
                             attrs=nk.attrs, workspace_bytes=nk.workspace_bytes)
        if k.id not in removed:
            out.b.add_kernel(k.op_type, [out.ids[t] for t in k.inputs],
                             [out.ids[t] for t in k.outputs], name=k.name, domain=k.domain,
                             attrs=k.attrs_dict, workspace_bytes=k.workspace_bytes)
    return out.finish()


@dataclass
class _Rebuild:
    """The new graph's builder and the map from old (and new) tensors to its ids."""

    graph: TensorGraph
    b: GraphBuilder
    ids: dict[int, int] = field(default_factory=dict)
    made: dict[int, int] = field(default_factory=dict)  # id(NewTensor) -> tensor id

    def copy_tensors(self, removed: set[int], new_kernels: list[NewKernel]) -> None:
        """Every old tensor still read or written (or a graph input/output), in id order."""
        g = self.graph
        used = set(g.inputs) | set(g.outputs)
        used.update(t for k in g.kernels if k.id not in removed for t in k.io)
        used.update(r for nk in new_kernels for r in nk.inputs + nk.outputs if isinstance(r, int))
        for t in g.tensors:
            if t.id in used:
                self.ids[t.id] = self.b.add_tensor(t.name, t.shape, t.dtype, t.role)
                if t.id in g.constants:
                    self.b.constants[self.ids[t.id]] = g.constants[t.id]

    def ref(self, ref: Ref) -> int:
        if isinstance(ref, int):
            return self.ids[ref]
        if id(ref) not in self.made:
            tid = self.b.add_tensor(ref.name, ref.shape, ref.dtype, ref.role)
            if ref.value is not None:
                self.b.constants[tid] = ref.value
            self.made[id(ref)] = tid
        return self.made[id(ref)]

    def finish(self) -> TensorGraph:
        g, ids = self.graph, self.ids
        self.b.inputs = [ids[t] for t in g.inputs]
        self.b.outputs = [ids[t] for t in g.outputs]
        self.b.carried = [(ids[a], ids[z]) for a, z in g.carried if a in ids and z in ids]
        self.b.meta = dict(g.meta)
        return self.b.build()
