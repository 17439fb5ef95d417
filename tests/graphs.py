"""Hand-built test graphs for the planner: residual block, small training graphs, random DAGs
with weights and carried pairs (training-like), and a large layered net for build timing."""

from __future__ import annotations

import random
from typing import Any

from autotm_py.costs import KernelCosts
from autotm_py.ir import GraphBuilder, Role, TensorGraph

KIB = 1024


def _act(b: GraphBuilder, name: str, kib: int, role: Role = Role.ACTIVATION) -> int:
    return b.add_tensor(name, (kib * KIB // 4,), "float32", role)


def residual_block(kib: int = 64) -> TensorGraph:
    """x -> conv1(W1) -> relu -> conv2(W2) -> add(x) -> relu (inference, persistent weights)."""
    b = GraphBuilder("residual")
    x = _act(b, "x", kib, Role.INPUT)
    w1, w2 = _act(b, "w1", kib // 2, Role.WEIGHT), _act(b, "w2", kib // 2, Role.WEIGHT)
    b.inputs.append(x)
    h1, r1, h2, s, y = (_act(b, n, kib) for n in ("h1", "r1", "h2", "s", "y"))
    b.add_kernel("Conv", [x, w1], [h1])
    b.add_kernel("Relu", [h1], [r1])
    b.add_kernel("Conv", [r1, w2], [h2])
    b.add_kernel("Add", [h2, x], [s])
    b.add_kernel("Relu", [s], [y])
    b.outputs.append(y)
    return b.build()


def small_training(kib: int = 64, workspace_kib: int = 0) -> TensorGraph:
    """Gemm -> Relu -> loss, backward, SGD: 7 kernels, one carried weight (W -> W')."""
    b = GraphBuilder("train")
    x, label = _act(b, "x", kib, Role.INPUT), _act(b, "label", kib // 4, Role.LABEL)
    w = _act(b, "w", kib // 2, Role.WEIGHT)
    b.inputs += [x, label]
    h, y = _act(b, "h", kib), _act(b, "y", kib)
    loss = _act(b, "loss", 1, Role.OUTPUT)
    dy, dh = _act(b, "dy", kib, Role.GRADIENT), _act(b, "dh", kib, Role.GRADIENT)
    dw = _act(b, "dw", kib // 2, Role.WEIGHT_GRADIENT)
    w_next = _act(b, "w::next", kib // 2, Role.WEIGHT)
    b.add_kernel("Gemm", [x, w], [h], workspace_bytes=workspace_kib * KIB)
    b.add_kernel("Relu", [h], [y])
    b.add_kernel("SoftmaxCrossEntropy", [y, label], [loss], domain="autotm")
    b.add_kernel("SoftmaxCrossEntropyGrad", [y, label], [dy], domain="autotm")
    b.add_kernel("ReluGrad", [dy, h], [dh], domain="autotm")
    b.add_kernel("GemmGradB", [x, dh], [dw], domain="autotm")
    b.add_kernel("SGDUpdate", [w, dw], [w_next], domain="autotm")
    b.carried.append((w, w_next))
    b.outputs += [loss, w_next]
    return b.build()


def _update_weight(b: GraphBuilder, op: str, grad: int, x: int, w: int, kib: int, *,
                   name: str) -> TensorGraph:
    """The weight's gradient (kernel `op` from the last gradient and the input), its SGD
    update carried to the next iteration, and the graph."""
    dw = _act(b, "dw", kib // 4, Role.WEIGHT_GRADIENT)
    b.add_kernel(op, [grad, x], [dw], name=name, domain="autotm")
    w_next = _act(b, "w::next", kib // 4, Role.WEIGHT)
    b.add_kernel("SGDUpdate", [w, dw], [w_next], name="sgd", domain="autotm")
    b.carried.append((w, w_next))
    b.outputs.append(w_next)
    return b.build()


def chain_training(n: int = 3, kib: int = 64) -> TensorGraph:
    """A chain of n forward kernels (the first with a weight), a loss, and a backward pass in
    which each backward kernel reads the forward activation below it (as ReluGrad or
    ConvGradFilter do), then SGD: a small graph where activations are worth regenerating."""
    b = GraphBuilder(f"chain_train{n}")
    x, w = _act(b, "x", kib, Role.INPUT), _act(b, "w", kib // 4, Role.WEIGHT)
    b.inputs.append(x)
    acts = [x]
    for i in range(n):
        out = _act(b, f"a{i}", kib)
        b.add_kernel("Relu", [acts[-1], w] if i == 0 else [acts[-1]], [out], name=f"f{i}")
        acts.append(out)
    grad = _act(b, "g_top", kib, Role.GRADIENT)
    b.add_kernel("Loss", [acts[-1]], [grad], name="loss", domain="autotm")
    for i in range(n - 1, 0, -1):
        g = _act(b, f"g{i}", kib, Role.GRADIENT)
        b.add_kernel("Bwd", [grad, acts[i]], [g], name=f"b{i}", domain="autotm")
        grad = g
    return _update_weight(b, "Bwd", grad, x, w, kib, name="b0")


def layers_training(n: int, kib: int = 64) -> TensorGraph:
    """n layers of three forward kernels (convolution, normalization, ReLU, as in a ResNet) and
    a backward pass that reads each layer's first and last output, never the middle one: a
    chain that depth-2 regeneration at one point cannot re-make (the convolution's output
    needs the previous layer's three), while checkpointing's segments can."""
    b = GraphBuilder(f"layers{n}")
    x, w = _act(b, "x", kib, Role.INPUT), _act(b, "w", kib // 4, Role.WEIGHT)
    b.inputs.append(x)
    saved, prev = [], x
    for i in range(n):
        c, m, r = (_act(b, f"{s}{i}", kib) for s in "cmr")
        b.add_kernel("Conv", [prev, w] if i == 0 else [prev], [c], name=f"conv{i}")
        b.add_kernel("Norm", [c], [m], name=f"norm{i}")
        b.add_kernel("Relu", [m], [r], name=f"relu{i}")
        saved.append((c, r))
        prev = r
    grad = _act(b, "g_top", kib, Role.GRADIENT)
    b.add_kernel("Loss", [prev], [grad], name="loss", domain="autotm")
    for i in range(n - 1, -1, -1):
        c, r = saved[i]
        g1 = _act(b, f"gr{i}", kib, Role.GRADIENT)
        b.add_kernel("ReluNormGrad", [grad, r, c], [g1], name=f"bn{i}", domain="autotm")
        g2 = _act(b, f"gc{i}", kib, Role.GRADIENT)
        below = saved[i - 1][1] if i else x
        b.add_kernel("ConvGrad", [g1, below], [g2], name=f"bc{i}", domain="autotm")
        grad = g2
    return _update_weight(b, "WGrad", grad, x, w, kib, name="bw")


def random_training(seed: int, n_forward: int = 4, max_inputs: int = 2) -> TensorGraph:
    """A random forward DAG with weights, a backward pass that reads forward activations in
    reverse order, and SGD updates of carried weights: a small training-like graph."""
    rng = random.Random(seed)
    b = GraphBuilder(f"rtrain{seed}")
    x = _act(b, "x", rng.randint(1, 8) * 16, Role.INPUT)
    b.inputs.append(x)
    acts, weights = [x], []
    for i in range(n_forward):
        ins = rng.sample(acts, rng.randint(1, min(max_inputs, len(acts))))
        w = _act(b, f"w{i}", rng.randint(1, 8) * 8, Role.WEIGHT) if rng.random() < 0.6 else None
        out = _act(b, f"a{i}", rng.randint(1, 8) * 16)
        b.add_kernel("Fwd", ins + ([w] if w is not None else []), [out], name=f"f{i}")
        acts.append(out)
        if w is not None:
            weights.append((w, out, ins))
    grad = _act(b, "g_top", rng.randint(1, 8) * 16, Role.GRADIENT)
    b.add_kernel("Loss", [acts[-1]], [grad], name="loss")
    for i, (w, out, ins) in enumerate(reversed(weights)):
        dw = _act(b, f"dw{i}", b.shape_of(w)[0] // 256, Role.WEIGHT_GRADIENT)
        b.add_kernel("Bwd", [grad, ins[0], out], [dw], name=f"b{i}", domain="autotm")
        w_next = b.add_tensor(f"{b.name_of(w)}::next", b.shape_of(w), "float32", Role.WEIGHT)
        b.add_kernel("SGDUpdate", [w, dw], [w_next], name=f"sgd{i}", domain="autotm")
        b.carried.append((w, w_next))
        b.outputs.append(w_next)
    b.outputs.append(grad)
    return b.build()


def layered_net(blocks: int, width: int = 4, kib: int = 1024, seed: int = 0) -> TensorGraph:
    """A DenseNet-like training graph: `blocks` blocks of `width` conv layers whose inputs
    concatenate the block's earlier outputs, then a backward pass in reverse and SGD updates.
    Used to time the formulation on thousands of kernels."""
    rng = random.Random(seed)
    b = GraphBuilder(f"layered{blocks}x{width}")
    x = _act(b, "x", kib, Role.INPUT)
    b.inputs.append(x)
    saved: list[tuple[int, int, int]] = []  # (input, weight, output)
    prev = x
    for blk in range(blocks):
        feats = [prev]
        for lay in range(width):
            cat = _act(b, f"cat{blk}_{lay}", kib * len(feats))
            b.add_kernel("Concat", feats, [cat])
            w = _act(b, f"w{blk}_{lay}", rng.randint(1, 4) * 16, Role.WEIGHT)
            out = _act(b, f"o{blk}_{lay}", kib)
            b.add_kernel("Conv", [cat, w], [out], workspace_bytes=kib * KIB // 4)
            saved.append((cat, w, out))
            feats.append(out)
        prev = feats[-1]
    grad = _act(b, "g", kib, Role.GRADIENT)
    b.add_kernel("Loss", [prev], [grad], domain="autotm")
    for i, (cat, w, _out) in enumerate(reversed(saved)):
        dw = _act(b, f"dw{i}", b.shape_of(w)[0] // 256, Role.WEIGHT_GRADIENT)
        b.add_kernel("ConvGradFilter", [grad, cat], [dw], domain="autotm")
        dx = _act(b, f"dx{i}", kib, Role.GRADIENT)
        b.add_kernel("ConvGradData", [grad, w], [dx], domain="autotm")
        w_next = b.add_tensor(f"{b.name_of(w)}::next", b.shape_of(w), "float32", Role.WEIGHT)
        b.add_kernel("SGDUpdate", [w, dw], [w_next], domain="autotm")
        b.carried.append((w, w_next))
        b.outputs.append(w_next)
        grad = dx
    b.outputs.append(grad)
    return b.build()


def costs_for(graph: TensorGraph, device: str = "cuda", seed: int = 0,
              scale_s: float = 1e-3) -> KernelCosts:
    """Kernel times proportional to bytes touched (a roofline), with some random spread."""
    rng = random.Random(seed)
    times = []
    for k in graph.kernels:
        nbytes = sum(graph.tensors[t].nbytes for t in k.io)
        times.append(scale_s * (0.2 + nbytes / 2**20) * rng.uniform(0.5, 1.5))
    return KernelCosts.from_times(device, times)


def sync_and_async_at_a_third(blocks: int) -> tuple[Any, Any]:
    """The sync model of a DenseNet-like training graph (`layered_net`, GPU mode: a host-mode
    plan reads slow memory in place and has no copies to overlap) at a third of its peak,
    solved, and its async model (2 candidates, nothing applied): where the async search's
    starts are tested."""
    from autotm_py.machine import MachineModel
    from autotm_py.memory.tiers import preset
    from autotm_py.planning import formulation
    from autotm_py.planning.solvers import run_solver

    g = layered_net(blocks, width=3, kib=256)
    costs = costs_for(g, "cuda")
    memory = preset("h100-pcie5")
    probe = MachineModel(g, memory, costs)
    machine = MachineModel(g, memory.with_budget(probe.peak[0] // 3), costs)
    sync = formulation.build(machine, "sync", 15)
    run_solver(sync.prob, "highs", gap=0.0, time_limit=60)
    return sync, formulation.build(machine, "async", 15, candidates=2)


def first_packing_leaves_holes(monkeypatch: Any) -> None:
    """The fit loop's first packing places the buffers smallest first, which leaves holes, and
    the later ones are the search's (`arena.packing.tightest_packing`): a plan that would pack
    at once is solved again, for the tests of the fit loop's re-solves."""
    from autotm_py import arena
    from autotm_py.arena import packing

    search, calls = arena.tightest_packing, []

    def holes_first(life: Any, limit: int | None = None) -> list[int]:
        calls.append(life)
        if len(calls) > 1:
            return search(life, limit)
        return packing._place(life, packing.largest_first(life)[::-1])

    monkeypatch.setattr(arena, "tightest_packing", holes_first)
