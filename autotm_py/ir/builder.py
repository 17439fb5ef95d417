"""`GraphBuilder`: the one way to make a `TensorGraph` (dense ids, producers, users, signatures).

Frontends, the training derivation, the zoo and the tests append tensors and kernels by name in
execution order, then call `build()`; the builder fills producers and users and freezes it all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotm_py.errors import GraphError
from autotm_py.ir.graph import (
    DTYPE_SIZES,
    Kernel,
    Role,
    Tensor,
    TensorGraph,
    freeze_attrs,
    kernel_signature,
)


@dataclass
class _TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: Role


@dataclass
class _KernelSpec:
    name: str
    op_type: str
    domain: str
    attrs: Mapping[str, Any]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    workspace_bytes: int


@dataclass
class GraphBuilder:
    """Accumulates tensors and kernels in execution order; `build()` freezes them."""

    name: str
    _tensors: list[_TensorSpec] = field(default_factory=list)
    _kernels: list[_KernelSpec] = field(default_factory=list)
    _ids: dict[str, int] = field(default_factory=dict)
    _producer: dict[int, int] = field(default_factory=dict)
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    carried: list[tuple[int, int]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # the constants `shared_constant` made, by (dtype, shape, digest of their bytes)
    _by_value: dict[tuple[str, tuple[int, ...], bytes], int] = field(default_factory=dict)

    def add_tensor(self, name: str, shape: Sequence[int], dtype: str, role: Role) -> int:
        self._check_new_name(name)
        if dtype not in DTYPE_SIZES:
            raise GraphError(f"tensor {name!r} has unsupported dtype {dtype!r}; supported: "
                             f"{', '.join(DTYPE_SIZES)}")
        tid = len(self._tensors)
        self._tensors.append(_TensorSpec(name, tuple(int(d) for d in shape), dtype, role))
        self._ids[name] = tid
        return tid

    def add_constant(self, name: str, value: np.ndarray, role: Role = Role.CONSTANT) -> int:
        """A tensor whose value is known and kept (small masks, scalars)."""
        value = np.asarray(value)
        tid = self.add_tensor(name, value.shape, str(value.dtype), role)
        self.constants[tid] = value
        return tid

    def shared_constant(self, name: str, value: np.ndarray) -> int:
        """The constant of `value`: one the graph already holds under another name (equal
        dtype, shape and bytes), `name` now naming it too, else a new one. Exporters repeat
        tables per layer (transformers' Llama as torch exports it: each layer's rotary cos and
        sin folded into constants of their own, 32 in 16 layers), each of them uploaded before
        every replay and each a buffer of its own."""
        value = np.asarray(value)
        # keyed by a digest, not the bytes: a key of bytes would hold a second copy of every
        # table for the whole import; equal digests are compared element by element
        digest = hashlib.sha256(np.ascontiguousarray(value)).digest()
        key = (str(value.dtype), value.shape, digest)
        tid = self._by_value.get(key)
        if tid is None or not np.array_equal(self.constants[tid], value):
            tid = self._by_value[key] = self.add_constant(name, value)
        else:
            self._check_new_name(name)
            self._ids[name] = tid
        return tid

    def _check_new_name(self, name: str) -> None:
        if name in self._ids:
            raise GraphError(f"tensor name {name!r} is defined twice in graph {self.name!r}")

    def id_of(self, name: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise GraphError(f"no tensor named {name!r} in graph {self.name!r}") from None

    def has(self, name: str) -> bool:
        return name in self._ids

    def shape_of(self, tid: int) -> tuple[int, ...]:
        return self._tensors[tid].shape

    def dtype_of(self, tid: int) -> str:
        return self._tensors[tid].dtype

    def role_of(self, tid: int) -> Role:
        return self._tensors[tid].role

    def name_of(self, tid: int) -> str:
        return self._tensors[tid].name

    def add_kernel(
        self,
        op_type: str,
        inputs: Iterable[int],
        outputs: Iterable[int],
        *,
        name: str | None = None,
        domain: str = "",
        attrs: Mapping[str, Any] | None = None,
        workspace_bytes: int = 0,
    ) -> int:
        kid = len(self._kernels)
        outs = tuple(outputs)
        for tid in outs:
            if tid in self._producer:
                raise GraphError(f"tensor {self._tensors[tid].name!r} is produced twice "
                                 f"(kernels #{self._producer[tid]} and #{kid}); tensors are SSA")
            self._producer[tid] = kid
        self._kernels.append(_KernelSpec(name or f"{op_type}_{kid}", op_type, domain,
                                         dict(attrs or {}), tuple(inputs), outs, workspace_bytes))
        return kid

    @property
    def num_kernels(self) -> int:
        return len(self._kernels)

    def build(self, *, validate: bool = True) -> TensorGraph:
        users: list[list[int]] = [[] for _ in self._tensors]
        for kid, k in enumerate(self._kernels):
            for tid in dict.fromkeys(k.inputs):  # distinct, in slot order
                users[tid].append(kid)
        tensors = tuple(
            Tensor(i, s.name, s.shape, s.dtype, s.role, self._producer.get(i), tuple(users[i]))
            for i, s in enumerate(self._tensors)
        )
        kernels = tuple(self._freeze_kernel(kid, k, tensors) for kid, k in enumerate(self._kernels))
        graph = TensorGraph(
            name=self.name,
            kernels=kernels,
            tensors=tensors,
            inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
            carried=tuple(self.carried),
            constants=dict(self.constants),
            meta=dict(self.meta),
        )
        return graph.validate() if validate else graph

    @staticmethod
    def _freeze_kernel(kid: int, k: _KernelSpec, tensors: tuple[Tensor, ...]) -> Kernel:
        attrs = freeze_attrs(k.attrs)
        sig = kernel_signature(
            k.op_type, k.domain, attrs,
            [(tensors[t].shape, tensors[t].dtype) for t in k.inputs],
            [(tensors[t].shape, tensors[t].dtype) for t in k.outputs],
        )
        return Kernel(kid, k.name, k.op_type, k.domain, attrs, k.inputs, k.outputs, sig,
                      k.workspace_bytes)


def rebuild(graph: TensorGraph, name: str | None = None) -> GraphBuilder:
    """A builder pre-filled with a graph's tensors and kernels, to derive a new graph from it."""
    b = GraphBuilder(name or graph.name)
    for t in graph.tensors:
        b.add_tensor(t.name, t.shape, t.dtype, t.role)
    b.constants.update(graph.constants)
    for k in graph.kernels:
        b.add_kernel(k.op_type, k.inputs, k.outputs, name=k.name, domain=k.domain,
                     attrs=k.attrs_dict, workspace_bytes=k.workspace_bytes)
    b.inputs = list(graph.inputs)
    b.outputs = list(graph.outputs)
    b.carried = list(graph.carried)
    b.meta = dict(graph.meta)
    return b
