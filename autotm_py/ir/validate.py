"""Invariant checks of a `TensorGraph`, with messages that say what is wrong and how to fix it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotm_py.errors import GraphError
from autotm_py.ir.dtypes import DTYPE_SIZES

if TYPE_CHECKING:
    from autotm_py.ir.graph import Kernel, TensorGraph


def validate_graph(graph: TensorGraph) -> None:
    """Check ids, producers, users, execution order, shapes and dtypes; raise `GraphError`."""
    _check_dense_ids(graph)
    for kernel in graph.kernels:
        _check_kernel_io(graph, kernel)
    for t in graph.tensors:
        _check_tensor(graph, t.id)
    for first, last in graph.carried:
        if not (0 <= first < len(graph.tensors) and 0 <= last < len(graph.tensors)):
            raise GraphError(f"carried pair ({first}, {last}) names a tensor id out of range")


def _check_dense_ids(graph: TensorGraph) -> None:
    for i, k in enumerate(graph.kernels):
        if k.id != i:
            raise GraphError(f"kernel {k.name!r} has id {k.id} at position {i}; rebuild the graph "
                             "with GraphBuilder so ids are dense and in execution order")
    for i, t in enumerate(graph.tensors):
        if t.id != i:
            raise GraphError(f"tensor {t.name!r} has id {t.id} at position {i}; ids must be dense")


def _check_kernel_io(graph: TensorGraph, kernel: Kernel) -> None:
    n = len(graph.tensors)
    for tid in kernel.io:
        if not 0 <= tid < n:
            raise GraphError(f"kernel {kernel.name!r} ({kernel.op_type}) refers to tensor id "
                             f"{tid}, which does not exist (graph has {n} tensors)")
    for tid in kernel.inputs:
        t = graph.tensors[tid]
        if t.producer is not None and t.producer >= kernel.id:
            raise GraphError(
                f"tensor {t.name!r} (id {tid}) is used by kernel {kernel.name!r} (#{kernel.id}) "
                f"before its producer #{t.producer} runs; the graph has a cycle or is not in "
                "topological order")
        if kernel.id not in t.users:
            raise GraphError(f"kernel {kernel.name!r} reads tensor {t.name!r} but is missing "
                             "from its users; build graphs with GraphBuilder")
    for tid in kernel.outputs:
        if graph.tensors[tid].producer != kernel.id:
            raise GraphError(f"kernel {kernel.name!r} writes tensor "
                             f"{graph.tensors[tid].name!r}, whose producer is "
                             f"{graph.tensors[tid].producer}; every tensor has one producer")


def _check_tensor(graph: TensorGraph, tid: int) -> None:
    t = graph.tensors[tid]
    if t.dtype not in DTYPE_SIZES:
        raise GraphError(f"tensor {t.name!r} has dtype {t.dtype!r}; supported: "
                         f"{', '.join(DTYPE_SIZES)}")
    if any((not isinstance(d, int)) or d < 0 for d in t.shape):
        raise GraphError(f"tensor {t.name!r} has shape {t.shape}; every dimension must be a "
                         "known non-negative integer (bind symbolic ones with --dim/--batch)")
    if list(t.users) != sorted(set(t.users)):
        raise GraphError(f"tensor {t.name!r} lists users {t.users}; they must be distinct and "
                         "in execution order")
    for user in t.users:
        if tid not in graph.kernels[user].inputs:
            raise GraphError(f"tensor {t.name!r} lists kernel #{user} as a user, but that "
                             "kernel does not read it")
    if t.producer is None and not t.users and tid not in graph.outputs:
        raise GraphError(f"tensor {t.name!r} is neither produced nor used; remove it")
