"""Reference execution of a `TensorGraph` with the torch kernels, without any plan.

- `init_values(graph, seed, device)`: values for every tensor without a producer (weights
  scaled by fan-in so deep nets stay finite, inputs, labels and indices in range, constants,
  zero optimizer state).
- `run_graph(graph, values)`: run all kernels in order, freeing each tensor after its last use.
- `train_steps(graph, steps, seed)`: several training iterations, feeding W' back as W.
- `autograd_steps(graph, steps, seed)`: the same iterations computed by torch.autograd on the
  training graph's forward kernels plus `torch.optim` (the oracle the tests compare against).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from autotm_py.errors import ExecutionError
from autotm_py.ir.graph import Role, Tensor, TensorGraph
from autotm_py.ir.optim import optimizer_of
from autotm_py.ir.rules.fused import LINEAR_CE, linear_ce_classes
from autotm_py.kernels import run_kernel
from autotm_py.kernels.util import in_layout, torch_dtype

Values = dict[int, torch.Tensor]

# (op, input slot) -> how a weight in that slot is initialised: "fan" (normal / sqrt(fan_in),
# times sqrt(2) as for ReLU nets), "one" (around 1: scales, variances), "small" (biases, means)
_SLOT_INIT = {
    ("BatchNormalization", 1): "one", ("BatchNormalization", 4): "one",
    ("BatchNormalization", 2): "small", ("BatchNormalization", 3): "small",
    ("LayerNormalization", 1): "one", ("LayerNormalization", 2): "small",
    ("Gather", 0): "embedding",
}


def _fan_in(graph: TensorGraph, t: Tensor) -> int:
    """Fan-in of a weight from its first user (Conv filter, Gemm/MatMul operand)."""
    shape = t.shape
    if not t.users or len(shape) < 2:
        return max(shape[-1] if shape else 1, 1)
    k = graph.kernels[t.users[0]]
    slot = k.inputs.index(t.id)
    if k.op_type in ("Conv", "ConvRelu") and slot == 1:
        return math.prod(shape[1:])
    if k.op_type == "ConvTranspose" and slot == 1:
        return shape[0] * math.prod(shape[2:])
    if k.op_type == "Gemm":
        trans = int(k.attr("transA" if slot == 0 else "transB", 0))
        return shape[0] if (slot == 0) == bool(trans) else shape[1]
    if k.op_type == "MatMul" and slot == 1:
        return shape[-2]
    if k.op_type == "Linear" and slot == 1:  # the fused MatMul (+ bias): (K, N) or (N, K)
        return shape[1] if k.attr("transB", 0) else shape[0]
    return shape[-1]


def _init_weight(graph: TensorGraph, t: Tensor, gen: torch.Generator) -> torch.Tensor:
    kind = "fan" if len(t.shape) >= 2 else "small"
    for user in t.users[:1]:
        k = graph.kernels[user]
        kind = _SLOT_INIT.get((k.op_type, k.inputs.index(t.id)), kind)
    dtype = torch_dtype(t.dtype)
    if kind == "one":
        return torch.rand(t.shape, generator=gen, dtype=dtype) + 0.5
    noise = torch.randn(t.shape, generator=gen, dtype=dtype)
    if kind == "small":
        return noise * 0.1
    if kind == "embedding":
        return noise
    return noise * math.sqrt(2.0 / _fan_in(graph, t))


def _index_bound(graph: TensorGraph, t: Tensor) -> int:
    """Valid range of an integer input: the gathered axis, or the classes of a loss."""
    bound = None
    for user in t.users:
        k = graph.kernels[user]
        slot = k.inputs.index(t.id)
        data = graph.tensors[k.inputs[0]].shape
        if k.op_type == "Gather" and slot == 1:
            limit = data[int(k.attr("axis", 0)) % len(data)]
        elif k.op_type in ("SoftmaxCrossEntropy", "SoftmaxCrossEntropyLoss") and slot == 1:
            axis = int(k.attr("axis", 1 if k.domain == "" else -1))
            limit = data[axis % len(data)]
        elif k.op_type == LINEAR_CE and slot == len(k.inputs) - 1:
            limit = linear_ce_classes(graph.tensors[k.inputs[1]].shape, k.attr("transB", 0))
        else:
            continue
        bound = limit if bound is None else min(bound, limit)
    return 2 if bound is None else bound


def _init_leaf(graph: TensorGraph, t: Tensor, gen: torch.Generator) -> torch.Tensor:
    dtype = torch_dtype(t.dtype)
    if t.id in graph.constants:
        return torch.tensor(np.array(graph.constants[t.id]), dtype=dtype)
    if t.role == Role.CONSTANT:
        raise ExecutionError(f"constant tensor {t.name!r} has no value in graph.constants")
    if t.role == Role.OPTIMIZER_STATE:
        return torch.zeros(t.shape, dtype=dtype)
    if t.role == Role.WEIGHT and dtype.is_floating_point:
        return _init_weight(graph, t, gen)
    if dtype == torch.bool:
        return torch.rand(t.shape, generator=gen) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(0, _index_bound(graph, t), t.shape, generator=gen, dtype=dtype)
    return torch.randn(t.shape, generator=gen, dtype=dtype)


def init_values(graph: TensorGraph, seed: int = 0, device: str | torch.device = "cpu"
                ) -> Values:
    """Values of every tensor that no kernel produces, drawn on the CPU (so every device gets
    the same numbers) in tensor-id order from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    return {t.id: in_layout(_init_leaf(graph, t, gen), t).to(device) for t in graph.tensors
            if t.producer is None}


