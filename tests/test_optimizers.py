"""The optimizers a PyTorch user brings (`ir/optim.py`): SGD with momentum, Nesterov and weight
decay, Adam with L2 weight decay, AdamW, and a learning rate given as a tensor that changes
between iterations without changing the graph.

Numerics, on the CPU (docs/training.md, "Optimizers"):
- given the same gradients, every SGD form is bit for bit torch.optim.SGD (single-tensor),
  with the learning rate an attribute or a tensor, constant or changed by step; Adam and AdamW
  keep the capturable formulation (bias corrections on the device, in double), which differs
  from torch's default CPU path by rounding: over 20 steps at most 2.5e-7 of the largest value
  of each tensor (W', m', v') here, asserted below 1e-6;
- end to end (our backward and update against torch.autograd and torch.optim), within 1e-5
  relative over 5 steps: the gradients themselves differ by float32 rounding (the backward is
  arranged differently), and an optimizer carries the difference on;
- a real plan (moves between the tiers, an arena with the updates written in place) computes
  bit for bit what the reference runner computes, and so does an executor whose learning-rate
  master changes between iterations.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from autotm_py import api
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.ir import Optimizer, Role
from autotm_py.ir.optim import LR_TENSOR, optimizer_of, plain_sgd
from autotm_py.ir.training import derive_training
from autotm_py.kernels import run_kernel, run_kernel_into
from autotm_py.memory.scratch import writes_in_place
from autotm_py.options import RunMode
from autotm_py.pipeline import machine_for, optimize
from autotm_py.plan import Move, Recompute
from autotm_py.profiling.costmodel import OpShape, flops_of
from autotm_py.runtime.execute import new_executor, run_steps
from autotm_py.runtime.reference import (
    _STATE,
    _optimizer,
    _update_kernels,
    autograd_steps,
    init_values,
    run_graph,
    train_steps,
)
from autotm_py.runtime.reuse import overwritable_inputs, update_runs
from tests.graphs import costs_for
from tests.test_training_models import Net, small_cnn, tiny_decoder
from tests.test_training_ops import assert_close

CONFIGS = {
    "sgd-momentum": Optimizer("sgd", 0.05, momentum=0.9),
    "sgd-nesterov-wd": Optimizer("sgd", 0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "sgd-wd": Optimizer("sgd", 0.05, weight_decay=1e-2),
    "adam-wd": Optimizer("adam", 1e-3, weight_decay=1e-2),
    "adamw-wd": Optimizer("adamw", 1e-3, weight_decay=1e-2),
}
FACTORS = (1.0, 0.8, 0.6, 0.5, 0.4)  # of the derived lr: what a scheduler sets, step by step


def mlp(batch: int = 8, d_in: int = 16, hidden: int = 32, classes: int = 10):
    """x -> MatMul + bias -> Relu -> Gemm -> Relu -> MatMul + bias -> cross-entropy."""
    net = Net("mlp")
    x = net.tensor((batch, d_in), Role.INPUT, name="x")
    h = net.op("MatMul", [x, net.weight(d_in, hidden)], (batch, hidden))
    h = net.op("Relu", [net.op("Add", [h, net.weight(hidden)], (batch, hidden))], (batch, hidden))
    h = net.op("Gemm", [h, net.weight(hidden, hidden), net.weight(hidden)], (batch, hidden))
    h = net.op("Relu", [h], (batch, hidden))
    y = net.op("MatMul", [h, net.weight(hidden, classes)], (batch, classes))
    return net.build(net.op("Add", [y, net.weight(classes)], (batch, classes)))


@functools.cache
def _train(name: str, lr_input: bool):
    opt = Optimizer("sgd", 0.05) if name == "sgd" else CONFIGS[name]
    return derive_training(mlp(), optimizer=dataclasses.replace(opt, lr_input=lr_input))


def _schedule(graph) -> list[float]:
    return [graph.meta["training"]["learning_rate"] * f for f in FACTORS]


def _budgets(graph):
    lo, hi = graph.max_working_set[0], graph.peak_live_bytes
    return {"tight": lo + (hi - lo) // 4, "middle": (lo + hi) // 2}


def _plan(graph, budget: int, run: RunMode | None = None):
    costs = costs_for(graph)
    if run is not None:  # an arena plan leaves room for the scratch region (test_executor.py)
        config = PlanConfig(fast_mem_bytes=budget, device="cuda", run=run)
        budget += machine_for(graph, config, costs).scratch_reserve
    result = optimize(graph, PlanConfig(fast_mem_bytes=budget, device="cuda",
                                        run=RunMode() if run is None else run), costs=costs)
    assert result.plan is not None, result.message
    return result.plan


# ---- the graph ---------------------------------------------------------------------------------
@pytest.mark.parametrize("lr_input", [False, True])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_graph_carries_the_state_and_the_hyper_parameters(name, lr_input):
    opt = dataclasses.replace(CONFIGS[name], lr_input=lr_input)
    graph, meta = _train(name, lr_input), _train(name, lr_input).meta["training"]
    assert optimizer_of(meta) == opt
    updates = [k for k in graph.kernels if k.op_type in ("SGDUpdate", "AdamUpdate")]
    assert len(updates) == len(meta["weight_grads"]) == 6
    carried = set(graph.carried)
    for k in updates:
        firsts = [k.inputs[0], *k.inputs[2:2 + len(k.outputs) - 1]]
        assert set(zip(firsts, k.outputs, strict=True)) <= carried
        assert all(graph.tensors[t].role == Role.OPTIMIZER_STATE for t in firsts[1:])
    lr = meta.get("lr_tensor")
    readers = [k for k in graph.kernels if k.op_type in ("SGDUpdate", "AdamStep") or
               k.attr("decoupled_weight_decay")]
    if not lr_input:
        assert lr is None and all(k.attr("lr") == opt.lr for k in readers)
        return
    t = graph.tensors[lr]
    assert (t.name, t.shape, t.dtype, t.role) == (LR_TENSOR, (), "float32", Role.CONSTANT)
    assert float(graph.constants[lr]) == pytest.approx(opt.lr, rel=1e-7)
    assert all(k.inputs[-1] == lr and k.attr("lr") is None for k in readers)
    assert {k.id for k in graph.kernels if lr in k.inputs} == {k.id for k in readers}


def test_the_string_forms_keep_their_graphs_and_hashes():
    """The hashes of `derive_training(g, optimizer="sgd" | "adam")` before the Optimizer existed
    (computed from HEAD 778e011 in a copy of it): the CLI's and the benchmark's graphs and the
    plans saved for them do not change."""
    before = {
        ("small_cnn", "sgd", 0.01): "46d22a6f966eeffa", ("small_cnn", "adam", 0.01):
        "2216e7dac93c2858", ("small_cnn", "sgd", 0.1): "72eb9ce40fdc50be",
        ("small_cnn", "adam", 0.1): "9ef815b303bb20a2",
        ("tiny_decoder", "sgd", 0.01): "17dc91377e74ce24",
        ("tiny_decoder", "adam", 0.01): "17c7c23b5e4ce65e",
        ("fused_decoder", "sgd", 0.01): "a6cfe7f5d4cefb34",
        ("fused_decoder", "adam", 0.01): "ad5d20f926c0787f",
        ("resnet50", "sgd", 0.01): "518a4b2126264d5a", ("resnet50", "adam", 0.01):
        "866c11eaa9008979",
    }
    forwards = {"small_cnn": small_cnn(), "tiny_decoder": tiny_decoder(),
                "fused_decoder": fuse_graph(tiny_decoder()),
                "resnet50": api.load_model("resnet50", batch=1)}
    for (model, opt, lr), want in before.items():
        given = {} if lr == 0.01 else {"learning_rate": lr}
        assert derive_training(forwards[model], optimizer=opt, **given).model_hash == want
        # the same optimizer as a value: the same graph
        assert derive_training(forwards[model], optimizer=Optimizer(opt, lr)).model_hash == want
    cli = {"sgd": "30ffb5882643f10d", "adam": "73efb528c890bd39"}  # resnet50, batch 2
    for opt, want in cli.items():
        assert api.load_model("resnet50", batch=2, training=True,
                              optimizer=opt).model_hash == want


@pytest.mark.parametrize(("fields", "match"), [
    ({"kind": "rmsprop"}, "kind 'rmsprop' is not supported; use one of sgd, adam, adamw"),
    ({"lr": -0.1}, "lr=-0.1: must not be negative"),
    ({"lr": float("nan")}, "lr=nan: expected a finite number"),
    ({"lr": True}, "lr=True: expected a finite number"),
    ({"momentum": -0.9}, "momentum=-0.9: must not be negative"),
    ({"weight_decay": -1e-4}, "weight_decay=-0.0001: must not be negative"),
    ({"dampening": -0.1}, "dampening=-0.1: must not be negative"),
    ({"momentum": 0.9, "dampening": 0.1}, "first step takes the gradient undamped"),
    ({"nesterov": True}, "nesterov=True needs momentum > 0 and dampening 0"),
    ({"kind": "adam", "momentum": 0.9}, "momentum: adam has no such hyper-parameter"),
    ({"kind": "adamw", "nesterov": True}, "nesterov: adamw has no such hyper-parameter"),
    ({"betas": (0.8, 0.99)}, "betas and eps apply to adam and adamw, not to sgd"),
    ({"kind": "adam", "betas": (0.9, 1.0)}, r"betas\[1\]=1.0: must be in \[0, 1\)"),
    ({"kind": "adam", "betas": (0.9,)}, "expected two numbers"),
    ({"kind": "adam", "eps": -1e-8}, "eps=-1e-08: must not be negative"),
    ({"lr_input": 1}, "lr_input=1: expected True or False"),
])
def test_bad_hyper_parameters_are_refused_by_name(fields, match):
    with pytest.raises(ConfigError, match=match):
        Optimizer(**{"kind": "sgd", "lr": 0.1, **fields})


def test_dampening_without_momentum_has_no_effect_and_is_accepted():
    graph = derive_training(mlp(), optimizer=Optimizer("sgd", 0.05, dampening=0.5))
    assert all(plain_sgd(k) for k in graph.kernels if k.op_type == "SGDUpdate")


def test_derive_training_takes_the_learning_rate_from_the_optimizer():
    opt = Optimizer("adamw", 1e-3, weight_decay=0.1)
    assert derive_training(mlp(), optimizer=opt, learning_rate=1e-3).meta["training"][
        "learning_rate"] == 1e-3
    with pytest.raises(ConfigError, match="differs from the Optimizer's lr"):
        derive_training(mlp(), optimizer=opt, learning_rate=0.01)
    with pytest.raises(ConfigError, match="optimizer 'adamw' is not supported"):
        derive_training(mlp(), optimizer="adamw")


# ---- numerics ----------------------------------------------------------------------------------
@pytest.mark.parametrize("lr_input", [False, True])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_training_matches_autograd_and_torch_optim(name, lr_input):
    """End to end, 5 steps: the loss, every weight gradient, W' and the optimizer state
    within 1e-5 of the largest value (the backward rounds differently from autograd's)."""
    graph = _train(name, lr_input)
    grads = [g for _, g in graph.meta["training"]["weight_grads"]]
    lrs = _schedule(graph) if lr_input else None
    ours = train_steps(graph, 5, seed=1, keep=grads, lrs=lrs)
    ref = autograd_steps(graph, 5, seed=1, lrs=lrs)
    states = sum(len(outs) for _, outs in _update_kernels(graph).values())
    for step, (got, want) in enumerate(zip(ours, ref, strict=True)):
        assert len(want) == 1 + len(grads) + states
        for tid, value in want.items():
            assert_close(got[tid], value, f"{name} step {step}: {graph.name_of(tid)}",
                         rtol=1e-5, atol=0.0)


def _torch_on_our_gradients(graph, steps: int, lrs=None) -> tuple[bool, float]:
    """torch.optim (single-tensor, `reference._optimizer`) fed our gradients step by step:
    (whether W' and the state are bitwise ours at every step, the largest difference relative
    to the tensor's largest value)."""
    weight_grads = dict(graph.meta["training"]["weight_grads"])
    values = init_values(graph, seed=1)
    ours = train_steps(graph, steps, values=values, keep=list(weight_grads.values()), lrs=lrs)
    params = {w: values[w].clone() for w in weight_grads}
    opt = _optimizer(graph, list(params.values()))
    bitwise, worst = True, 0.0
    for step in range(steps):
        if lrs is not None:
            opt.param_groups[0]["lr"] = lrs[step]
        for w, g in weight_grads.items():
            params[w].grad = ours[step][g].clone()
        opt.step()
        for w, (op, outs) in _update_kernels(graph).items():
            state = opt.state[params[w]]
            want = [params[w], *(state[n] for n in _STATE[op][:len(outs) - 1])]
            for tid, value in zip(outs, want, strict=True):
                bitwise = bitwise and torch.equal(ours[step][tid], value)
                err = (ours[step][tid] - value).abs().max() / value.abs().max()
                worst = max(worst, float(err))
    return bitwise, worst


@pytest.mark.parametrize("lr_input", [False, True])
@pytest.mark.parametrize("name", [*sorted(CONFIGS), "sgd"])
def test_the_update_is_torch_optim_given_the_same_gradients(name, lr_input):
    """20 steps (with a learning rate that changes every step where it is a tensor): every SGD
    form bit for bit; Adam and AdamW within 1e-6 (measured: 2.5e-7 at most), the difference
    between the capturable formulation and torch's default CPU path."""
    lrs = [0.05 * 0.9 ** i for i in range(20)] if lr_input else None
    bitwise, worst = _torch_on_our_gradients(_train(name, lr_input), 20, lrs)
    if name.startswith("sgd"):
        assert bitwise, f"{name}: {worst:.3g}"
    else:
        assert 0 < worst < 1e-6, worst


# ---- plans ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [*sorted(CONFIGS), "sgd"])
def test_a_plan_computes_what_the_reference_computes(name):
    """The lr-input graph of each optimizer, planned at two budgets between the largest working
    set and the peak (the tight one moves tensors between the tiers), executed for 3 steps on
    the CPU: bit for bit the reference runner's outputs."""
    graph = _train(name, True)
    reference = train_steps(graph, 3, seed=3)
    moved = 0
    for budget in _budgets(graph).values():
        plan = _plan(graph, budget)
        moved += sum(isinstance(r, Move | Recompute) for r in plan.records)
        for step, (got, want) in enumerate(zip(run_steps(graph, plan, steps=3, seed=3),
                                               reference, strict=True)):
            for tid in graph.outputs:
                assert torch.equal(got[tid], want[tid]), (name, budget, step,
                                                          graph.name_of(tid))
    assert moved > 0


@pytest.mark.parametrize("name", ["sgd-momentum", "sgd-nesterov-wd", "sgd"])
def test_an_arena_plan_updates_in_place_like_the_reference(name):
    """In an arena (the CPU's: every fast copy a view at its planned offset) W' and the
    momentum buffer' take their inputs' slots, written there by `kernels/into.py`."""
    graph = _train(name, True)
    reference = train_steps(graph, 3, seed=3)
    plan = _plan(graph, _budgets(graph)["middle"], RunMode(arena=True))
    for step, (got, want) in enumerate(zip(run_steps(graph, plan, steps=3, seed=3,
                                                     mode=RunMode(arena=True)),
                                           reference, strict=True)):
        for tid in graph.outputs:
            assert torch.equal(got[tid], want[tid]), (name, step, graph.name_of(tid))


@pytest.mark.parametrize("name", ["sgd-nesterov-wd", "adamw-wd", "sgd"])
def test_a_new_learning_rate_master_changes_the_next_update_as_torch_does(name):
    """A scheduler's step: the executor's master of the lr tensor gets a new value before each
    iteration (the executor places it at `prepare`); the graph and the plan stay. The same as
    the reference runner with that lr (bitwise) and as torch with `param_groups[0]["lr"]`
    set (within 1e-5, the end-to-end tolerance)."""
    graph = _train(name, True)
    lr_id, schedule = graph.meta["training"]["lr_tensor"], _schedule(graph)
    plan = _plan(graph, _budgets(graph)["tight"])
    _, executor, _ = new_executor(graph, plan, "cpu", seed=1)
    ours = []
    for lr in schedule:
        executor.masters[lr_id] = torch.tensor(lr, dtype=torch.float32)
        executor.prepare()
        executor.run()
        ours.append({t: executor.value(t).clone() for t in graph.outputs})
    reference = train_steps(graph, 5, seed=1, lrs=schedule)
    constant = train_steps(graph, 5, seed=1)
    torch_optim = autograd_steps(graph, 5, seed=1, lrs=schedule)
    for step in range(5):
        for tid in graph.outputs:
            assert torch.equal(ours[step][tid], reference[step][tid]), (step, tid)
            if tid in torch_optim[step]:  # all but Adam's step counter
                assert_close(ours[step][tid], torch_optim[step][tid], f"{name} step {step}",
                             rtol=1e-5, atol=0.0)
    w_next = next(k.outputs[0] for k in graph.kernels if k.op_type.endswith("Update"))
    assert torch.equal(ours[0][w_next], constant[0][w_next])  # the derived lr
    assert not torch.equal(ours[1][w_next], constant[1][w_next])


def test_only_plain_sgd_updates_run_as_one_foreach():
    """`reuse.update_runs` (the executor's foreach add of `kernel.attr("lr")`) takes today's
    plain SGDUpdate only, never one with a learning-rate input, momentum or weight decay."""
    for name, lr_input, runs in [("sgd", False, True), ("sgd", True, False),
                                 ("sgd-wd", False, False), ("sgd-momentum", False, False)]:
        graph = _train(name, lr_input)
        plan = _plan(graph, graph.peak_live_bytes)
        found = update_runs(graph, plan, overwritable_inputs(graph, plan))
        assert bool(found) == runs, name
        members = [plan.records[i].kernel for run in found.values() for i in run]
        assert all(plain_sgd(graph.kernels[k]) for k in members)


def _sgd_forms():
    """(name, kernel, values) of one SGDUpdate of each form."""
    for name, lr_input in [("sgd", False), ("sgd", True), ("sgd-wd", True),
                           ("sgd-momentum", False), ("sgd-momentum", True),
                           ("sgd-nesterov-wd", True)]:
        graph = _train(name, lr_input)
        values = init_values(graph, seed=2)
        values.update({t: torch.randn(graph.tensors[t].shape) for t, _ in graph.carried
                       if graph.tensors[t].role == Role.OPTIMIZER_STATE})  # a used buffer
        values.update(run_graph(graph, values, keep=range(len(graph.tensors))))
        kernel = next(k for k in graph.kernels if k.op_type == "SGDUpdate")
        yield f"{name}{'+lr' if lr_input else ''}", kernel, [values[t] for t in kernel.inputs]


def test_every_sgd_form_writes_into_its_slots_and_over_its_inputs_bitwise():
    """`kernels/into.py`: into fresh buffers, and W' over W and buf' over the buffer (the
    arena's in-place update, the reuse of a dying input), what `run_kernel` returns."""
    for name, kernel, args in _sgd_forms():
        want = run_kernel(kernel, args)
        fresh = [torch.full_like(w, float("nan")) for w in want]
        assert run_kernel_into(kernel, args, fresh), name
        in_place = [a.clone() for a in args]
        outs = [in_place[0], *in_place[2:len(want) + 1]]  # W', buf' over W, buf
        assert run_kernel_into(kernel, in_place, outs), name
        for got, expected in [*zip(fresh, want, strict=True), *zip(outs, want, strict=True)]:
            assert torch.equal(got, expected), name


def test_the_cost_model_prices_every_form():
    flops = {}
    for name, kernel, _ in _sgd_forms():
        flops[name] = flops_of(OpShape.of_kernel(_train(*_form(name)), kernel))
    assert flops["sgd"] == flops["sgd+lr"] == 2 * 32 * 16 > 0
    assert flops["sgd"] < flops["sgd-wd+lr"] == flops["sgd-momentum"] < \
        flops["sgd-nesterov-wd+lr"]
    adam = _train("adamw-wd", True)
    kernel = next(k for k in adam.kernels if k.op_type == "AdamUpdate")
    assert flops_of(OpShape.of_kernel(adam, kernel)) == 14 * 32 * 16
    assert not writes_in_place(adam, kernel)
    assert writes_in_place(_train("sgd-momentum", True), next(
        k for k in _train("sgd-momentum", True).kernels if k.op_type == "SGDUpdate"))


def _form(name: str) -> tuple[str, bool]:
    return name.removesuffix("+lr"), name.endswith("+lr")


# ---- CUDA (marked gpu: the device machine) ----------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sgd-nesterov-wd", "adamw-wd", "sgd-momentum", "sgd"])
def test_on_cuda_a_replayed_iteration_follows_the_lr_master(name):
    """On CUDA the kernels read the lr tensor on the device (nothing goes back to the host): the
    iteration, AdamStep and the updates included, is captured as a CUDA graph, and each replay
    uses the lr master placed by `prepare`; the results are the CPU reference's within 1e-5
    (the device rounds lr * dW before adding it, `addcmul`, where the CPU adds alpha * dW)."""
    from autotm_py.pipeline import run_baselines

    graph = _train(name, True)
    lr_id, schedule = graph.meta["training"]["lr_tensor"], _schedule(graph)
    config = PlanConfig(fast_mem_bytes=graph.peak_live_bytes, device="cuda", run=RunMode())
    plan = run_baselines(machine_for(graph, config, costs_for(graph)), ("all-fast",))[
        "all-fast"].plan
    _, executor, driver = new_executor(graph, plan, "cuda", seed=1, deterministic=True,
                                       mode=RunMode(replay=True))
    ours = []
    for step, lr in enumerate(schedule):
        executor.masters[lr_id] = torch.tensor(lr, dtype=torch.float32)
        if step == 0:
            driver.warm_up()
        else:
            if step == 1:
                assert driver.capture() is None
            executor.prepare()
            driver.replay()
        ours.append({t: executor.value(t).cpu() for t in graph.outputs})
    reference = train_steps(graph, 5, seed=1, lrs=schedule)
    for step in range(5):
        for tid in graph.outputs:
            assert_close(ours[step][tid], reference[step][tid], f"{name} step {step}",
                         rtol=1e-5, atol=0.0)
