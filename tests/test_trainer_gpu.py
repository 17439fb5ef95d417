"""The Trainer on a GPU (marked `gpu`: run on the device machine with
experiments/gpu/test_gpu.sh): its default run mode (an arena at planned addresses, kernels
allocating their outputs at their slots, CUDA-graph replay after two eager steps) trains the
test models of tests/test_trainer.py as plain PyTorch on the same GPU does, within fp32
tolerance, at a budget whose plan moves or recomputes. Each model trains in a process of its
own."""

from __future__ import annotations

import pytest

from tests.test_executor_gpu import in_own_process

pytestmark = pytest.mark.gpu

STEPS = 12
RTOL = 1e-4


@pytest.mark.parametrize("name", ["mlp", "cnn", "lm"])
def test_the_trainer_on_cuda_follows_pytorch(name):
    run = in_own_process("tests.test_trainer_gpu", "train_both", name)
    assert run["replayed"], run["notes"]
    assert run["placed"], run["notes"]  # made before the process used CUDA: outputs placed
    # weights and optimizer state were uploaded once: no pinned staging copy of them is kept
    assert run["staged_carried"] == 0, run
    _follows(run)


def test_a_trainer_made_after_cuda_started_copies_outputs_and_says_so():
    run = in_own_process("tests.test_trainer_gpu", "train_both", "cnn", True)
    assert run["replayed"] and not run["placed"], run["notes"]
    assert any(n.startswith("outputs copied into their slots") for n in run["notes"]), run
    _follows(run)


@pytest.mark.parametrize("name", ["mlp", "cnn", "lm"])
def test_updates_on_the_host_overlap_cuda_graph_replays_and_follow_pytorch(name):
    """optimizer_on="host": the weights the host writes while the replayed iteration's
    backward pass runs, after its gradients are out, train as plain PyTorch on the GPU."""
    run = in_own_process("tests.test_trainer_gpu", "train_both", name, False, "host")
    assert run["replayed"] and run["host_updates"] > 0, run["notes"]
    _follows(run)


@pytest.mark.parametrize("name", ["cnn", "lm"])
def test_updates_split_between_the_host_and_the_gpu_follow_pytorch(name):
    """optimizer_on="split", half the parameters each: the GPU's updates of the last
    gradients in the replayed iteration and the host's of the others train as PyTorch."""
    run = in_own_process("tests.test_trainer_gpu", "train_both", name, False, "split", 0.5)
    assert run["replayed"] and run["host_updates"] > 0 and run["gpu_updates"] > 0, run["notes"]
    _follows(run)


def _follows(run: dict) -> None:
    assert run["moves_and_recomputes"] > 0
    for got, want in zip(run["ours"], run["torch"], strict=True):
        assert abs(got - want) <= RTOL * abs(want), (run["ours"], run["torch"])
    assert run["worst_parameter"] <= 10 * RTOL, run


def _no_runtime_reserve() -> None:
    """As tests/conftest.py does in the test process: KiB-sized models, no runtime reserve."""
    from dataclasses import replace

    from autotm_py.memory import tiers

    tiers.PRESETS = {n: replace(m, runtime_reserve_bytes=0) for n, m in tiers.PRESETS.items()}