def leaf_value(graph: TensorGraph, tid: int, seed: int = 0) -> torch.Tensor:
    """One tensor's value as `init_values` makes it (constants, zero optimizer state), a
    random one drawn from a generator of its own (`seed` and the tensor's id): for a caller
    that needs a few values and must not hold all of them (a model of billions of weights)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + tid)
    return in_layout(_init_leaf(graph, graph.tensors[tid], gen), graph.tensors[tid])


def run_graph(graph: TensorGraph, values: Mapping[int, torch.Tensor],
              keep: Iterable[int] = ()) -> Values:
    """Run every kernel in order; return the graph outputs and the `keep` tensors."""
    wanted = set(graph.outputs) | set(keep)
    dying: list[list[int]] = [[] for _ in graph.kernels]
    for t in graph.tensors:
        if t.id not in wanted and t.users:
            dying[t.users[-1]].append(t.id)
    env = dict(values)
    with torch.no_grad():
        for k in graph.kernels:
            try:
                args = [env[t] for t in k.inputs]
            except KeyError as exc:
                raise ExecutionError(f"kernel {k.name!r} needs tensor "
                                     f"{graph.name_of(exc.args[0])!r}, which has no value; "
                                     "pass it in `values` (see init_values)") from None
            env.update(zip(k.outputs, run_kernel(k, args), strict=True))
            for t in dying[k.id]:
                env.pop(t, None)
    return {t: env[t] for t in wanted}


def train_steps(graph: TensorGraph, steps: int = 3, seed: int = 0,
                device: str | torch.device = "cpu", *, keep: Iterable[int] = (),
                values: Mapping[int, torch.Tensor] | None = None,
                lrs: Sequence[float] | None = None) -> list[Values]:
    """Run `steps` iterations of a training graph, carrying each (W, W') pair; the results
    of every step (graph outputs and `keep` tensors). `lrs`: the learning rate of each step,
    the value of the graph's learning-rate tensor (`Optimizer.lr_input`)."""
    current = init_values(graph, seed, device) if values is None else dict(values)
    lr_tensor = graph.meta.get("training", {}).get("lr_tensor")
    if lrs is not None and lr_tensor is None:
        raise ExecutionError(f"graph {graph.name!r} takes no learning rate as a tensor; derive "
                             "it with Optimizer(..., lr_input=True) to change it by step")
    keep = tuple(keep)
    results = []
    for step in range(steps):
        if lrs is not None:
            current[lr_tensor] = torch.tensor(lrs[step], dtype=torch.float32, device=device)
        out = run_graph(graph, current, keep)
        results.append(out)
        for first, last in graph.carried:
            current[first] = out[last]
    return results


def _update_kernels(graph: TensorGraph) -> dict[int, tuple[str, tuple[int, ...]]]:
    """weight -> (op, its outputs: (W', m', v'), (W', buf') or (W',))."""
    return {k.inputs[0]: (k.op_type, k.outputs) for k in graph.kernels
            if k.op_type in ("SGDUpdate", "AdamUpdate")}


# torch's names of the state an update kernel's outputs after W' hold
_STATE = {"SGDUpdate": ("momentum_buffer",), "AdamUpdate": ("exp_avg", "exp_avg_sq")}


def _optimizer(graph: TensorGraph, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """torch.optim's optimizer with the graph's hyper-parameters (`ir.optim.optimizer_of`),
    single-tensor (`foreach=False`), on the learning rate the graph was derived with."""
    opt = optimizer_of(graph.meta["training"])
    lr = float(opt.lr)
    if opt.kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=opt.momentum, nesterov=opt.nesterov,
                               weight_decay=opt.weight_decay, foreach=False)
    kind = torch.optim.AdamW if opt.decoupled else torch.optim.Adam
    return kind(params, lr=lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay,
                foreach=False)


def autograd_steps(graph: TensorGraph, steps: int = 3, seed: int = 0,
                   device: str | torch.device = "cpu", *, keep: Iterable[int] = (),
                   values: Mapping[int, torch.Tensor] | None = None,
                   lrs: Sequence[float] | None = None) -> list[Values]:
    """torch.autograd's version of `train_steps`: the forward kernels (and loss) of the
    training graph run on leaf weights, `loss.backward()`, then torch.optim's SGD, Adam or
    AdamW with the graph's hyper-parameters (`_optimizer`). Each step's result maps
    training-graph ids to values: the loss, every weight gradient, W', Adam's m' and v',
    SGD's momentum buffer', the carried forward outputs (BatchNorm running statistics) and
    the `keep` forward tensors. `lrs`: the learning rate of each step
    (`param_groups[0]["lr"]`, what a scheduler sets), else the graph's throughout."""
    meta = graph.meta["training"]
    values = init_values(graph, seed, device) if values is None else dict(values)
    grads = dict(meta["weight_grads"])
    params = {w: values[w].clone().requires_grad_(True) for w in grads}
    opt = _optimizer(graph, list(params.values()))
    updates = _update_kernels(graph)
    forward = graph.kernels[: meta["forward_kernels"]]
    produced = {t for k in forward for t in k.outputs}
    carried_fwd = [(a, z) for a, z in graph.carried if z in produced]
    results = []
    for step in range(steps):
        env: Values = {**values, **params}
        for k in forward:
            env.update(zip(k.outputs, run_kernel(k, [env[t] for t in k.inputs]), strict=True))
        opt.zero_grad()
        if lrs is not None:
            opt.param_groups[0]["lr"] = float(lrs[step])
        env[meta["loss"]].backward()
        out = {t: env[t].detach().clone() for t in (meta["loss"], *keep)}
        out.update({g: params[w].grad.detach().clone() for w, g in grads.items()})
        opt.step()
        for w, (k_op, outs) in updates.items():
            out[outs[0]] = params[w].detach().clone()
            state = opt.state[params[w]]  # Adam's moments, SGD's momentum buffer
            for tid, name in zip(outs[1:], _STATE[k_op], strict=False):
                out[tid] = state[name].clone()
        for a, z in carried_fwd:
            out[z] = values[a] = env[z].detach().clone()
        results.append(out)
    return results
