"""Graphs of 100-500 kernels for the randomized planning checks at size (issue 17, item 4).

Three kinds, each a training iteration (weights carried to their next value):

- ``skips``: a random DAG with a main path, branches (a kernel restarts from a tensor a few
  steps back, so paths run side by side until a later kernel reads two heads) and skip
  connections (a read of a tensor up to 24 kernels back, and rarely of any earlier one), some
  kernels with weights or workspace; then a backward pass in reverse that reads saved forward
  tensors, and an SGD update per weight right after its gradient;
- ``cnn``: a random CNN of real ONNX ops built with the zoo's layers (plain, residual, dense and
  inception-like branch blocks, pooling, an MLP head), imported by the real importer and
  derived for training by `api.derive_training` (SGD or Adam);
- ``zoo``: the zoo models whose training graph has at most 500 kernels at batch 1 (VGG19 163,
  DLRM 151), with the shipped profiles of the device.

`problem(kind, seed, size)` returns the graph and its costs for a device.
"""

from __future__ import annotations

import random
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from autotm_py import api
from autotm_py.ir import GraphBuilder, Role, TensorGraph
from tests.graphs import KIB, costs_for

if TYPE_CHECKING:
    from autotm_py.costs import KernelCosts

KINDS = ("skips", "cnn", "zoo")
ZOO_MODELS = ("vgg19", "dlrm")  # training graphs of <= 500 kernels at batch 1
MIN_KERNELS, MAX_KERNELS = 100, 500


