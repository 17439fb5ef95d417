"""What the fusion matchers share: the rewrite they propose (`Rewrite`: kernels removed, new
tensors and kernels) and the `Matcher` that reads the original graph for them. The pass itself
is `fuse.py`; the patterns are `fuse_attention.py` and `fuse_gelu.py`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from autotm_py.ir.graph import Kernel, Role, TensorGraph
from autotm_py.ir.rules.base import FLOAT_DTYPES


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

    def read_only_by(self, tid: int, kernels: Iterable[int]) -> bool:
        """Every reader of `tid` is one of `kernels`, and it is no graph output."""
        inside = set(kernels)
        return tid not in self._outputs and all(u in inside for u in self.graph.tensors[tid].users)

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
