"""Synthetic tensor graphs for unit tests (no ONNX, no solver needed)."""

from __future__ import annotations

import random

from autotm_py.ir import GraphBuilder, Role, TensorGraph


def chain(n: int = 4, size: int = 1024) -> TensorGraph:
    """x -> Relu -> Relu ... (n kernels); activations of `size` float32 elements."""
    b = GraphBuilder(f"chain{n}")
    prev = b.add_tensor("x", (size,), "float32", Role.INPUT)
    b.inputs.append(prev)
    for i in range(n):
        out = b.add_tensor(f"a{i}", (size,), "float32",
                           Role.OUTPUT if i == n - 1 else Role.ACTIVATION)
        b.add_kernel("Relu", [prev], [out], name=f"relu{i}")
        prev = out
    b.outputs.append(prev)
    return b.build()


def diamond(size: int = 1024) -> TensorGraph:
    """x -> a, x -> b, (a, b) -> c."""
    b = GraphBuilder("diamond")
    x = b.add_tensor("x", (size,), "float32", Role.INPUT)
    a = b.add_tensor("a", (size,), "float32", Role.ACTIVATION)
    c = b.add_tensor("b", (size,), "float32", Role.ACTIVATION)
    d = b.add_tensor("c", (size,), "float32", Role.OUTPUT)
    b.inputs.append(x)
    b.add_kernel("Relu", [x], [a])
    b.add_kernel("Sigmoid", [x], [c])
    b.add_kernel("Add", [a, c], [d])
    b.outputs.append(d)
    return b.build()


def random_dag(seed: int, n_kernels: int = 8, max_inputs: int = 3) -> TensorGraph:
    """A random DAG of n-ary elementwise kernels over tensors of random sizes."""
    rng = random.Random(seed)
    b = GraphBuilder(f"random{seed}")
    avail = [b.add_tensor("x", (rng.randint(1, 64) * 256,), "float32", Role.INPUT)]
    b.inputs.append(avail[0])
    for i in range(n_kernels):
        k = rng.randint(1, min(max_inputs, len(avail)))
        ins = rng.sample(avail, k)
        out = b.add_tensor(f"t{i}", (rng.randint(1, 64) * 256,), "float32", Role.ACTIVATION)
        b.add_kernel("Sum", ins, [out], name=f"k{i}")
        avail.append(out)
    b.outputs.append(avail[-1])
    return b.build()