def _act(b: GraphBuilder, name: str, kib: int, role: Role = Role.ACTIVATION) -> int:
    return b.add_tensor(name, (kib * KIB // 4,), "float32", role)


# ---- random DAGs with skips and branches ---------------------------------------------------
def skip_dag(seed: int, n_kernels: int) -> TensorGraph:
    """About `n_kernels` kernels (see the module docstring)."""
    rng = random.Random(seed)
    b = GraphBuilder(f"skips{seed}")
    x = _act(b, "x", rng.randint(1, 16) * 4, Role.INPUT)
    b.inputs.append(x)
    acts, saved = [x], []
    for i in range(max(4, int(n_kernels / 2.5))):
        back = 1 if rng.random() < 0.75 else rng.randint(2, 4)  # a branch from a few back
        ins = [acts[-min(back, len(acts))]]
        if rng.random() < 0.35:
            ins.append(rng.choice(acts[-24:]))  # a skip within a window
        if rng.random() < 0.05:
            ins.append(rng.choice(acts))  # a long skip
        ins = list(dict.fromkeys(ins))
        w = _act(b, f"w{i}", rng.randint(1, 16) * 2, Role.WEIGHT) if rng.random() < 0.5 \
            else None
        out = _act(b, f"a{i}", rng.randint(1, 16) * 4)
        ws = rng.randint(1, 8) * KIB if rng.random() < 0.1 else 0
        b.add_kernel("Fwd", ins + ([w] if w is not None else []), [out], name=f"f{i}",
                     workspace_bytes=ws)
        acts.append(out)
        saved.append((ins, out, w))
    grad = _act(b, "g_top", b.shape_of(acts[-1])[0] * 4 // KIB, Role.GRADIENT)
    b.add_kernel("Loss", [acts[-1]], [grad], name="loss")
    for i, (ins, out, w) in reversed(list(enumerate(saved))):
        reads = [grad, ins[0]] + ([out] if rng.random() < 0.5 else []) + \
            ([w] if w is not None else [])
        outs = [_act(b, f"g{i}", b.shape_of(ins[0])[0] * 4 // KIB, Role.GRADIENT)]
        if w is not None:
            outs.append(_act(b, f"dw{i}", b.shape_of(w)[0] * 4 // KIB, Role.WEIGHT_GRADIENT))
        b.add_kernel("Bwd", reads, outs, name=f"b{i}", domain="autotm")
        if w is not None:
            w_next = b.add_tensor(f"w{i}::next", b.shape_of(w), "float32", Role.WEIGHT)
            b.add_kernel("SGDUpdate", [w, outs[1]], [w_next], name=f"sgd{i}", domain="autotm")
            b.carried.append((w, w_next))
            b.outputs.append(w_next)
        grad = outs[0]
    b.outputs.append(grad)
    return b.build()


# ---- random CNNs of real ops, derived for training -------------------------------------------
def random_cnn(seed: int, n_kernels: int) -> TensorGraph:
    """A training graph of about `n_kernels` kernels: the forward size is estimated, then
    corrected (same seed, same blocks) until the training graph is within 5% of the target;
    the closest of four tries (a block adds 5-25 kernels, so small targets can miss by 15%)."""
    target, best = n_kernels, None
    for _ in range(4):
        graph = _random_cnn(seed, target)
        miss = abs(len(graph.kernels) - n_kernels)
        if best is None or miss < abs(len(best.kernels) - n_kernels):
            best = graph
        if miss <= 0.05 * n_kernels:
            break
        target = max(20, round(target * n_kernels / len(graph.kernels)))
    assert best is not None
    return best


def _random_cnn(seed: int, n_kernels: int) -> TensorGraph:
    from autotm_py.frontend.zoo.layers import (
        Act,
        NetBuilder,
        bn_relu_conv,
        classifier_head,
        concat,
        conv,
        conv_bn,
        image_input,
        pool,
        relu,
    )

    rng = random.Random(seed)
    b = NetBuilder(f"cnn{seed}")
    size = rng.choice((8, 12, 16))
    x = conv_bn(b, image_input(b, size), rng.choice((4, 8)), 3, name="stem")
    block = 0

    def forward_ops() -> int:
        return sum(n.op_type != "Constant" for n in b.nodes)

    while forward_ops() * 3.2 < n_kernels - 20:
        kind = rng.choice(("plain", "residual", "dense", "branch", "pool"))
        with b.scope(f"block{block}"):
            if kind == "plain":
                x = conv_bn(b, x, rng.choice((4, 8, 12)), rng.choice((1, 3)))
            elif kind == "residual":
                y = conv_bn(b, conv_bn(b, x, x.ch, 3, name="a"), x.ch, 3, act=False, name="b")
                x = relu(b, Act(b.op("Add", y.name, x.name), x.ch))
            elif kind == "dense":
                x = concat(b, [x, bn_relu_conv(b, x, rng.choice((2, 4)), 3, name="d")])
            elif kind == "branch":
                parts = [conv_bn(b, x, 4, 1, name="p1"), conv_bn(b, x, 4, 3, name="p3"),
                         conv(b, pool(b, x, "avg", 3, 1, 1), 4, 1, name="pp")]
                x = concat(b, parts)
            elif size > 2:
                x = pool(b, x, rng.choice(("max", "avg")), 2, 2)
                size //= 2
        block += 1
    classifier_head(b, x, classes=rng.randint(2, 10))
    model = b.build({"batch": 1}, "a random CNN for the planning checks")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"cnn{seed}.onnx"
        onnx.save(model, path)
        graph = api.import_onnx(path, batch=rng.choice((1, 2)))
    return api.derive_training(graph, optimizer=rng.choice(("sgd", "adam")))


# ---- zoo models ----------------------------------------------------------------------------
@cache
def zoo_training(name: str) -> TensorGraph:
    return api.load_model(name, batch=1, training=True)


@cache
def zoo_costs(name: str, device: str) -> KernelCosts:
    return api.load_costs(zoo_training(name), device=device)


def problem(kind: str, seed: int, size: int, device: str) -> tuple[TensorGraph, KernelCosts]:
    """A graph of `kind` (about `size` kernels for the random kinds) and its costs."""
    if kind == "zoo":
        name = ZOO_MODELS[seed % len(ZOO_MODELS)]
        return zoo_training(name), zoo_costs(name, device)
    graph = skip_dag(seed, size) if kind == "skips" else random_cnn(seed, size)
    return graph, costs_for(graph, device, seed=seed)