def train_both(name: str, cuda_first: bool = False, optimizer_on: str = "gpu",
               host_share: float | None = None) -> dict:
    """STEPS steps of `name` through the Trainer on CUDA and with plain PyTorch on CUDA
    (`cuda_first`: the process uses CUDA before it makes the Trainer; `optimizer_on` and
    `host_share`: the Trainer's)."""
    import copy

    import torch

    from tests.test_precision_gpu import _capped_trainer
    from tests.test_trainer import MODELS, OPTIMIZERS, batches, torch_training

    _no_runtime_reserve()
    # no TF32: its rounding (1e-3) would hide any real difference; the Trainer runs the CNN
    # channels-last, so does the reference (cuDNN picks per layout)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    make, loss_fn = MODELS[name]
    if cuda_first:
        torch.zeros(1, device="cuda")
    torch.manual_seed(0)
    reference = make()
    ours = copy.deepcopy(reference)
    data = batches(name, STEPS, scale=16)  # activations well above the GPU's workspaces
    opt = OPTIMIZERS["sgd-momentum"](ours.parameters())
    # fp32: the reference trains in fp32 (the GPU default, bf16, is tests/test_precision_gpu.py's)
    # at 6:1 of the peak, or nearer the peak where that is below the smallest feasible budget
    # (the lm on the H200, 2026-12-04: its attention gradient and its measured scratch)
    split = {} if host_share is None else {"host_share": host_share}
    trainer = _capped_trainer(ours, opt, loss_fn, data[0], "cuda", precision="fp32",
                              optimizer_on=optimizer_on, **split)
    got = [float(trainer.step(x, y)) for x, y in data]
    trainer.sync()
    layout = torch.channels_last if name == "cnn" else torch.contiguous_format
    reference.cuda().to(memory_format=layout)
    want, _ = torch_training(reference, OPTIMIZERS["sgd-momentum"], loss_fn,
                             [(x.cuda().contiguous(memory_format=layout)
                               if x.dim() == 4 else x.cuda(), y.cuda()) for x, y in data])
    worst = max(float((p.detach().cpu() - q.detach().cpu()).abs().max()
                      / q.detach().abs().max().clamp(min=1e-12).cpu())
                for p, q in zip(ours.parameters(), reference.parameters(), strict=True))
    plan = trainer.plan
    return {"ours": got, "torch": want, "worst_parameter": worst,
            "replayed": bool(trainer.loop.driver.replayed),
            "placed": trainer.loop.executor.memory.placed is not None,
            "moves_and_recomputes": sum(1 for _ in plan.moves())
            + sum(1 for _ in plan.recomputes()),
            "notes": trainer.notes,
            "host_updates": len(trainer.host.updates) if trainer.host is not None else 0,
            "gpu_updates": len(trainer.run_graph.meta["training"]["weight_grads"]),
            "staged_carried": len(trainer.loop.executor.uploads.staged
                                  & {first for first, _ in trainer.run_graph.carried})}


def test_a_budget_beyond_the_card_is_refused_before_the_plan_is_placed():
    """A budget above the GPU memory a plan may take (the Trainer's, and a plan's run by
    `execute`) is a one-line error with the largest budget that fits, not CUDA's "invalid
    argument" at the arena's first copy (an 80 GiB budget on an H100 80GB, 2026-12-06)."""
    errors = in_own_process("tests.test_trainer_gpu", "beyond_the_card")
    for face, message in errors.items():
        assert message.startswith(f"{face}: the budget "), errors
        assert "give a budget of at most" in message, errors


def beyond_the_card() -> dict:
    """The errors of a Trainer and of `execute` given the card's memory and 1 GiB more."""
    import tempfile
    from dataclasses import replace

    import torch

    from autotm_py.errors import ConfigError
    from autotm_py.options import RunMode
    from autotm_py.runtime.execute import execute
    from autotm_py.trainer import Trainer
    from tests.test_executor import _arena_plans, _graph
    from tests.test_trainer import MODELS, OPTIMIZERS, batches

    _no_runtime_reserve()
    make, loss_fn = MODELS["mlp"]
    module = make()
    beyond = torch.cuda.get_device_properties(0).total_memory + (1 << 30)
    errors = {}
    try:
        Trainer(module, OPTIMIZERS["sgd-momentum"](module.parameters()), loss_fn,
                example=batches("mlp", 1)[0], device="cuda", budget=beyond,
                plans_dir=tempfile.mkdtemp())
    except ConfigError as exc:
        errors["Trainer"] = str(exc)
    graph = _graph("cnn")
    plan = _arena_plans(graph)["async"]
    plan = replace(plan, header=replace(plan.header, budget_bytes=beyond))
    try:
        execute(graph, plan, device="cuda", mode=RunMode(arena=True, replay=False))
    except ConfigError as exc:
        errors["the plan"] = str(exc)
    return errors
