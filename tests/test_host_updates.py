"""Optimizer updates on the host (`ir.host_updates`, `trainer.host`, `optimize --optimizer-on
host`): the GPU's graph without them, plans that start the weights the host writes and end
the gradients it reads in the slow tier, the host's work on the simulated timeline, and the
Trainer's training equal to PyTorch's."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from autotm_py import Trainer, api
from autotm_py.cli import main
from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.frontend.fuse import fuse_graph
from autotm_py.ir.host_updates import (
    SHARE_KEY,
    UPDATE_OPS,
    drained_tensors,
    fed_tensors,
    gpu_kept_updates,
    offload_updates,
    offloaded_updates,
)
from autotm_py.ir.precision import with_precision
from autotm_py.ir.training import derive_training
from autotm_py.memory.tiers import FAST, SLOW
from autotm_py.options import ModelOptions
from autotm_py.pipeline import machine_for_plan
from autotm_py.plan import Plan
from autotm_py.runtime.simulate import Simulator
from autotm_py.units import parse_ratio
from tests.test_precision import LOSS_RTOL, _relative
from tests.test_trainer import (
    MODELS,
    OPTIMIZERS,
    RTOL,
    assert_trained_alike,
    batches,
    close,
    torch_training,
)
from tests.test_training_models import tiny_decoder

ROOT = Path(__file__).resolve().parents[1]


def decoder(precision: str, optimizer: str = "adam"):
    forward = with_precision(fuse_graph(tiny_decoder(batch=2, seq=9, vocab=32, d=16, heads=2)),
                             precision)
    return derive_training(forward, optimizer=optimizer)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_update_moves_to_the_host_and_its_weight_and_gradient_stay(precision):
    graph = decoder(precision)
    gpu = offload_updates(graph)
    updates = offloaded_updates(gpu)
    assert len(updates) == sum(k.op_type in UPDATE_OPS for k in graph.kernels) > 0
    assert not any(k.op_type in (*UPDATE_OPS, "AdamStep") for k in gpu.kernels)
    assert offload_updates(gpu) is gpu
    names = gpu.tensor_ids_by_name
    for u in updates:
        weight, grad = gpu.tensors[names[u.weight]], gpu.tensors[names[u.grad]]
        assert weight.producer is None and weight.role.persistent and grad.id in gpu.outputs
        assert weight.dtype == grad.dtype == "float32"
        assert u.numel == graph.by_name(u.weight).numel and grad.name == f"grad::{u.weight}"
    # under bf16 the GPU still casts the weights it reads
    casts = sum(k.op_type == "Cast" for k in graph.kernels)
    assert sum(k.op_type == "Cast" for k in gpu.kernels) == casts
    assert (casts > 0) == (precision == "bf16")
    # no moments, masters or next values on the GPU; the loss and labels keep their names
    assert not any(t.role.value == "optimizer_state" for t in gpu.tensors)
    assert not any(t.name.endswith("::next") for t in gpu.tensors) and not gpu.carried
    meta, old = gpu.meta["training"], graph.meta["training"]
    for key in ("loss", "labels"):
        assert gpu.tensors[meta[key]].name == graph.tensors[old[key]].name
    assert gpu.kernels[meta["loss_kernel"]].name == graph.kernels[old["loss_kernel"]].name
    moved = sum(gpu.tensors[t].nbytes for t in fed_tensors(gpu) | drained_tensors(gpu))
    state = sum(t.nbytes for t in graph.tensors
                if t.role.value == "optimizer_state" and t.producer is None and t.numel > 1)
    assert moved == state  # a weight in and its gradient out: the bytes of Adam's moments alone
    # a graph rebuilt from its options (a plan's) is the same graph
    assert ModelOptions.of_graph(gpu).host_updates


def test_an_inference_graph_has_no_updates_to_offload():
    with pytest.raises(ConfigError, match="no optimizer updates to run on the host"):
        offload_updates(fuse_graph(tiny_decoder()))


def _plan(graph, budget_share=0.5):
    costs = api.load_costs(graph, device="cuda", gpu="h200")
    budget = int(graph.peak_live_bytes * budget_share) + (80 << 20)
    result = api.optimize(graph, PlanConfig(fast_mem_bytes=budget, device="cuda", gpu="h200",
                                            time_limit_s=30), costs=costs)
    assert result.plan is not None, result.message
    return result, costs


def test_plans_start_fed_weights_and_end_gradients_in_the_slow_tier():
    gpu = offload_updates(decoder("bf16"))
    result, costs = _plan(gpu)
    plan = result.plan
    fed, drained = fed_tensors(gpu), drained_tensors(gpu)
    assert all(plan.initial[t] == (SLOW,) for t in fed)
    reads = {m.tensor for m in plan.moves() if m.to == FAST}
    writes = {m.tensor for m in plan.moves() if m.to == SLOW}
    assert fed <= reads and drained <= writes
    assert any("optimizer updates on the host" in n for n in plan.header.notes)
    # the host's work on the timeline: each update after its gradient is out and its weight
    # last read, one after the other; the iteration ends after the last
    machine = machine_for_plan(gpu, plan, costs)
    sim = Simulator(gpu, plan, machine, strict=True)
    sim.run()
    res = sim.result()
    work = [machine.memory.host_update_s(u.numel) for u in offloaded_updates(gpu)]
    assert res.host_update_s == pytest.approx(sum(work))
    last_out = max(m.end_s for m in res.moves if m.tensor in drained)
    assert res.host_end_s >= last_out + work[-1] - 1e-12
    assert res.gpu_end_s <= res.host_end_s
    assert res.total_s >= res.host_end_s and result.predicted_time_s == res.total_s
    # a plan that starts a fed weight in fast memory would hide the host's new value
    tid = next(iter(fed))
    bad = dataclasses.replace(plan, initial={**plan.initial, tid: (FAST,)})
    sim = Simulator(gpu, bad, machine, strict=False)
    sim.run()
    assert any("must start in the slow tier only" in v for v in sim.result().violations)


def trainer_training(model, make_opt, loss_fn, data, **kw):
    opt = make_opt(model.parameters())
    trainer = Trainer(model, opt, loss_fn, example=data[0], device="cpu", **kw)
    losses = [float(trainer.step(x, y)) for x, y in data]
    trainer.sync()
    return losses, opt, trainer


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_host_updates_train_as_plain_pytorch(name, opt_name, tmp_path):
    """fp32: the Trainer with its updates on the host gives plain PyTorch's losses, weights
    and optimizer state (relative 1e-5: torch's fused CPU kernels against its default)."""
    trainer, ours = trained_as_pytorch(name, opt_name, tmp_path, optimizer_on="host")
    assert trainer.host is not None and len(trainer.host.updates) == len(list(
        ours.parameters()))
    # every parameter is its master's view (the lm's Linear weights transposed ones)
    assert trainer.host.shared == set(trainer.host.weights)


def trained_as_pytorch(name, opt_name, tmp_path, **kw):
    """(trainer, module): 6 steps of model `name` with optimizer `opt_name` through a Trainer
    at ratio 2:1 with `kw`, checked equal to plain PyTorch's (losses, weights, state)."""
    make, loss_fn = MODELS[name]
    torch.manual_seed(0)
    reference = make()
    ours = copy.deepcopy(reference)
    data = batches(name, 6)
    want, want_opt = torch_training(reference, OPTIMIZERS[opt_name], loss_fn, data)
    got, got_opt, trainer = trainer_training(ours, OPTIMIZERS[opt_name], loss_fn, data,
                                             ratio="2:1", plans_dir=tmp_path, **kw)
    assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=RTOL), (got, want)
    assert_trained_alike(ours, reference, got_opt, want_opt)
    return trainer, ours


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step()`")
def test_a_scheduler_changes_the_hosts_learning_rate(tmp_path):
    make, loss_fn = MODELS["mlp"]
    torch.manual_seed(1)
    reference = make()
    ours = copy.deepcopy(reference)
    data = batches("mlp", 5)

    def run(model, host):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
        trainer = Trainer(model, opt, loss_fn, example=data[0], device="cpu", ratio="2:1",
                          plans_dir=tmp_path, optimizer_on="host") if host else None
        for x, y in data:
            if trainer is None:
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
            else:
                trainer.step(x, y)
            sched.step()
        if trainer is not None:
            trainer.sync()

    run(reference, False)
    run(ours, True)
    for p, q in zip(ours.parameters(), reference.parameters(), strict=True):
        assert close(p.detach(), q.detach())


def test_bf16_host_updates_follow_the_gpus_own(tmp_path):
    """bf16: the losses follow the Trainer's with every update on the GPU (torch's fused CPU
    AdamW rounds differently from our GPU kernel: within the bf16 tolerance)."""
    make, loss_fn = MODELS["lm"]
    torch.manual_seed(2)
    reference = make()
    ours = copy.deepcopy(reference)
    data = batches("lm", 5)
    want, _, _ = trainer_training(reference, OPTIMIZERS["adamw"], loss_fn, data, ratio="2:1",
                                  plans_dir=tmp_path, precision="bf16")
    got, _, trainer = trainer_training(ours, OPTIMIZERS["adamw"], loss_fn, data, ratio="2:1",
                                       plans_dir=tmp_path, precision="bf16",
                                       optimizer_on="host")
    assert trainer.host is not None
    assert _relative(got, want) <= LOSS_RTOL, (got, want)


def _mlp_on_the_host(tmp_path: Path) -> tuple[torch.nn.Module, list, Trainer]:
    """The MLP, a batch, and a Trainer with AdamW's updates on the host at 2:1."""
    make, loss_fn = MODELS["mlp"]
    model = make()
    data = batches("mlp", 1)
    trainer = Trainer(model, OPTIMIZERS["adamw"](model.parameters()), loss_fn,
                      example=data[0], device="cpu", ratio="2:1", plans_dir=tmp_path,
                      optimizer_on="host")
    return model, data, trainer


def test_the_executor_reports_the_copies_the_host_waits_for(tmp_path):
    _, data, trainer = _mlp_on_the_host(tmp_path)
    seen = []
    executor = trainer.loop.executor
    hook = executor.copy_hook
    executor.copy_hook = lambda tid, to, event: (seen.append((tid, to)), hook(tid, to, event))
    trainer.step(*data[0])
    host = trainer.host
    assert {t for t, to in seen if to == SLOW} == set(host.grads)
    assert {t for t, to in seen if to == FAST} == set(host.fed)
    assert host.last_timing == {}  # the step's updates have not been waited for yet
    host.wait()
    timing = host.last_timing
    assert set(timing) == {"span_s", "waited_s", "updating_s", "blocked_s"}
    assert timing["updating_s"] > 0 and timing["waited_s"] >= 0
    assert timing["span_s"] == pytest.approx(timing["waited_s"] + timing["updating_s"])


def test_the_modules_parameters_are_the_hosts_masters_and_sync_copies_nothing(tmp_path):
    """With the updates on the host, a parameter the graph holds as it is becomes a view of
    its master in the slow tier (the module's own copy freed): after a step's updates the module
    already holds the trained values, and `sync` hands the optimizer the host's moments without
    copying them; the values are those of plain PyTorch training (the other tests)."""
    model, data, trainer = _mlp_on_the_host(tmp_path)
    host = trainer.host
    assert host is not None and host.shared == set(host.weights)
    masters = {trainer.map.weights[w].name: m for w, m in zip(host.weights, host.masters,
                                                                strict=True)}
    params = dict(model.named_parameters())
    assert all(params[n].data_ptr() == m.data_ptr() for n, m in masters.items())
    for x, y in data * 2:
        trainer.step(x, y)
    host.wait()
    before = {n: p.detach().clone() for n, p in params.items()}
    trainer.sync()
    for name, param in params.items():
        assert param.data_ptr() == masters[name].data_ptr()
        assert torch.equal(param.detach(), before[name])  # sync had nothing to write
        state = trainer.optimizer.state[param]
        opt = host.optimizers[list(masters).index(name)]
        assert state["exp_avg"].data_ptr() == opt.state[masters[name]]["exp_avg"].data_ptr()


def test_close_gives_the_module_its_own_values_and_lets_the_pool_go(tmp_path):
    """After `close` the parameters and the optimizer's moments are copies of their own,
    contiguous, with the trained values; the executor's pool is freed (the module no longer
    views it); a step after it is a one-line error."""
    import gc
    import weakref

    model, data, trainer = _mlp_on_the_host(tmp_path)
    for x, y in data * 2:
        trainer.step(x, y)
    trainer.sync()
    want = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments = {n: trainer.optimizer.state[p]["exp_avg"].clone()
               for n, p in model.named_parameters()}
    pool = weakref.ref(trainer.loop.executor.pool)
    masters = {m.data_ptr() for m in trainer.host.masters}
    trainer.close()
    gc.collect()
    assert pool() is None and trainer.steps == 2
    for name, param in model.named_parameters():
        assert param.is_contiguous() and param.data_ptr() not in masters
        assert torch.equal(param.detach(), want[name])
        assert torch.equal(trainer.optimizer.state[param]["exp_avg"], moments[name])
    with pytest.raises(ConfigError, match=r"Trainer: closed .* make a new Trainer"):
        trainer.step(*data[0])


def test_bad_optimizer_places_are_one_line_errors(tmp_path, capsys):
    for flags in (["--optimizer-on", "split"], ["--optimizer-on", "host", "--host-share", "0.5"]):
        assert main(["optimize", "resnet50", "--training", *flags]) == 2
        assert "--optimizer-on split takes --host-share F" in capsys.readouterr().err
    make, loss_fn = MODELS["mlp"]
    model = make()
    with pytest.raises(ConfigError,
                       match="optimizer_on='cpu': choose one of gpu, host, split, auto"):
        Trainer(model, OPTIMIZERS["adamw"](model.parameters()), loss_fn,
                example=batches("mlp", 1)[0], device="cpu", ratio="1:1",
                optimizer_on="cpu")
    assert main(["optimize", "resnet50", "--optimizer-on", "cpu"]) == 2
    assert "'cpu' is not one of 'gpu', 'host'" in capsys.readouterr().err
    assert main(["bench", "--models", "resnet50", "--ratios", "1:1", "--training",
                 "--optimizer-on", "host", "--execute", "-o", str(tmp_path / "b.csv")]) != 0
    assert "a bench run times the GPU's part only" in capsys.readouterr().err


# the split keeps the first layer's update on the GPU: its weight, gradient and moments
# together need more than half the split graph's peak
@pytest.mark.parametrize("place", [["host", "--ratio", "1:1"],
                                   ["split", "--host-share", "0.5", "--ratio", "2:1"]])
def test_optimize_and_run_say_what_the_hosts_updates_cost(place, tmp_path, capsys):
    model, plan = "models/corpus/gated_mlp.onnx", str(tmp_path / "plan.json")
    code = main(["optimize", model, "--training", "--optimizer", "adam", "--precision", "bf16",
                 "--optimizer-on", *place, "--gpu", "h200", "--time-limit", "20",
                 "--no-baselines", "-o", plan])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "optimizer updates on the host" in out and "ms of work, the last ending at" in out
    assert "(the GPU's part ends at " in out
    header = Plan.load(plan).header
    assert header.model.host_updates and header.model.host_share == (
        0.5 if place[0] == "split" else None)
    # `run` starts from the file's weights (the bf16 copies fed from them) and says what it
    # does not time
    assert main(["run", model, "--plan", plan, "--device", "cpu", "--iterations", "1"]) == 0
    out = capsys.readouterr().out
    assert "weights: the file's own weights" in out
    assert "optimizer updates are the host's: this run times the GPU's part" in out


def test_a_split_keeps_the_updates_of_the_last_gradients_on_the_gpu():
    graph = decoder("bf16")
    order = offloaded_updates(offload_updates(graph))
    keep = gpu_kept_updates(offload_updates(graph), 0.5)
    assert keep and set(keep) == {u.weight for u in order[len(order) - len(keep):]}
    total = sum(u.numel for u in order)
    kept = sum(graph.by_name(w).numel for w in keep)
    biggest = max(u.numel for u in order)
    assert abs(kept - total / 2) <= biggest / 2 + 1, (kept, total)
    split = offload_updates(graph, 0.5)
    assert split.meta[SHARE_KEY] == 0.5 and ModelOptions.of_graph(split).host_share == 0.5
    assert [u.weight for u in offloaded_updates(split)] == [u.weight for u in order
                                                            if u.weight not in keep]
    on_gpu = {split.tensors[k.inputs[0]].name for k in split.kernels if k.op_type in UPDATE_OPS}
    assert on_gpu == set(keep) and any(k.op_type == "AdamStep" for k in split.kernels)
    meta = split.meta["training"]
    assert {split.tensors[w].name for w, _ in meta["weight_grads"]} == set(keep)
    # the host's gradients end the iteration as outputs, the GPU's are consumed by its updates
    outputs = {split.tensors[t].name for t in split.outputs}
    assert all(u.grad in outputs for u in offloaded_updates(split))
    assert not any(graph.tensors[g].name in outputs for w, g in
                   graph.meta["training"]["weight_grads"] if graph.tensors[w].name in keep)
    # a share that leaves the GPU nothing is every update on the host; at least one stays
    assert gpu_kept_updates(offload_updates(graph), 0.999) == ()
    assert SHARE_KEY not in offload_updates(graph, 0.999).meta
    assert len(gpu_kept_updates(offload_updates(graph), 1e-6)) == len(order) - 1
    with pytest.raises(ConfigError, match="between 0 and 1"):
        offload_updates(graph, 1.5)


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", ["cnn", "lm"])
def test_split_updates_train_as_plain_pytorch(name, opt_name, tmp_path):
    """optimizer_on="split", half the parameters each: the GPU's updates and the host's
    together give plain PyTorch's losses, weights and optimizer state."""
    trainer, ours = trained_as_pytorch(name, opt_name, tmp_path, optimizer_on="split",
                                       host_share=0.5)
    assert trainer.optimizer_on == "split" and trainer.host is not None
    on_gpu = trainer.run_graph.meta["training"]["weight_grads"]
    assert on_gpu and 0 < len(trainer.host.updates) < len(list(ours.parameters()))
    assert len(on_gpu) + len(trainer.host.updates) == len(list(ours.parameters()))
    assert any(n.startswith("split: the host updates ") for n in trainer.notes)


def test_a_split_without_a_share_cuts_where_the_host_would_end_after_the_gpu(tmp_path):
    """optimizer_on="split" alone: the host's plan is simulated, and the updates it would
    run past the GPU's iteration go to the GPU; where it ends in time, all stay on the host
    (said in the notes)."""
    make, loss_fn = MODELS["mlp"]
    model = make()

    def trainer(**kw):
        return Trainer(model, OPTIMIZERS["adamw"](model.parameters()), loss_fn,
                       example=batches("mlp", 1)[0], device="cpu", ratio="2:1",
                       plans_dir=tmp_path, **kw)

    split = trainer(optimizer_on="split")
    assert any(n.startswith("split: the host updates " if split.optimizer_on == "split" else
                            "split: the host's updates are predicted to end within")
               for n in split.notes), split.notes
    with pytest.raises(ConfigError, match=r"host_share=1\.5: give the fraction"):
        trainer(optimizer_on="split", host_share=1.5)
    with pytest.raises(ConfigError, match="is for optimizer_on='split'"):
        trainer(optimizer_on="host", host_share=0.5)


def test_a_given_share_plans_the_split_alone(tmp_path, monkeypatch):
    """With host_share given there is no all-host plan to cut from: one plan is made, the
    split's; a share that leaves the GPU no update plans every update on the host."""
    import autotm_py.trainer.core as core

    make, loss_fn = MODELS["mlp"]
    model = make()
    planned = []
    plan_for = core.plan_for
    monkeypatch.setattr(core, "plan_for", lambda graph, *a, **kw: planned.append(
        graph.meta.get(SHARE_KEY)) or plan_for(graph, *a, **kw))

    def trainer(share):
        planned.clear()
        return Trainer(model, OPTIMIZERS["adamw"](model.parameters()), loss_fn,
                       example=batches("mlp", 1)[0], device="cpu", ratio="2:1",
                       plans_dir=tmp_path, optimizer_on="split", host_share=share)

    assert trainer(0.5).optimizer_on == "split" and planned == [0.5]
    all_host = trainer(0.999)
    assert all_host.optimizer_on == "host" and planned == [None]
    assert any(n.startswith("split: no update is left to the GPU") for n in all_host.notes)


def test_the_cut_from_a_simulated_host_plan_is_a_share_offload_updates_takes():
    """All of the host's work past the GPU's end (its first gradient out only as the GPU
    ends) hands the GPU every update but the host's first, never a share of 0; none past it,
    nothing."""
    from types import SimpleNamespace

    from autotm_py.trainer.core import _host_share_within

    graph = decoder("bf16")
    late = _host_share_within(SimpleNamespace(host_end_s=3.0, gpu_end_s=1.0, host_update_s=2.0))
    assert 0 < late < 1e-6
    assert len(offloaded_updates(offload_updates(graph, late))) == 1
    assert _host_share_within(SimpleNamespace(host_end_s=1.0, gpu_end_s=1.0,
                                              host_update_s=2.0)) == 1.0
    half = _host_share_within(SimpleNamespace(host_end_s=2.0, gpu_end_s=1.0, host_update_s=2.0))
    assert half == pytest.approx(0.5)


def test_auto_plans_both_places_only_where_the_state_exceeds_the_budget(tmp_path):
    """optimizer_on="auto" (the default): the GPU where the weights, gradients and optimizer
    state fit the budget (one plan, no note); below that both plans, the faster kept and
    both times said."""
    from autotm_py.ir.host_updates import update_bytes

    torch.manual_seed(4)
    # wide layers, a small batch: the weights and Adam's state are most of the peak
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    data = [(torch.randn(8, 256), torch.randint(0, 10, (8,)))]

    def trainer(**cap):
        return Trainer(model, OPTIMIZERS["adamw"](model.parameters()),
                       torch.nn.functional.cross_entropy, example=data[0], device="cpu",
                       plans_dir=tmp_path, **cap)

    roomy = trainer(ratio="1:0")
    assert roomy.optimizer_on == "gpu" and roomy.host is None
    assert not any("optimizer_on='auto'" in n for n in roomy.notes)
    state = update_bytes(roomy.graph)
    assert state < roomy.graph.peak_live_bytes
    tight = trainer(budget=state * 3 // 4)
    note = next(n for n in tight.notes if "optimizer_on='auto'" in n)
    assert "gpu " in note and "host " in note, note
    assert note.startswith(f"optimizer updates on the {tight.optimizer_on} ")
    assert "gpu infeasible" in note and "split infeasible" in note, note  # the 1024 x 1024
    assert (tight.host is not None) == (tight.optimizer_on != "gpu")
    tight.step(*data[0])


def test_a_process_that_exits_mid_update_exits_cleanly(tmp_path):
    """The host's updates of the last step may still run when the user's script ends: the
    interpreter waits for them (a daemon thread killed inside torch's CPU kernels aborted the
    process, 2026-12-05)."""
    import subprocess
    import sys

    script = f"""
import torch
from autotm_py import Trainer
from tests.test_trainer import MODELS, OPTIMIZERS, batches
make, loss_fn = MODELS["lm"]
model = make()
data = batches("lm", 2)
trainer = Trainer(model, OPTIMIZERS["adamw"](model.parameters()), loss_fn, example=data[0],
                  device="cpu", ratio="2:1", plans_dir={str(tmp_path)!r}, optimizer_on="host")
for x, y in data:
    trainer.step(x, y)
print("stepped")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, cwd=str(ROOT))
    assert done.returncode == 0 and "stepped" in done.stdout, done.stderr[-2000:]


def test_a_budget_an_update_on_the_gpu_cannot_fit_points_to_the_host():
    """GPT-2 small's tied embedding under Adam: its update (weight, gradient, two moments)
    forces the smallest budget with the updates on the GPU, and the message offers the host;
    with them on the host the smallest feasible budget is less than half of it (the loss's
    gradient sets it there)."""
    config = PlanConfig(ratio=parse_ratio("1:19"), device="cuda", gpu="h200", time_limit_s=20)
    graph = api.load_model("gpt2_small", batch=1, dims={"seq": 128}, training=True,
                           loss_chunks=16, optimizer="adam")
    result = api.optimize(graph, config)
    assert result.status == "infeasible" and "(AdamUpdate)" in result.message
    assert "--optimizer-on host runs the updates on the host's cores" in result.message
    hosted = api.optimize(offload_updates(graph), config)
    assert "--optimizer-on host" not in hosted.message
    assert hosted.min_feasible_budget_bytes < result.min_feasible_budget_bytes / 2


def test_a_plan_the_hosts_memory_cannot_hold_is_refused_before_pinning(tmp_path, monkeypatch):
    """The Trainer adds up the plan's slow tier and the host optimizers' state (Adam: two fp32
    moments a parameter) and refuses, naming both, where the host has less available; the
    executor's pool checks itself too (`autotm run`)."""
    from autotm_py.runtime import pinned

    model, _, trainer = _mlp_on_the_host(tmp_path)
    params = sum(p.numel() for p in model.parameters())
    assert trainer.host is not None and trainer.host.state_bytes == 8 * params
    pool = pinned.slow_tier_layout(trainer.run_graph, trainer.plan)[1]
    assert trainer.host_bytes == pool + 8 * params
    monkeypatch.setattr(pinned, "available_host_bytes", lambda: trainer.host_bytes - 1)
    with pytest.raises(ConfigError, match=r"Trainer: the plan's slow tier \([0-9.]+ [KMG]iB\) with "
                       r"the host's optimizer state .* of host memory, and this host has .* "
                       r"available: plan with a larger fast-memory budget"):
        _mlp_on_the_host(tmp_path)
    monkeypatch.setattr(pinned, "available_host_bytes", lambda: 1)
    with pytest.raises(ConfigError, match=r"the plan's slow tier \(one pinned host pool\)"):
        pinned.PinnedPool({0: 0}, 4096, pin=False)


def test_a_pinned_pool_is_checked_at_the_size_torchs_host_allocator_takes(monkeypatch):
    """torch's caching host allocator rounds a pinned allocation up to a power of two (a 49.9
    GB pool took 64 GiB on an H100 host): the check counts that, not the pool's own bytes."""
    from autotm_py.runtime import pinned

    assert pinned.pinned_footprint(5 << 20, pin=False) == 5 << 20
    assert pinned.pinned_footprint((5 << 20) + 1, pin=True) == 8 << 20
    assert pinned.pinned_footprint(8 << 20, pin=True) == 8 << 20
    assert pinned.pinned_footprint(0, pin=True) == 0
    monkeypatch.setattr(pinned, "available_host_bytes", lambda: 6 << 20)
    pinned.PinnedPool({0: 0}, 5 << 20, pin=False)  # fits as it is
    with pytest.raises(ConfigError, match=r"needs 8\.00 MiB of host memory"):
        pinned.PinnedPool({0: 0}, 5 << 20, pin=True)  # refused before pinning anything


class _FakeCudart:
    """What `torch.cuda.cudart()` gives the pool: records registrations; `refuse` an error."""

    def __init__(self, refuse: int = 0) -> None:
        self.refuse = refuse
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:
        self.registered.append((ptr, nbytes, flags))
        return self.refuse

    def cudaHostUnregister(self, ptr: int) -> int:
        self.unregistered.append(ptr)
        return 0


def test_where_cuda_registers_host_memory_the_pool_is_pinned_at_its_own_size(monkeypatch):
    """Registered with CUDA (cudaHostRegister) the pool takes its own bytes, not torch's power
    of two: the check counts 5 MiB, the buffer is 5 MiB, registered whole once, and unregistered
    only when the pool and every view of it are gone. A refused registration falls back to
    torch's pinned allocator."""
    import gc

    from autotm_py.ir.graph import Role, Tensor
    from autotm_py.runtime import pinned

    fake = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    assert pinned.pinned_footprint((5 << 20) + 1, pin=True) == (5 << 20) + 1
    monkeypatch.setattr(pinned, "available_host_bytes", lambda: 6 << 20)
    pool = pinned.PinnedPool({0: 0}, 5 << 20, pin=True)  # 8 MiB would not fit
    ptr = pool.buffer.data_ptr()
    assert pool.buffer.numel() == 5 << 20 and fake.registered == [(ptr, 5 << 20, 0)]
    view = pool.view(0, Tensor(id=0, name="w", shape=(4,), dtype="float32", role=Role.WEIGHT,
                               producer=None, users=()))
    del pool
    gc.collect()
    assert fake.unregistered == []  # a view still reads the registered memory
    del view
    gc.collect()
    assert fake.unregistered == [ptr]

    taken: list[int] = []
    monkeypatch.setattr(pinned, "_torch_pinned", lambda nbytes: taken.append(nbytes) or
                        torch.empty(nbytes, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart(refuse=712))
    assert pinned.pinned_host_buffer(4096).numel() == 4096 and taken == [4096]


def test_beside_a_gpu_the_updates_leave_one_core_to_the_waiting_thread(tmp_path, monkeypatch):
    """On a GPU the host's updates run on one thread fewer than torch's (the thread waiting for
    the GPU spins on a core); on the CPU on torch's own."""
    from autotm_py.trainer import host as host_module

    assert host_module.update_threads(False) is None
    assert host_module.update_threads(True) == max(1, torch.get_num_threads() - 1)
    _, data, trainer = _mlp_on_the_host(tmp_path)
    assert trainer.host is not None and trainer.host.threads is None
    calls: list[int] = []
    monkeypatch.setattr(host_module.torch, "set_num_threads", calls.append)
    trainer.host.threads = 1  # as `attach` sets it on a GPU
    trainer.step(*data[0])
    trainer.host.wait()
    assert calls == [1]
